"""Plot a release benchmark result: where the release window's time goes, per host count (SVG, no dependencies).

One bar per host count and release: A (staging in the window, what ``deploy``
does) and B (pre-staged and warmed before the window).  Segments, left to right
from the window's start: the fan-out round, then per batch its staging (B: the
switch only) and its restart + gates.  B's pre-staging is drawn left of zero:
it happens before the window, while the old version serves.  Colours come from
clusterctl.report.svg.

Example: python3 benchmarks/release/plot.py benchmarks/results/release-2026-12-01T2300.json \\
         --svg docs/release-breakdown.svg --lab benchmarks/results/release-lab-<date>.json

With ``--lab``, rows for the nspawn lab's real releases follow: the read, pre-flight, lock and
re-read, then per batch the drain (mark-down at the gateway and the wait for requests in flight),
stop/start + load + gates and the mark-up.
"""

from __future__ import annotations

import argparse
import json
import sys
from html import escape
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from clusterctl.files import write_atomic  # noqa: E402
from clusterctl.report.svg import COLOURS  # noqa: E402

SEGMENTS = {
    "prestage": ("pre-staging + warm (before the window)", "#bbb"),
    "round": ("fan-out round", COLOURS[3 % len(COLOURS)]),
    "stage": ("staging in the window (B: switch only)", COLOURS[0]),
    "restart": ("restart + gates (load, then /health, /v1/models, completion)", COLOURS[1]),
    "preflight": ("nspawn lab: read, pre-flight, lock, re-read", COLOURS[4 % len(COLOURS)]),
    "drain": ("nspawn lab: drain (mark-down at the gateway, requests in flight)", COLOURS[2 % len(COLOURS)]),
    "markup": ("nspawn lab: mark-up at the gateway", COLOURS[5 % len(COLOURS)]),
}


def lab_bars(doc: dict[str, Any]) -> list[tuple[str, list[tuple[str, float]], float]]:
    """The nspawn lab's real releases (``lab.py``): per release, from the command's start, the
    read, pre-flight, lock and re-read, then per batch its drain, stop/start + load + gates, mark-up."""
    out = []
    for r in doc["runs"]:
        t = r.get("timings") or {}
        head = sum(float(t.get(k, 0.0)) for k in ("prepare_s", "preflight_s", "lock_s", "reread_s"))
        segs = [("preflight", head)]
        for b in t.get("batches", []):
            segs += [
                ("drain", float(b["drain_s"])),
                ("restart", float(b["apply_s"]) + float(b["gate_s"])),
                ("markup", float(b["mark_up_s"])),
            ]
        load = max(r["load_1min"])
        out.append((f"lab {r['hosts']} hosts, {r['arm']} (load {load:.0f})", segs, 0.0))
    return out


def bars(doc: dict[str, Any]) -> list[tuple[str, list[tuple[str, float]], float]]:
    """(label, [(segment, seconds)...] from the window's start, seconds before it) per bar."""
    out = []
    for r in doc["runs"]:
        for key, name in (("A", "A in window"), ("B", "B pre-staged")):
            rel = r[key]
            segs = [("round", float(rel["fanout_round_s"]))]
            for b in rel["batches"]:
                segs += [("stage", float(b["stage_s"])), ("restart", float(b["gated_s"]))]
            before = float(rel.get("prestage_s", 0.0))
            out.append((f"{r['hosts']} hosts, {name} (load {r['load1_before']:.0f})", segs, before))
    return out


def release_svg(doc: dict[str, Any], width: int = 760, lab: dict[str, Any] | None = None) -> str:
    rows = bars(doc) + (lab_bars(lab) if lab else [])
    left, right, top, row_h = 200, 20, 66 if lab else 56, 22
    height = top + row_h * len(rows) + 90
    pw = width - left - right
    before = max(b for _, _, b in rows)
    after = max(sum(s for _, s in segs) for _, segs, _ in rows)
    span = (before + after) * 1.05 or 1.0

    def px(t: float) -> float:
        return left + (t + before) / span * pw

    title = (
        f"Release of a {doc['bytes'] / 2**20:.0f} MiB model, source at {doc['rate']} (S/B = "
        f"{doc['S_over_B_s']:.1f} s), --serial {doc['serial']}, load of {doc['real_gb']:g} GB x {doc['time_scale']:g}"
    )
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" role="img" aria-label="{escape(title)}">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="18" font-size="12" font-weight="bold">{escape(title)}</text>',
        '<text x="10" y="34" font-size="10">light lab, 2 shared CPUs; load average (1 min) before each host '
        "count in the labels</text>",
    ]
    if lab:
        out.append(
            f'<text x="10" y="48" font-size="10">below: real releases on the nspawn lab (--serial {lab["serial"]}, '
            f"tiny model, start-up x {lab['startup_scale']:g}), drain path before/after; load: the highest</text>"
        )
    y_end = top + row_h * len(rows)
    step = 10 if span < 150 else 30
    t = -int(before // step) * step
    while t <= after:
        out.append(
            f'<line x1="{px(t):.1f}" y1="{top - 4}" x2="{px(t):.1f}" y2="{y_end}" stroke="#eee"/>'
            f'<text x="{px(t):.1f}" y="{y_end + 14}" font-size="10" text-anchor="middle">{t} s</text>'
        )
        t += step
    out.append(
        f'<line x1="{px(0):.1f}" y1="{top - 4}" x2="{px(0):.1f}" y2="{y_end}" stroke="#333"/>'
        f'<text x="{px(0) + 3:.1f}" y="{top - 6}" font-size="10">window opens</text>'
    )
    for i, (label, segs, pre) in enumerate(rows):
        y = top + i * row_h
        out.append(f'<text x="{left - 6}" y="{y + 14}" font-size="10" text-anchor="end">{escape(label)}</text>')
        if pre:
            out.append(
                f'<rect x="{px(-pre):.1f}" y="{y + 3}" width="{px(0) - px(-pre):.1f}" height="{row_h - 6}" '
                f'fill="{SEGMENTS["prestage"][1]}"/>'
            )
        t0 = 0.0
        for seg, secs in segs:
            out.append(
                f'<rect x="{px(t0):.1f}" y="{y + 3}" width="{max(0.5, px(t0 + secs) - px(t0)):.1f}" '
                f'height="{row_h - 6}" fill="{SEGMENTS[seg][1]}" stroke="white" stroke-width="0.5"/>'
            )
            t0 += secs
        out.append(f'<text x="{px(t0) + 3:.1f}" y="{y + 14}" font-size="9">{t0:.0f} s</text>')
    for j, (label, colour) in enumerate(SEGMENTS.values()):
        ly = y_end + 30 + 14 * j
        out.append(
            f'<rect x="{left}" y="{ly - 8}" width="14" height="9" fill="{colour}"/>'
            f'<text x="{left + 20}" y="{ly}" font-size="10">{escape(label)}</text>'
        )
    return "\n".join(out) + "\n</svg>\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result", type=Path, help="a release result JSON (benchmarks/release/run.py)")
    ap.add_argument("--svg", type=Path, default=ROOT / "docs" / "release-breakdown.svg")
    ap.add_argument(
        "--lab", type=Path, action="append", default=[], help="a release-lab result JSON (lab.py); repeatable"
    )
    a = ap.parse_args()
    docs = [json.loads(p.read_text()) for p in a.lab]
    lab = {**docs[0], "runs": [r for d in docs for r in d["runs"]]} if docs else None
    write_atomic(a.svg, release_svg(json.loads(a.result.read_text()), lab=lab))
    print(a.svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
