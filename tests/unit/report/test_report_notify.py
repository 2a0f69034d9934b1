"""--notify-cmd: only on change, re-notify while a problem lasts, retried after a failure."""

from __future__ import annotations

import json
import sys
import time

import pytest

from clusterctl.errors import ClusterctlError
from clusterctl.report.notify import parse_duration
from clusterctl.report.run import Options, report_run

from report_findings import crit, ok, warn


def _opts(tmp_path, cmd: str, renotify_s: float = 6 * 3600) -> Options:
    return Options(db=tmp_path / "r.db", notify_cmd=cmd, renotify_s=renotify_s)


def _recorder(tmp_path) -> tuple[str, list]:
    log = tmp_path / "sent.jsonl"
    script = tmp_path / "notify.py"
    script.write_text(f"import sys\nopen({str(log)!r}, 'a').write(sys.stdin.read().replace(chr(10), ' ') + chr(10))\n")
    return f"{sys.executable} {script}", log  # type: ignore[return-value]


def _sent(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_notifies_on_change_only_and_reminds_after_the_period(tmp_path):
    cmd, log = _recorder(tmp_path)
    t = time.time()
    assert report_run([crit(), ok()], _opts(tmp_path, cmd), started=t, now=t).notified
    assert not report_run([crit(), ok()], _opts(tmp_path, cmd), started=t, now=t + 300).notified
    assert not report_run([crit(), ok()], _opts(tmp_path, cmd), started=t, now=t + 6 * 3600 - 1).notified
    assert report_run([crit(), ok()], _opts(tmp_path, cmd), started=t, now=t + 6 * 3600).notified
    assert report_run([ok()], _opts(tmp_path, cmd), started=t, now=t + 6 * 3600 + 300).notified
    sent = _sent(log)
    assert [s["reason"] for s in sent] == ["change", "renotify", "change"]
    assert [f["host"] for f in sent[0]["new"]] == ["gpu01"]
    assert [f["subject"] for f in sent[1]["reminder"]] == ["gpu:3"]
    assert [f["check"] for f in sent[2]["resolved"]] == ["gpu.xid"]


def test_renotify_0_never_reminds(tmp_path):
    cmd, log = _recorder(tmp_path)
    report_run([warn()], _opts(tmp_path, cmd, 0), started=0, now=1000)
    assert not report_run([warn()], _opts(tmp_path, cmd, 0), started=0, now=10**7).notified
    assert len(_sent(log)) == 1


def test_a_failing_command_is_a_warning_and_the_problem_is_sent_again_next_run(tmp_path):
    bad = f"{sys.executable} -c 'import sys; sys.stderr.write(\"smtp down\\n\"); sys.exit(4)'"
    r = report_run([crit()], _opts(tmp_path, bad), started=0, now=100)
    assert not r.notified and r.warnings == [f"--notify-cmd: {sys.executable} exited 4: smtp down"]
    cmd, log = _recorder(tmp_path)
    assert report_run([crit()], _opts(tmp_path, cmd), started=0, now=200).notified
    assert [f["subject"] for f in _sent(log)[0]["reminder"]] == ["gpu:3"]


def test_missing_command_is_a_warning_not_a_crash(tmp_path):
    r = report_run([crit()], _opts(tmp_path, "/nonexistent/pager --x"), started=0, now=1)
    assert r.warnings == ["--notify-cmd: /nonexistent/pager: not found"] and r.exit_code == 2


def test_the_command_is_not_run_through_a_shell(tmp_path):
    marker = tmp_path / "pwned"
    cmd, log = _recorder(tmp_path)
    report_run([crit()], _opts(tmp_path, f"{cmd} ; touch {marker}"), started=0, now=1)
    assert not marker.exists()


@pytest.mark.parametrize("text,seconds", [("6h", 21600), ("30m", 1800), ("1d", 86400), ("90", 90), ("0", 0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_bad_duration_says_what_is_accepted():
    with pytest.raises(ClusterctlError, match="bad duration '6 hours'"):
        parse_duration("6 hours")
