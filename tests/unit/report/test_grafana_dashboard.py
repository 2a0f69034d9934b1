"""docs/grafana/vllm-dashboard.json: the panels the issue asks for, templated on the file_sd label,
with PromQL that only names metrics and labels a recorded simulator /metrics page really has.

(No Grafana or Prometheus is installed here: the PromQL is checked by these rules, not executed.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

from clusterctl.report.filesd import targets
from clusterctl.inventory.loader import load_inventory
from unit.vllm_sim.promparse import parse

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = json.loads((ROOT / "docs" / "grafana" / "vllm-dashboard.json").read_text())
#: recorded from the lab's simulator (vLLM 0.11 names) after a bench run, so histograms have counts
SAMPLES = parse((ROOT / "tests" / "fixtures" / "report" / "vllm_sim_metrics_v0.11.0.prom").read_text())
#: labels Prometheus adds from the file_sd target group, plus ``le`` of histogram buckets
SD_LABELS = {"le"} | set(targets(load_inventory(ROOT / "inventories" / "example-16xh100-roce.yaml"))[0]["labels"])

EXPRS = [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p["targets"]]


def _metrics(expr: str) -> list[str]:
    return re.findall(r"\bvllm:[A-Za-z0-9_:]+", expr)


def test_the_issue_panels_are_there():
    titles = " | ".join(p["title"] for p in DASHBOARD["panels"]).lower()
    for want in (
        "running",
        "waiting",
        "kv-cache",
        "time to first token",
        "inter-token",
        "end-to-end",
        "generation throughput",
        "preemptions",
    ):
        assert want in titles, want
    for p in DASHBOARD["panels"]:
        if "p50, p90, p99" in p["title"]:
            assert [t["expr"].split(",")[0] for t in p["targets"]] == [
                "histogram_quantile(0.5",
                "histogram_quantile(0.9",
                "histogram_quantile(0.99",
            ]


def test_templated_on_the_file_sd_instance_label_in_every_query():
    var = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert var["instance"]["multi"] and var["instance"]["includeAll"]
    assert "vllm_instance" in SD_LABELS and "vllm_instance)" in var["instance"]["definition"]
    for title, expr in EXPRS:
        selectors = re.findall(r"vllm:[A-Za-z0-9_:]+(\{[^}]*\})?", expr)
        assert selectors and all(s == '{vllm_instance=~"$instance"}' for s in selectors), (title, expr)


def test_every_metric_is_one_the_simulator_exports_and_rates_are_of_counters():
    for title, expr in EXPRS:
        for name in _metrics(expr):
            assert name in SAMPLES, f"{title}: {name} is not in the recorded /metrics page"
        for name in re.findall(r"rate\((vllm:[A-Za-z0-9_:]+)", expr):
            assert name.endswith(("_total", "_bucket")), f"{title}: rate() of the gauge {name}"
        for name in re.findall(
            r"histogram_quantile\([^,]+, sum by \(le, [a-z_]+\) \(rate\((vllm:[A-Za-z0-9_:]+)", expr
        ):
            assert name.endswith("_bucket")
        if "histogram_quantile" in expr:
            assert re.search(r"by \(le\b", expr), f"{title}: quantiles need le kept"


def test_grouping_labels_exist_and_the_promql_is_balanced():
    for title, expr in EXPRS:
        metric_labels = {k for name in _metrics(expr) for series in SAMPLES[name] for k, _ in series}
        for group in re.findall(r"by \(([^)]*)\)", expr):
            for label in (x.strip() for x in group.split(",")):
                assert label in SD_LABELS | metric_labels, f"{title}: no label {label}"
        for o, c in ("()", "[]", "{}"):
            depth = 0
            for ch in expr:
                depth += (ch == o) - (ch == c)
                assert depth >= 0, (title, expr)
            assert depth == 0, (title, expr)


def test_panels_have_unique_ids_and_do_not_overlap():
    panels = DASHBOARD["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = [
        (p["gridPos"]["x"] + dx, p["gridPos"]["y"] + dy)
        for p in panels
        for dx in range(p["gridPos"]["w"])
        for dy in range(p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells)) and all(0 <= x < 24 for x, _ in cells)
    assert all(t["refId"] for p in panels for t in p["targets"])
