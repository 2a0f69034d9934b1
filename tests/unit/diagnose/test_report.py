"""Renderers: identical findings grouped over hosts as node sets, worst first; JSON, Markdown, Prometheus."""

from __future__ import annotations

import json

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.report.findings import group, merge_checks, to_json, to_markdown, to_prometheus

F = [
    Finding("gpu.ecc", Severity.OK, "gpu01", "host", "fine"),
    Finding("gpu.remap", Severity.WARN, "gpu03", "gpu:2", "a row remap is pending", "reset the GPU"),
    Finding("gpu.remap", Severity.WARN, "gpu01", "gpu:2", "a row remap is pending", "reset the GPU"),
    Finding("gpu.remap", Severity.WARN, "gpu02", "gpu:2", "a row remap is pending", "reset the GPU"),
    Finding("gpu.xid", Severity.CRIT, "gpu07", "gpu:3", "XID 79 ...", "power-cycle", ("line|with pipe",)),
    Finding("tp.group", Severity.CRIT, None, "tp-group:a", "UNAVAILABLE", "drain a"),
    Finding("host.reachable", Severity.UNKNOWN, "gpu09", "host", "no facts: unreachable"),
]


def test_identical_findings_fold_into_a_node_set_worst_first():
    g = group(F)
    assert [(x.severity, x.check, x.hosts) for x in g] == [
        (Severity.CRIT, "gpu.xid", "gpu07"),
        (Severity.CRIT, "tp.group", ""),
        (Severity.WARN, "gpu.remap", "gpu[01-03]"),
        (Severity.UNKNOWN, "host.reachable", "gpu09"),
        (Severity.OK, "gpu.ecc", "gpu01"),
    ]
    assert g[2].count == 3
    assert [x.check for x in group(F, Severity.WARN)] == ["gpu.xid", "tp.group", "gpu.remap"]


def test_rows_that_differ_only_in_check_merge():
    same = [Finding(c, Severity.UNKNOWN, "n1", "host", "no facts") for c in ("gpu.a", "gpu.b", "gpu.c", "gpu.d")]
    (row,) = merge_checks(group(same))
    assert row.check == "gpu.* (4 checks)" and row.count == 4


def test_json_has_summary_groups_and_every_finding():
    doc = json.loads(to_json(F, meta={"duration_s": 1.5}))
    assert doc["summary"] == {"worst": "CRIT", "exit_code": 2, "counts": {"OK": 1, "WARN": 3, "CRIT": 2, "UNKNOWN": 1}}
    assert doc["groups"][2]["hosts"] == "gpu[01-03]" and len(doc["findings"]) == len(F)
    assert doc["findings"][4]["severity"] == "CRIT" and doc["meta"]["duration_s"] == 1.5


def test_markdown_table_escapes_pipes_and_hides_ok_on_request():
    md = to_markdown(F, min_severity=Severity.UNKNOWN)
    assert md.startswith("# clusterctl doctor: CRIT")
    assert "| WARN | gpu.remap | gpu[01-03] | gpu:2 | a row remap is pending | reset the GPU |" in md
    assert "gpu.ecc" not in md


def test_prometheus_text_one_series_per_problem_and_worst_per_check():
    text = to_prometheus(F)
    assert 'clusterctl_doctor_finding{check="gpu.xid",host="gpu07",subject="gpu:3",severity="CRIT"} 1' in text
    assert 'clusterctl_doctor_check_severity{check="gpu.ecc",host="gpu01"} 0' in text
    assert 'clusterctl_doctor_check_severity{check="host.reachable",host="gpu09"} 3' in text
    assert text.rstrip().endswith("clusterctl_doctor_exit_code 2")
    assert "gpu.ecc" not in "\n".join(x for x in text.splitlines() if x.startswith("clusterctl_doctor_finding"))


def test_checks_data_errors_name_file_and_line(tmp_path):
    import pytest

    from clusterctl.diagnose.thresholds import load_thresholds
    from clusterctl.errors import ConfigError

    (tmp_path / "xid.yaml").write_text("codes:\n  79: {name: X, severity: FATAL}\n")
    (tmp_path / "gpu.yaml").write_text("gpu:\n  temperature_warn_c: hot\n")
    with pytest.raises(ConfigError) as e:
        load_thresholds(tmp_path)
    assert "gpu.yaml:2: temperature_warn_c: 'hot' is not a number" in str(e.value)
    (tmp_path / "gpu.yaml").unlink()
    with pytest.raises(ConfigError, match=r"xid.yaml:2: severity 'FATAL'"):
        load_thresholds(tmp_path)
    (tmp_path / "xid.yaml").write_text("codes: [\n")
    with pytest.raises(ConfigError, match=r"xid.yaml:2: not valid YAML"):
        load_thresholds(tmp_path)


def test_shipped_checks_data_loads():
    from pathlib import Path

    from clusterctl.diagnose.thresholds import load_thresholds

    data = load_thresholds(Path(__file__).resolve().parents[3] / "checks")
    assert data["xid"]["codes"][79]["severity"] == "CRIT" and data["gpu"]["serving"]["ttft_p99_slo_s"] == 5.0
