"""The report's overview at scale: heatmap cells say what was seen, top offenders come first,
charts of many hosts show the spread instead of a line per host."""

from __future__ import annotations

import re

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.report import overview as ov
from clusterctl.report.html import spread


def F(check: str, sev: Severity, host: str, subject: str, msg: str = "m") -> Finding:
    return Finding(check, sev, host, subject, msg, "")


def test_cells_take_the_worst_finding_and_never_claim_ok_without_data():
    findings = [
        F("host.reachable", Severity.OK, "gpu2", "host"),
        F("gpu.ecc", Severity.OK, "gpu2", "gpu:0"),
        F("gpu.ecc", Severity.OK, "gpu2", "gpu:1"),
        F("gpu.xid", Severity.WARN, "gpu2", "gpu:1", "XID 13"),
        F("gpu.remap", Severity.CRIT, "gpu2", "gpu:1", "remap"),
        F("roce.pfc", Severity.WARN, "gpu10", "nic:eth2", "paused 30%"),
        F("host.reachable", Severity.UNKNOWN, "gpu3", "host", "unreachable: timed out"),
    ]
    loads = {"gpu": {("gpu2", "gpu:0"): 0.5, ("gpu2", "gpu:1"): 1.0, ("gpu10", "gpu:0"): 0.25, ("gpu10", "gpu:1"): 0.3}}
    g = ov.grids(findings, loads)
    rows = g["gpu"].rows
    assert list(rows) == ["gpu2", "gpu3", "gpu10"]  # natural order
    assert [(c.subject, c.severity) for c in rows["gpu2"]] == [("gpu:0", "OK"), ("gpu:1", "CRIT")]
    assert rows["gpu2"][1].why == "gpu.remap: remap"
    # gpu10 ran no GPU check: its GPUs have a load but no verdict
    assert [c.severity for c in rows["gpu10"]] == ["none", "none"] and rows["gpu10"][0].load == 0.25
    # the unreachable host: as many UNKNOWN cells as the others have
    assert [c.severity for c in rows["gpu3"]] == ["UNKNOWN", "UNKNOWN"]
    assert [(c.subject, c.severity) for c in g["nic"].rows["gpu10"]] == [("nic:eth2", "WARN")]


def test_heatmap_svg_has_one_row_per_host_with_its_findings_in_the_tooltip():
    findings = [F("host.reachable", Severity.OK, f"h{i}", "host") for i in range(70)]
    findings += [F("gpu.ecc", Severity.OK, f"h{i}", f"gpu:{g}") for i in range(70) for g in range(8)]
    findings.append(F("gpu.xid", Severity.CRIT, "h42", "gpu:5", "XID 79 <fell off>"))
    g = ov.grids(findings, {})
    svg = ov.heatmap("Hosts x GPUs", g["gpu"], by="severity")
    assert svg.count("<g>") == 70 and g["gpu"].cells == 560
    assert "<title>h42: gpu:5 CRIT (gpu.xid: XID 79 &lt;fell off&gt;)</title>" in svg
    assert "<title>h41: 8 gpus, OK</title>" in svg
    # 70 hosts in columns of 32: three columns, the label of the 33rd host starts the second
    xs = {float(x) for x in re.findall(r'<text x="([\d.]+)" y="[\d.]+" font-size="9"', svg)}
    assert len(xs) == 3
    assert ov.SEVERITY_FILL["CRIT"] in svg
    # an all-OK row is drawn as one run, not eight cells
    assert svg.count(f'fill="{ov.SEVERITY_FILL["OK"]}"') < 70 * 2 + 2


def test_load_heatmap_scales_and_marks_missing_values():
    g = ov.grids([], {"nic": {("h1", "nic:eth2"): 0.05, ("h1", "nic:eth3"): 0.4}})
    svg = ov.heatmap("NICs", g["nic"], by="load", scale=0.2)
    assert "<title>h1: nic:eth2 5%, nic:eth3 40%</title>" in svg
    assert ov._load_fill(1.0) in svg and "20%+" in svg  # eth3 is past the scale: darkest


def test_top_offenders_worst_first():
    rows = [
        {"host": "a", "worst": "WARN", "problems": 5, "top": ""},
        {"host": "b", "worst": "CRIT", "problems": 1, "top": ""},
        {"host": "c", "worst": "OK", "problems": 0, "top": ""},
        {"host": "d", "worst": "CRIT", "problems": 3, "top": ""},
    ]
    assert [r["host"] for r in ov.top_hosts(rows)] == ["d", "b", "a"]
    findings = [F("roce.pfc", Severity.WARN, f"h{i}", "nic:eth2") for i in range(1, 6)] + [
        F("gpu.xid", Severity.CRIT, "h1", "gpu:0"),
        F("gpu.xid", Severity.CRIT, "h1", "gpu:1"),
        F("gpu.ecc", Severity.OK, "h1", "gpu:0"),
    ]
    top = ov.top_problems(findings)
    assert [(t["check"], t["host_count"], t["count"], t["hosts"]) for t in top] == [
        ("gpu.xid", 1, 2, "h1"),
        ("roce.pfc", 5, 5, "h[1-5]"),
    ]


def test_spread_gives_median_p90_max_per_time_slice():
    series = {(f"h{i}", "gpu:0"): [(100.0, float(i)), (200.0, float(10 * i))] for i in range(1, 11)}
    s = spread(series, buckets=2)
    assert s["median"] == [(100.0, 6.0), (200.0, 60.0)]
    assert s["p90"] == [(100.0, 10.0), (200.0, 100.0)] and s["max"][1] == (200.0, 100.0)
    assert spread({}) == {}


def test_a_report_of_many_hosts_charts_the_spread_and_collapses_long_tables(tmp_path):
    from clusterctl.report.history import Metric
    from clusterctl.report.run import Options, report_run

    hosts = [f"gpu{i:02d}" for i in range(1, 41)]
    for r in range(2):
        findings = [F("gpu.ecc", Severity.WARN, h, "gpu:0", "ECC") for h in hosts]
        metrics = [Metric(h, "gpu_utilization_ratio", 0.1 * r, f"gpu:{g}") for h in hosts for g in range(2)]
        report_run(
            findings,
            Options(db=tmp_path / "r.db", out_dir=tmp_path / "out"),
            started=1000 + 300 * r,
            now=1005 + 300 * r,
            metrics=metrics,
        )
    page = (tmp_path / "out" / "report.html").read_text()
    assert 'aria-label="GPU utilisation (median, p90, max of 80 series on 40 hosts)"' in page
    assert page.count("<polyline") == 3 + 3  # problems per run (3 severities) + the spread
    assert "<details><summary>40 hosts, worst first</summary>" in page  # closed: longer than OPEN_ROWS
    assert 'aria-label="Hosts x GPUs: worst finding (80 GPUs)"' in page
