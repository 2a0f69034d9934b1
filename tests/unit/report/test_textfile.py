"""node_exporter textfile: strict Prometheus text format, atomic replacement."""

from __future__ import annotations

import os

import pytest

from clusterctl.files import write_atomic
from clusterctl.report.diff import diff
from clusterctl.report.textfile import render
from unit.vllm_sim.promparse import parse

from report_findings import crit, ok, warn


def test_output_parses_strictly_and_carries_the_change_counts():
    text = render(
        [warn(), ok(), crit(host='gp"u\\1')], diff([crit()], [warn(), ok()]), finished=1700000000.5, duration_s=12.25
    )
    m = parse(text)
    assert m["clusterctl_report_problems"][(("state", "new"),)] == 1
    assert m["clusterctl_report_problems"][(("state", "resolved"),)] == 1
    assert m["clusterctl_report_last_run_timestamp_seconds"][()] == 1700000000.5
    assert m["clusterctl_report_duration_seconds"][()] == 12.25
    assert m["clusterctl_doctor_exit_code"][()] == 2
    # a host name with a quote and a backslash is escaped, not a broken line
    # (the parser keeps label values as written, escapes included)
    assert any(dict(k).get("host") == 'gp\\"u\\\\1' for k in m["clusterctl_doctor_finding"])


def test_write_replaces_atomically_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "tf" / "clusterctl.prom"
    write_atomic(target, "a 1\n")
    inode = target.stat().st_ino
    write_atomic(target, "a 2\n")
    assert target.read_text() == "a 2\n" and target.stat().st_ino != inode  # renamed over, not rewritten
    assert sorted(os.listdir(target.parent)) == ["clusterctl.prom"]
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_a_failed_write_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "clusterctl.prom"
    write_atomic(target, "a 1\n")

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_atomic(target, "a 2\n")
    assert target.read_text() == "a 1\n" and sorted(os.listdir(tmp_path)) == ["clusterctl.prom"]


def test_two_findings_with_one_label_set_are_one_series_counting_them():
    """Issue 21: two XIDs on one GPU wrote the same series twice; the strict parser refused the file."""
    from clusterctl.diagnose.findings import Finding, Severity

    xids = [Finding("gpu.xid", Severity.CRIT, "gpu01", "gpu:3", f"XID {x}") for x in (79, 48)]
    m = parse(render([*xids, warn()], diff([], xids), finished=1.0, duration_s=1.0))
    series = m["clusterctl_doctor_finding"]
    assert series[(("check", "gpu.xid"), ("host", "gpu01"), ("severity", "CRIT"), ("subject", "gpu:3"))] == 2
    assert sum(series.values()) == 3
