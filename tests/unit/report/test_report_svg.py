"""Inline SVG charts: well-formed XML, bounded size, escaped labels."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from clusterctl.report.svg import MAX_POINTS, downsample, line_chart


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
