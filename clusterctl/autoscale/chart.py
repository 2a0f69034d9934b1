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
    records = list(records)
    nxt: dict[int, float] = {}  # record index -> the next decision's time of its template
    last: dict[str, int] = {}
    for i, r in enumerate(records):
        if isinstance(r.get("ts"), (int, float)) and isinstance(r.get("template"), str):
            if r["template"] in last:
                nxt[last[r["template"]]] = float(r["ts"])
            last[r["template"]] = i
    for i, r in enumerate(records):
        t, name = r.get("ts"), r.get("template")
        if not isinstance(t, (int, float)) or not isinstance(name, str):
            continue
        s = out.setdefault(name, {"replicas": [], "signal": [], "high": [], "low": []})
        # the count measured at the decision, and the new one once the action is done (ts + seconds)
        if isinstance(r.get("current"), int):
            s["replicas"].append((float(t), float(r["current"])))
        if r.get("outcome") == "ok" and r.get("action") in ("out", "in") and isinstance(r.get("target"), int):
            took = r.get("seconds")
            done = float(took) if isinstance(took, (int, float)) else 0.0
            # ``seconds`` also counts the measurement before ``ts``: never past the next decision
            at = min(float(t) + done, nxt.get(i, float("inf")))
            cur = r.get("current")
            s["replicas"] += [
                (at - 1e-3, float(cur) if isinstance(cur, int) else float(r["target"])),
                (at, float(r["target"])),
            ]  # a step, not a slope
        for key, label in (("value", "signal"), ("high", "high"), ("low", "low")):
            v = r.get(key)
            if isinstance(v, (int, float)):
                s[label].append((float(t), float(v)))
    for v in out.values():
        v["replicas"].sort(key=lambda p: p[0])  # stable: a change at the same time stays after
    return out


def charts(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """SVG charts, two per template (replicas, then the signal with its band)."""
    svgs = []
    recs = list(records)
    for name, s in sorted(series(recs).items()):
        signal = next((str(r.get("signal")) for r in reversed(recs) if r.get("template") == name), "signal")
        svgs.append(line_chart(f"{name}: replicas (autoscaler)", {"replicas": s["replicas"]}))
        svgs.append(
            line_chart(
                f"{name}: {signal} and its band",
                {signal: s["signal"], "high": s["high"], "low": s["low"]},
                colours={"high": "#d62728", "low": "#2ca02c", signal: "#1f77b4"},
            )
        )
    return svgs
