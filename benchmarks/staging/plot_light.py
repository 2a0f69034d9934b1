"""Plot light-host staging runs (``benchmarks/staging/light.py``): x S/B against hosts, one line per
result file (e.g. before and after a change), with the 1.3 x S/B goal (SVG, no dependencies).

Each point is the median of a host count's runs; its label is the 1-minute load range of those runs.

Example: python3 benchmarks/staging/plot_light.py benchmarks/results/staging-light-*-before.json \\
         benchmarks/results/staging-light-*-after.json --svg docs/staging-light.svg
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from html import escape
from pathlib import Path
from typing import Any

from clusterctl.report.svg import COLOURS

ROOT = Path(__file__).resolve().parents[2]


def light_svg(docs: list[dict[str, Any]], width: int = 640, height: int = 340) -> str:
    left, right, top, bottom = 52, 190, 30, 40
    pw, ph = width - left - right, height - top - bottom
    hosts = sorted({int(s["hosts"]) for d in docs for s in d["summary"]})
    vmax = max([float(s["x_S_over_B"]) for d in docs for s in d["summary"]] + [1.3]) * 1.1

    def px(n: int) -> float:  # host counts are evenly spaced (2, 4, 8, ...)
        i = hosts.index(n)
        return left + (0.5 if len(hosts) == 1 else i / (len(hosts) - 1)) * pw

    def py(v: float) -> float:
        return top + ph - v / vmax * ph

    d0 = docs[0]
    title = f"Chain staging on light hosts: {d0['bytes'] >> 20} MiB at {d0['rate']} (S/B = {d0['S_over_B_s']:.1f} s)"
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
        out.append(f'<text x="{left - 4}" y="{py(v) + 4:.1f}" font-size="10" text-anchor="end">{v:.1f}x</text>')
    legend: list[tuple[str, str, str]] = [("1.3 x S/B (goal)", "#888", "2 2"), ("S/B", "#bbb", "6 3")]
    for v, colour, dash in ((1.3, "#888", "2 2"), (1.0, "#bbb", "6 3")):
        out.append(
            f'<line x1="{left}" y1="{py(v):.1f}" x2="{left + pw}" y2="{py(v):.1f}" stroke="{colour}" '
            f'stroke-width="1.2" stroke-dasharray="{dash}"/>'
        )
    for i, d in enumerate(docs):
        colour = COLOURS[i % len(COLOURS)]
        pts = sorted((int(s["hosts"]), float(s["x_S_over_B"]), s["load1"]) for s in d["summary"])
        out.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
            + " ".join(f"{px(n):.1f},{py(v):.1f}" for n, v, _ in pts)
            + '"/>'
        )
        for n, v, load in pts:
            out.append(f'<circle cx="{px(n):.1f}" cy="{py(v):.1f}" r="3" fill="{colour}"/>')
            out.append(
                f'<text x="{px(n) + 4:.1f}" y="{py(v) - 5:.1f}" font-size="8" fill="{colour}">'
                f'{v:.2f} (load {load[0]:.0f}-{load[1]:.0f})</text>'
            )
        legend.append((f"{d.get('label') or d['date']}", colour, ""))
    for j, (label, colour, dash) in enumerate(legend):
        ly = top + 10 + 16 * j
        ds = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<line x1="{width - right + 10}" y1="{ly}" x2="{width - right + 30}" y2="{ly}" stroke="{colour}" '
            f'stroke-width="2"{ds}/><text x="{width - right + 34}" y="{ly + 4}" font-size="10">'
            f'{escape(label)}</text>'
        )
    return "\n".join(out) + "\n</svg>\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path, nargs="+", help="staging-light result JSONs (benchmarks/staging/light.py)")
    ap.add_argument("--svg", type=Path, default=ROOT / "docs" / "staging-light.svg")
    a = ap.parse_args()
    svg = light_svg([json.loads(p.read_text()) for p in a.results])
    tmp = a.svg.with_name(a.svg.name + ".tmp")
    tmp.write_text(svg)
    os.replace(tmp, a.svg)
    print(a.svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
