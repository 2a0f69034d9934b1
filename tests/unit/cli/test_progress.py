"""The CLI's one progress renderer: plain lines off a terminal, live bars on one,
nothing with ``--json``; and the fan-out commands (facts, doctor, collect, ping,
exec) reporting per-host progress through it over a FakeTransport fleet."""

from __future__ import annotations

import io
import json
import subprocess
from types import SimpleNamespace

import pytest
from rich.console import Console

from clusterctl.cli import _progress
from clusterctl.cli._progress import ByteProgress, EventProgress, HostProgress
from clusterctl.cli.main import main
from clusterctl.deploy.rollout.engine import Event
from clusterctl.fleet import HostStatus, ssh
from clusterctl.fleet.results import HostResult
from clusterctl.fleet.transport import FakeReply, FakeTransport, HostFailure

INVENTORY = """version: 1
defaults:
  ssh: {user: root}
hosts:
  gpu[01-02]:
    address: 127.0.0.[1-2]
  gpu03:
    address: 127.0.0.3
"""


def _lines(err: str, prefix: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith(prefix)]


def test_host_progress_prints_one_plain_line_per_host_off_a_terminal(capsys):
    with HostProgress(2, "ping", True) as bar:
        bar(HostResult("gpu01", HostStatus.OK, duration_s=0.25))
        bar(HostResult("gpu02", HostStatus.FAILED, rc=7, duration_s=1.5))
    assert capsys.readouterr().err.splitlines() == ["ping [1/2] gpu01 ok 0.25s", "ping [2/2] gpu02 rc=7 1.50s"]


def test_disabled_renderers_print_nothing(capsys):
    with HostProgress(1, "ping", False) as bar:
        bar(HostResult("gpu01", HostStatus.OK))
        bar.note("an event")
    with ByteProgress("stage", ["gpu01"], 100, False) as b:
        b.on_progress("gpu01", 50, 100)
        b.on_result(HostResult("gpu01", HostStatus.OK))
    with EventProgress("deploy", False) as ev:
        ev(Event("batch", "batch 1/1: 1 hosts: gpu01", step=1, steps=1))
    assert capsys.readouterr() == ("", "")


def test_on_a_terminal_the_bar_draws_and_no_plain_line_is_printed(monkeypatch, capsys):
    screen = io.StringIO()
    monkeypatch.setattr(_progress, "err_console", Console(file=screen, force_terminal=True, width=100))
    with HostProgress(1, "facts", True) as bar:
        assert bar.mode == "rich"
        bar(HostResult("gpu01", HostStatus.OK))
        bar.note("probe: gpu01 answered")
    assert capsys.readouterr().err == ""
    assert "probe: gpu01 answered" in screen.getvalue()


def test_byte_progress_plain_lines_overall_and_per_host(monkeypatch, capsys):
    monkeypatch.setattr(_progress, "PLAIN_BYTES_EVERY_S", 0.0)
    with ByteProgress("stage", ["gpu01", "gpu02"], 2 * 2**30, True) as b:
        assert b.live
        b.on_progress("gpu01", 2**30, 2 * 2**30)
        b.on_progress("gpu02", 2**30, 2 * 2**30)
        b.on_result(SimpleNamespace(host="gpu01", status=HostStatus.OK, duration_s=3.0))
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "stage: 1.0 GiB of 4.0 GiB (25 %)",
        "stage: 2.0 GiB of 4.0 GiB (50 %)",
        "stage [1/2] gpu01 ok 1.0 GiB 3.00s",
    ]


def test_event_progress_plain_lines_keep_the_deploy_format(capsys):
    with EventProgress("deploy", True) as ev:
        ev(Event("batch", "canary: 1 hosts: gpu01", step=1, steps=2))
        ev(Event("host", "gate failed", "gpu01", ok=False))
    assert capsys.readouterr().err.splitlines() == ["[batch] canary: 1 hosts: gpu01", "!! [host] gpu01: gate failed"]


