"""Plot a staging benchmark result: seconds against hosts for naive, chain and tree (SVG, no dependencies).

Reference lines: N x S/B (what naive cannot beat: every host's bytes cross
the server's one link), S/B (one copy through one link) and the 1.3 x S/B
goal of issue #7.  Colours and axis labels come from clusterctl.report.svg.

Example: python3 benchmarks/staging/plot.py benchmarks/results/staging-2026-11-30T1620.json \\
         --svg docs/staging-relay.svg
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from html import escape
from pathlib import Path
from typing import Any

from clusterctl.report.svg import COLOURS, plain

ROOT = Path(__file__).resolve().parents[2]
MODES = {"none": "naive (every host reads the server)", "chain": "relay chain", "tree": "relay tree (fan-out 2)"}


def staging_svg(doc: dict[str, Any], width: int = 640, height: int = 340) -> str:
    """The chart for one result document (``runs`` rows with ``hosts``, ``mode``, ``seconds``)."""
    sb = float(doc["S_over_B_s"])
    runs = [r for r in doc["runs"] if r.get("ok")]
    hosts = sorted({int(r["hosts"]) for r in runs}) or [1]
    left, right, top, bottom = 52, 200, 30, 40
    pw, ph = width - left - right, height - top - bottom
    n0, n1 = min(hosts), max(hosts)
    vmax = max([float(r["seconds"]) for r in runs] + [n1 * sb]) * 1.08

    def px(n: float) -> float:
        return left + (0.5 if n1 == n0 else (n - n0) / (n1 - n0)) * pw

    def py(v: float) -> float:
        return top + ph - v / vmax * ph

    title = f"Staging {plain(doc['bytes'])}B at {doc['rate']} per link (S/B = {sb:.1f} s)"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" role="img" aria-label="{escape(title)}">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>',
    ]
    for n in hosts:
        out.append(f'<text x="{px(n):.1f}" y="{top + ph + 14}" font-size="10" text-anchor="middle">{n}</text>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{height - 8}" font-size="11" text-anchor="middle">hosts</text>')
    for k in range(5):
        v = vmax * k / 4
        out.append(f'<text x="{left - 4}" y="{py(v) + 4:.1f}" font-size="10" text-anchor="end">{plain(v)} s</text>')
    legend: list[tuple[str, str, str]] = []
    refs = [
        ("N x S/B", "#888", "6 3", lambda n: n * sb),
        ("1.3 x S/B (goal)", "#888", "2 2", lambda n: 1.3 * sb),
        ("S/B", "#bbb", "6 3", lambda n: sb),
    ]
    for label, colour, dash, f in refs:
        out.append(
            f'<line x1="{px(n0):.1f}" y1="{py(f(n0)):.1f}" x2="{px(n1):.1f}" y2="{py(f(n1)):.1f}" '
            f'stroke="{colour}" stroke-width="1.2" stroke-dasharray="{dash}"/>'
        )
        legend.append((label, colour, dash))
    for i, (mode, label) in enumerate(MODES.items()):
        pts = sorted((int(r["hosts"]), float(r["seconds"])) for r in runs if r["mode"] == mode)
        if not pts:
            continue
        colour = COLOURS[i % len(COLOURS)]
        out.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
            + " ".join(f"{px(n):.1f},{py(v):.1f}" for n, v in pts)
            + '"/>'
        )
        out += [f'<circle cx="{px(n):.1f}" cy="{py(v):.1f}" r="3" fill="{colour}"/>' for n, v in pts]
        legend.append((label, colour, ""))
    for j, (label, colour, dash) in enumerate(legend):
        ly = top + 10 + 16 * j
        d = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<line x1="{width - right + 10}" y1="{ly}" x2="{width - right + 30}" y2="{ly}" stroke="{colour}" '
            f'stroke-width="2"{d}/><text x="{width - right + 34}" y="{ly + 4}" font-size="10">'
            f'{escape(label)}</text>'
        )
    return "\n".join(out) + "\n</svg>\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result", type=Path, help="a staging result JSON (benchmarks/staging/run.py)")
    ap.add_argument("--svg", type=Path, default=ROOT / "docs" / "staging-relay.svg")
    a = ap.parse_args()
    svg = staging_svg(json.loads(a.result.read_text()))
    tmp = a.svg.with_name(a.svg.name + ".tmp")
    tmp.write_text(svg)
    os.replace(tmp, a.svg)
    print(a.svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
