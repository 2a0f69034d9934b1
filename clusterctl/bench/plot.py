"""SVG plot of a bench run: TTFT and output throughput against concurrency (no dependencies).

Two panels side by side, each with one tick per measured level on a log2
concurrency axis (1, 8, 64... spread evenly); TTFT shows mean and p99 in ms,
throughput output tokens per second.  With two runs (``--compare``) each
series is drawn for A and B.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from clusterctl.report.svg import COLOURS, plain

Series = dict[str, list[tuple[int, float]]]


def _panel(title: str, series: Series, ox: int, w: int, h: int) -> list[str]:
    """One chart at x offset ``ox``: axes, a tick per concurrency level, a polyline and dots per series."""
    left, top, bottom = 52, 22, 34
    pw, ph = w - left - 12, h - top - bottom
    levels = sorted({c for s in series.values() for c, _ in s})
    vals = [v for s in series.values() for _, v in s if not math.isnan(v)]
    out = [
        f'<text x="{ox + left}" y="15" font-size="13" font-weight="bold">{escape(title)}</text>',
        f'<rect x="{ox + left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>',
    ]
    if not levels or not vals:
        return out + [f'<text x="{ox + left + 8}" y="{top + ph // 2}" font-size="12" fill="#666">no data</text>']
    lo, hi = math.log2(levels[0]), math.log2(levels[-1])
    vmax = max(vals) * 1.1 or 1.0

    def px(c: int) -> float:
        return ox + left + (0.5 if hi == lo else (math.log2(c) - lo) / (hi - lo)) * pw

    def py(v: float) -> float:
        return top + ph - v / vmax * ph

    for c in levels:
        out.append(f'<text x="{px(c):.1f}" y="{top + ph + 13}" font-size="10" text-anchor="middle">{c}</text>')
    out.append(f'<text x="{ox + left + pw / 2:.1f}" y="{h - 4}" font-size="10" text-anchor="middle">concurrency</text>')
    for v in (0.0, vmax / 2, vmax):
        out.append(
            f'<text x="{ox + left - 4}" y="{py(v) + 4:.1f}" font-size="10" text-anchor="end">{escape(plain(v))}</text>'
        )
    for i, (label, pts) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        good = [(c, v) for c, v in pts if not math.isnan(v)]
        out.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="'
            + " ".join(f"{px(c):.1f},{py(v):.1f}" for c, v in good)
            + '"/>'
        )
        out += [f'<circle cx="{px(c):.1f}" cy="{py(v):.1f}" r="2.5" fill="{colour}"/>' for c, v in good]
        out.append(
            f'<text x="{ox + left + 6}" y="{top + 12 + 12 * i}" font-size="10" fill="{colour}">{escape(label)}</text>'
        )
    return out


def bench_svg(runs: dict[str, list[dict[str, Any]]], width: int = 760, height: int = 260) -> str:
    """The plot of ``{run label: [level report, ...]}`` (reports as :func:`~clusterctl.bench.stats.aggregate`
    returns them; the label is dropped when there is one run)."""
    ttft: Series = {}
    tput: Series = {}
    for label, reports in runs.items():
        prefix = f"{label} " if len(runs) > 1 else ""
        for stat in ("mean", "p99"):
            ttft[f"{prefix}TTFT {stat}"] = [(r["concurrency"], float(r["ttft_ms"][stat])) for r in reports]
        tput[f"{prefix}output tok/s"] = [(r["concurrency"], float(r["output_throughput"])) for r in reports]
    half = width // 2
    body = _panel("TTFT (ms)", ttft, 0, half, height) + _panel(
        "Output throughput (tokens/s)", tput, half, width - half, height
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="bench: TTFT and throughput against concurrency">'
        + "".join(body)
        + "</svg>\n"
    )