def test_deploy_staging_bytes_are_summed_and_throttled_not_a_line_each(monkeypatch, capsys):
    with EventProgress("deploy", True) as ev:
        ev(Event("bytes", "staging qwen", "gpu01", step=2**30, steps=2**31))
        ev(Event("bytes", "staging qwen", "gpu02", step=2**30, steps=2**31))  # within 5 s: no line
        monkeypatch.setattr(_progress, "PLAIN_BYTES_EVERY_S", 0.0)
        ev(Event("bytes", "staging qwen", "gpu01", step=2**31, steps=2**31))
    assert capsys.readouterr().err.splitlines() == [
        "[bytes] staging qwen: 1.0 GiB of 2.0 GiB (50 %)",
        "[bytes] staging qwen: 3.0 GiB of 4.0 GiB (75 %)",
    ]
    with EventProgress("deploy", False) as ev:
        ev(Event("bytes", "staging qwen", "gpu01", step=1, steps=2))
    assert capsys.readouterr().err == ""


def local_shell(host, command, stdin):
    if host.name == "gpu03":
        return HostFailure(HostStatus.UNREACHABLE, "connect to 127.0.0.3:22: connection refused")
    p = subprocess.run(["/bin/sh", "-c", command], input=stdin, capture_output=True, timeout=120)
    return FakeReply(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def env(tmp_path, monkeypatch):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    transport = FakeTransport(local_shell)
    monkeypatch.setattr(ssh, "ParamikoTransport", lambda **kw: transport)  # every command's fleet factory
    return inv


def _per_host(err: str, label: str) -> dict[str, str]:
    rows = {}
    for line in _lines(err, f"{label} ["):
        _, count, host, status, _secs = line.split()
        rows[host] = status
        assert count.endswith("/3]")
    return rows


def test_facts_reports_each_host_and_nothing_with_json(env, capsys):
    main(["facts", "all", "-i", str(env)])
    assert _per_host(capsys.readouterr().err, "facts") == {"gpu01": "ok", "gpu02": "ok", "gpu03": "unreachable"}
    main(["facts", "all", "-i", str(env), "--json"])
    out, err = capsys.readouterr()
    assert list(json.loads(out)) == ["gpu01", "gpu02", "gpu03"] and "/3] " not in err


def test_doctor_and_collect_report_each_probed_host(env, tmp_path, capsys):
    main(["doctor", "all", "-i", str(env), "--interval", "0"])
    assert _per_host(capsys.readouterr().err, "probe") == {"gpu01": "ok", "gpu02": "ok", "gpu03": "unreachable"}
    main(["doctor", "all", "-i", str(env), "--interval", "0", "--format", "json"])
    assert "/3] " not in capsys.readouterr().err
    main(["collect", "all", "-i", str(env), "--interval", "0", "-o", str(tmp_path / "bundle")])
    assert _per_host(capsys.readouterr().err, "probe") == {"gpu01": "ok", "gpu02": "ok", "gpu03": "unreachable"}


def test_ping_and_exec_report_each_host_and_nothing_with_json(env, capsys):
    main(["ping", "all", "-i", str(env)])
    assert _per_host(capsys.readouterr().err, "ping") == {"gpu01": "ok", "gpu02": "ok", "gpu03": "unreachable"}
    main(["exec", "all", "-i", str(env), "--json", "--", "true"])
    out, err = capsys.readouterr()
    assert json.loads(out)["command"] == "true" and "/3] " not in err


def test_on_a_terminal_bytes_and_deploy_batches_draw_bars(monkeypatch, capsys):
    screen = io.StringIO()
    monkeypatch.setattr(_progress, "err_console", Console(file=screen, force_terminal=True, width=120))
    with ByteProgress("stage", ["gpu01", "gpu02"], 2**20, True) as b:
        b.on_progress("gpu01", 2**19, 2**20)
        b.on_result(SimpleNamespace(host="gpu01", status=HostStatus.OK, duration_s=1.0))
        assert b._bar.tasks[0].completed == 2**19 and b._bar.tasks[0].total == 2**21
    with EventProgress("deploy", True) as ev:
        ev(Event("batch", "batch 1/2: 1 hosts: gpu01", step=1, steps=2))
        ev(Event("batch", "batch 1/2 passed", step=1, steps=2, done=True))
        assert (ev._bar.tasks[0].completed, ev._bar.tasks[0].total) == (1, 2)
        ev(Event("batch", "batch 2/2: 1 hosts: gpu02", step=2, steps=2))
        assert ev._bar.tasks[0].completed == 1 and "batch 2/2" in ev._bar.tasks[0].description
        ev(Event("bytes", "staging qwen", "gpu02", step=2**20, steps=2**21))
        assert (ev._bar.tasks[1].completed, ev._bar.tasks[1].total) == (2**20, 2**21)
    assert capsys.readouterr().err == ""
    assert "[batch] batch 1/2 passed" in screen.getvalue()
