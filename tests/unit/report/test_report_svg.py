"""Inline SVG charts: well-formed XML, bounded size, escaped labels."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from clusterctl.report.svg import MAX_POINTS, downsample, line_chart, plain


def test_chart_is_well_formed_svg_with_one_polyline_per_series_and_escaped_labels():
    svg = line_chart("GPU <util>", {"gpu01 gpu:0": [(0, 0.5), (60, 0.7)], 'a"&b': [(0, 1.0)]})
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg" and len(root.findall(f"{ns}polyline")) == 2
    assert "GPU <util>" in [t.text for t in root.iter(f"{ns}text")]
    assert 'a"&b' in [t.text for t in root.iter(f"{ns}text")]


def test_empty_chart_says_no_data():
    assert "no data" in line_chart("x", {})


def test_a_month_of_points_is_averaged_to_a_bounded_line():
    pts = [(float(i), float(i % 2)) for i in range(10080)]
    d = downsample(pts)
    assert len(d) == MAX_POINTS and all(0.4 < v < 0.6 for _, v in d)
    assert d[0][0] < d[-1][0]
    poly = ET.fromstring(line_chart("x", {"a": pts})).find("{http://www.w3.org/2000/svg}polyline")
    assert poly is not None and len(poly.get("points", "").split()) == MAX_POINTS


def test_axis_labels_stay_short_and_severity_colours_are_fixed():
    svg = line_chart(
        "CNP",
        {"CRIT": [(0, 0.0), (60, 3020.0)], "WARN": [(0, 1.0)]},
        colours={"CRIT": "#d62728"},
        fmt=lambda v: plain(v) + "/s",
    )
    texts = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert "3.02k/s" in texts and not any("e+" in (t or "") for t in texts)
    assert 'stroke="#d62728"' in svg.split("<polyline")[1]
    assert plain(2.5e9) == "2.5G" and plain(0.125) == "0.125"


def test_more_lines_than_a_legend_holds_are_averaged_per_host(tmp_path):
    from clusterctl.report.history import History, Metric
    from clusterctl.report.html import MAX_LINES, charts

    with History(tmp_path / "h.db") as h:
        for t in (0.0, 300.0):
            h.record(
                [],
                started=t,
                finished=t,
                metrics=[
                    Metric(host, "gpu_utilization_ratio", 0.1 * g, f"gpu:{g}") for host in ("a", "b") for g in range(8)
                ],
            )
        svg = str(charts(h, now=300.0)[1])
    labels = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert 2 * 8 > MAX_LINES and "GPU utilisation" in labels
    assert {"a (mean of 8)", "b (mean of 8)"} <= set(labels) and len(svg.split("<polyline")) == 3
    assert "35%" in labels  # the top of the axis: mean of 0.0 .. 0.7


def test_a_short_history_keeps_one_point_per_run_in_a_35_day_chart(tmp_path):
    from clusterctl.report.history import History, Metric
    from clusterctl.report.html import charts

    with History(tmp_path / "h.db") as h:
        for t in (1e9, 1e9 + 300, 1e9 + 600):  # three runs 5 minutes apart, charted over 35 days
            h.record([], started=t, finished=t, metrics=[Metric("a", "vllm_requests_waiting", t - 1e9, "instance:x")])
        svg = str(charts(h, now=1e9 + 600)[1])
    poly = ET.fromstring(svg).find("{http://www.w3.org/2000/svg}polyline")
    assert poly is not None and len(poly.get("points", "").split()) == 3
    assert {"0", "600"} <= {t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")}
