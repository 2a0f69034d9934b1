"""A whole run without the lab: lock, diff against the last run, files, exit codes, overlap."""

from __future__ import annotations

import json
import re
import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.report.history import History
from clusterctl.files import LockBusy, RunLock
from clusterctl.report.run import Options, report_run

from report_findings import crit, ok, warn


def test_fault_appears_as_new_then_ongoing_then_resolved_with_doctor_exit_codes(tmp_path):
    opts = Options(db=tmp_path / "r.db", out_dir=tmp_path / "out")
    r1 = report_run([crit(), ok()], opts, started=time.time())
    assert r1.exit_code == 2 and [f.subject for f in r1.change.new] == ["gpu:3"] and r1.previous_id is None
    r2 = report_run([crit(), warn(), ok()], opts, started=time.time())
    assert r2.change.ongoing == [crit()] and r2.change.new == [warn()] and r2.previous_id == r1.run_id
    r3 = report_run([ok()], opts, started=time.time())
    assert r3.exit_code == 0 and {f.check for f in r3.change.resolved} == {"gpu.xid", "roce.pfc"}
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["run"]["exit_code"] == 0 and len(doc["changes"]["resolved"]) == 2
    assert doc["hosts"] == [{"host": "gpu03", "worst": "OK", "problems": 0, "top": ""}]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Resolved (2)" in md and "| CRIT | gpu01 | gpu.xid | gpu:3 |" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<svg" in html and "Problems per run" in html
    assert f"<td>{r3.run_id}</td><td>{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(r3.started))}</td>" in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # no external assets
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no temp files left


def test_unknown_only_exits_3_and_warn_beats_unknown(tmp_path):
    unk = Finding("gpu.xid", Severity.UNKNOWN, "gpu05", "host", "unreachable: timed out")
    opts = Options(db=tmp_path / "r.db")
    assert report_run([unk, ok()], opts, started=0).exit_code == 3
    assert report_run([unk, warn()], opts, started=0).exit_code == 1


def test_html_escapes_what_hosts_report(tmp_path):
    evil = Finding("gpu.xid", Severity.WARN, "gpu01", "gpu:0", "<script>alert(1)</script>")
    report_run([evil], Options(db=tmp_path / "r.db", out_dir=tmp_path), started=0)
    html = (tmp_path / "report.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_markdown_keeps_no_raw_html_or_markup_from_host_and_instance_names(tmp_path):
    """Issue 21: ``<script>`` in a host or instance name stayed raw HTML in report.md."""
    from clusterctl.report.findings import to_markdown as doctor_markdown

    evil = [
        Finding("gpu.xid", Severity.CRIT, "<script>alert(1)</script>", "gpu:0", "XID 79"),
        Finding(
            "tp.group",
            Severity.WARN,
            "gpu02",
            "instance:<img src=x onerror=alert(1)>",
            "a|b\n| injected | row |",
            "[click](javascript:alert(1))",
        ),
    ]
    report_run(evil, Options(db=tmp_path / "r.db", out_dir=tmp_path), started=0)
    for md in ((tmp_path / "report.md").read_text(), doctor_markdown(evil)):
        assert "<script>" not in md and "<img" not in md and "&lt;script&gt;" in md
        assert "[click](" not in md and "| injected |" not in md
        for table in md.split("\n\n"):
            cells = [len(re.findall(r"(?<!\\)\|", line)) for line in table.splitlines() if line.startswith("|")]
            assert len(set(cells)) <= 1, table  # every row has the header's columns: no row was injected


def test_a_second_run_while_the_lock_is_held_fails_naming_the_lock(tmp_path):
    opts = Options(db=tmp_path / "r.db")
    with RunLock(tmp_path / "r.db.lock"):
        with pytest.raises(LockBusy, match=r"r\.db\.lock: another report run holds the lock"):
            report_run([crit()], opts, started=0)
    assert report_run([crit()], opts, started=0).run_id == 1  # released: the next run goes ahead


def _one_run(db: str, n: int, barrier, results) -> None:
    findings = [crit(host=f"gpu{n:02d}")] + [ok(host=f"gpu{i:02d}") for i in range(40)]
    barrier.wait()
    r = report_run(findings, Options(db=Path(db), lock_wait_s=30), started=time.time())
    results.put((r.run_id, r.previous_id, [f.host for f in r.change.new], [f.host for f in r.change.resolved]))


def test_overlapping_runs_in_separate_processes_leave_a_consistent_database(tmp_path):
    db = str(tmp_path / "r.db")
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_one_run, args=(db, n, barrier, results)) for n in range(4)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0
    # serialised by the lock: each run compared with the run committed just before it
    assert [(rid, prev) for rid, prev, _, _ in got] == [(1, None), (2, 1), (3, 2), (4, 3)]
    assert all(len(new) == 1 for _, _, new, _ in got)
    assert [resolved for _, _, _, resolved in got[1:]] == [new for _, _, new, _ in got[:-1]]
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert con.execute("SELECT run_id, count(*) FROM findings GROUP BY run_id").fetchall() == [
        (i, 1) for i in (1, 2, 3, 4)
    ]  # the CRIT stored, the 40 OK counted
    assert con.execute("SELECT ok_findings FROM runs").fetchall() == [(40,)] * 4


def test_retention_prunes_old_runs_during_a_run(tmp_path):
    db = tmp_path / "r.db"
    with History(db) as h:
        h.record([crit()], started=time.time() - 40 * 86400)
    r = report_run([ok()], Options(db=db), started=time.time())
    assert r.pruned == 1
    assert r.change.resolved == [crit()]  # compared with the last run before pruning it


def test_tp_group_state_per_instance_in_json_markdown_and_html(tmp_path):
    groups = [
        Finding(
            "tp.group",
            Severity.CRIT,
            None,
            "tp-group:qwen-a",
            "UNAVAILABLE: member gpu01:3 is critical (gpu.xid); the group of 4 cannot serve",
            "drain",
        ),
        Finding("tp.group", Severity.OK, None, "tp-group:llama-b", "all 8 member GPUs healthy"),
    ]
    report_run([crit(), *groups], Options(db=tmp_path / "r.db", out_dir=tmp_path), started=0)
    doc = json.loads((tmp_path / "report.json").read_text())
    assert [(g["instance"], g["state"]) for g in doc["tp_groups"]] == [("llama-b", "OK"), ("qwen-a", "UNAVAILABLE")]
    assert "| qwen-a | UNAVAILABLE |" in (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    assert '<td>qwen-a</td><td class="CRIT">UNAVAILABLE</td>' in html
