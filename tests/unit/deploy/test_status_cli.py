"""``clusterctl status`` / ``stop`` from the command line: table, JSON, exit codes, bad input.

Hosts are the fake transport (``inventory_fleet`` is replaced), instances real HTTP
servers on 127.0.0.1 serving recorded simulator metrics.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.cli import instances as cli
from clusterctl.cli.main import main
from clusterctl.inventory.loader import load_inventory

from .status_fakes import FakeVllm, fleet_for, recorded, unit

INVENTORY = """version: 1
defaults:
  gpus: {{count: 2, model: H100-SXM5-80GB, memory_gib: 79.6}}
hosts:
  h1: {{address: 127.0.0.1}}
  h2: {{address: 127.0.0.1}}
models:
  m: {{path: /models/m, version: v1}}
engines:
  e: {{path: /opt/vllm/bin/vllm, version: 0.11.0}}
instances:
  a: {{model: m, engine: e, placement: "h1:0", port: {a}, args: {{max-num-seqs: 8}}}}
  b: {{model: m, engine: e, placement: "h2:0", port: {b}}}
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    busy = FakeVllm([recorded("sim-0.11-busy.1.prom"), recorded("sim-0.11-busy.2.prom")])
    idle = FakeVllm([recorded("sim-0.11-idle.prom")])
    inv_path = tmp_path / "inventory.yaml"
    inv_path.write_text(INVENTORY.format(a=busy.port, b=idle.port))
    units = {"h1": {"a": unit("a")}, "h2": {"b": unit("b")}}
    seen: dict = {}

    def fake_fleet(inv, host_names, **kw):
        fleet, transport = fleet_for(load_inventory(str(inv_path)), units)
        seen["hosts"], seen["transport"] = host_names, transport
        return fleet

    monkeypatch.setattr(cli, "inventory_fleet", fake_fleet)
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")
    yield {"inv": str(inv_path), "units": units, "seen": seen, "state": str(tmp_path / "state")}
    busy.close()
    idle.close()


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_table_groups_by_host_and_exits_1_for_high_load(capsys, env) -> None:
    rc, out, err = _run(capsys, "status", "-i", env["inv"], "--state-dir", env["state"], "--window", "0.2")
    assert rc == 1, out + err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["host", "instance", "state"]
    row_a = next(ln for ln in lines if " a " in f" {ln} ")
    assert row_a.split()[:3] == ["h1", "a", "serving"] and "8/16" in row_a and "high load" in row_a
    assert any(ln.split()[:3] == ["h2", "b", "serving"] for ln in lines)
    assert "2 active instance(s): /health, /version, /metrics over 0.2 s" in err.splitlines()  # progress, piped


def test_json_and_a_stopped_instance_exit_2(capsys, env) -> None:
    env["units"]["h2"]["b"] = unit("b", active="inactive", sub="dead")
    rc, out, err = _run(capsys, "status", "-i", env["inv"], "--state-dir", env["state"], "--window", "0", "--json")
    doc = json.loads(out)
    assert "active instance(s)" not in err  # no progress with --json
    rows = {r["name"]: r for r in doc["instances"]}
    assert rc == 2 and doc["exit_code"] == 2
    assert (rows["b"]["state"], rows["b"]["severity"], rows["b"]["load"]) == ("stopped", "CRIT", None)
    assert rows["a"]["running"] == 8.0 and rows["a"]["gpus"] == ["h1:0"] and rows["a"]["tp"] == 1


def test_pattern_limits_rows_and_hosts(capsys, env) -> None:
    rc, out, _ = _run(capsys, "status", "b", "-i", env["inv"], "--state-dir", env["state"], "--window", "0", "--json")
    assert rc == 0 and [r["name"] for r in json.loads(out)["instances"]] == ["b"]
    assert env["seen"]["hosts"] == ["h2"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["status", "nope"], "pattern 'nope' selects no instance"),
        (["status", "--group-by", "rack"], "--group-by must be host or template"),
        (["stop", "nope"], "pattern 'nope' selects no instance"),
    ],
)
def test_bad_input_exits_3_with_a_message(capsys, env, args, message) -> None:
    rc, _, err = _run(capsys, *args, "-i", env["inv"], "--state-dir", env["state"])
    assert rc == 3 and message in err and "Traceback" not in err


def test_stop_no_drain_runs_systemctl_and_exits_0(capsys, env) -> None:
    rc, out, _ = _run(capsys, "stop", "a", "-i", env["inv"], "--state-dir", env["state"], "--no-drain")
    assert rc == 0 and "ok stop a on h1" in out
    assert [c for _, c, _ in env["seen"]["transport"].commands] == ["systemctl stop clusterctl-a.service"]


def test_template_replicas_are_rows_grouped_by_template(capsys, env) -> None:
    text = Path(env["inv"]).read_text() + (
        "templates:\n  pool: {model: m, engine: e, replicas: 2, tp: 1, hosts: 'h[1-2]', port_base: 9000}\n"
    )
    Path(env["inv"]).write_text(text)
    rc, out, _ = _run(
        capsys, "status", "-i", env["inv"], "--state-dir", env["state"], "--window", "0", "--group-by", "template"
    )
    lines = out.splitlines()
    assert rc == 2 and lines[0].split()[:2] == ["template", "instance"]
    pool = [ln.split() for ln in lines if "pool-" in ln]
    # The template names its group once; replicas not deployed yet are absent.
    assert [p[:3] for p in pool] == [["pool", "pool-1", "absent"], ["pool-2", "absent", "-"]], out
