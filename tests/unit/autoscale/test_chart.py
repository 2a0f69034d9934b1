"""The report shows the autoscaler's decisions: replicas against load, with the band."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from clusterctl.autoscale import chart, record
from clusterctl.report.run import Options, report_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from report_findings import ok  # noqa: E402


def decisions(now: float) -> list[dict]:
    rows = [
        (0, 0.2, 1, 1, "none", "none"),
        (10, 0.9, 1, 1, "none", "none"),
        (20, 0.95, 1, 2, "out", "ok"),
        (30, 0.5, 2, 2, "none", "none"),
        (40, 0.1, 2, 2, "none", "none"),
        (50, 0.05, 2, 1, "in", "ok"),
        (60, 0.9, 1, 2, "out", "failed"),
    ]
    return [
        {
            "ts": now - 100 + t,
            "template": "pool",
            "signal": "load",
            "value": v,
            "high": 0.7,
            "low": 0.3,
            "current": cur,
            "target": tgt,
            "action": act,
            "outcome": out,
            "rule": "x",
        }
        for t, v, cur, tgt, act, out in rows
    ]


def test_series_follow_what_was_done_not_what_was_tried() -> None:
    s = chart.series(decisions(1000.0))["pool"]
    # each decision's measured count, and a done action's new count (at ts + seconds: 0 here);
    # the failed scale-out at the end stays at 1 replica
    assert [v for _, v in s["replicas"]] == [1, 1, 1, 1, 2, 2, 2, 2, 2, 1, 1]
    assert [v for _, v in s["signal"]][:3] == [0.2, 0.9, 0.95] and {v for _, v in s["high"]} == {0.7}


def test_report_html_has_the_charts(tmp_path: Path) -> None:
    now = time.time()
    for rec in decisions(now):
        record.append_history(tmp_path / "state", rec)
    opts = Options(db=tmp_path / "r.db", out_dir=tmp_path / "out", state_dir=tmp_path / "state")
    report_run([ok()], opts, started=now, now=now)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "pool: replicas (autoscaler)" in html and "pool: load and its band" in html
    plain = Options(db=tmp_path / "r2.db", out_dir=tmp_path / "out2")
    report_run([ok()], plain, started=now, now=now)
    assert "autoscaler" not in (tmp_path / "out2" / "report.html").read_text()
