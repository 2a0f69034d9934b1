"""Replicas against load: the autoscaler's audited decisions as charts (report, benchmarks).

Per template two charts on the same time axis: the replica count after each
decision (what it acted to, and the count it measured), and the signal it
decided on with the policy's band (high and low) drawn as lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from clusterctl.report.svg import line_chart


def series(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """template -> {"replicas": [...], "signal": [...], "high": [...], "low": [...]} of (time, value)."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for r in records:
        t, name = r.get("ts"), r.get("template")
        if not isinstance(t, (int, float)) or not isinstance(name, str):
            continue
        s = out.setdefault(name, {"replicas": [], "signal": [], "high": [], "low": []})
        target = r.get("target") if r.get("outcome") == "ok" else r.get("current")
        if isinstance(target, int):
            s["replicas"].append((float(t), float(target)))
        for key, label in (("value", "signal"), ("high", "high"), ("low", "low")):
            v = r.get(key)
            if isinstance(v, (int, float)):
                s[label].append((float(t), float(v)))
    return out


def charts(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """SVG charts, two per template (replicas, then the signal with its band)."""
    svgs = []
    recs = list(records)
    for name, s in sorted(series(recs).items()):
        signal = next((str(r.get("signal")) for r in reversed(recs) if r.get("template") == name), "signal")
        svgs.append(line_chart(f"{name}: replicas (autoscaler)", {"replicas": s["replicas"]}))
        svgs.append(line_chart(f"{name}: {signal} and its band", {signal: s["signal"], "high": s["high"],
                                                                 "low": s["low"]},
                               colours={"high": "#d62728", "low": "#2ca02c", signal: "#1f77b4"}))
    return svgs
