"""Inline SVG line charts (no script, no external assets) for the HTML report."""

from __future__ import annotations

import time
from collections.abc import Callable
from html import escape

#: Line colours, cycled; distinguishable in greyscale prints too (dashes alternate).
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


#: Points per line at most: 35 days of 5-minute runs are averaged into this many buckets.
MAX_POINTS = 300


def downsample(points: list[tuple[float, float]], n: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most ``n`` points: consecutive points averaged (time and value) in equal-count buckets."""
    if len(points) <= n:
        return points
    out = []
    for b in range(n):
        chunk = points[b * len(points) // n : (b + 1) * len(points) // n]
        out.append((sum(t for t, _ in chunk) / len(chunk), sum(v for _, v in chunk) / len(chunk)))
    return out


def plain(v: float) -> str:
    """An axis label: 3 significant digits, thousands as k, M, G (``3.02k``, never ``3.02e+03``)."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def _time_label(t: float, span_s: float) -> str:
    return time.strftime("%H:%M:%S" if span_s < 3600 else "%m-%d %H:%M", time.gmtime(t))


def line_chart(
    title: str,
    series: dict[str, list[tuple[float, float]]],
    *,
    unit: str = "",
    fmt: Callable[[float], str] = plain,
    colours: dict[str, str] | None = None,
    width: int = 580,
    height: int = 220,
) -> str:
    """An SVG chart of ``{label: [(unix time, value), ...]}`` (each line at most
    :data:`MAX_POINTS` points); an empty chart says "no data".

    ``fmt`` writes the y-axis labels (then ``unit`` is appended); ``colours``
    fixes a line's colour by label (e.g. severities), others cycle :data:`COLOURS`.
    """
    series = {k: downsample(v) for k, v in series.items()}
    pad_l, pad_r, pad_t, pad_b = 56, 140, 24, 28
    pts = [p for s in series.values() for p in s]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
        f'<text x="{pad_l}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>'
    )
    if not pts:
        return head + f'<text x="{pad_l}" y="{height // 2}" font-size="12" fill="#666">no data</text></svg>'
    t0, t1 = min(p[0] for p in pts), max(p[0] for p in pts)
    v1 = max(max(p[1] for p in pts), 0.0)
    v0 = min(min(p[1] for p in pts), 0.0)
    if v1 == v0:
        v1 = v0 + 1.0
    if t1 == t0:
        t1 = t0 + 1.0
    pw, ph = width - pad_l - pad_r, height - pad_t - pad_b

    def x(t: float) -> float:
        return pad_l + (t - t0) / (t1 - t0) * pw

    def y(v: float) -> float:
        return pad_t + ph - (v - v0) / (v1 - v0) * ph

    out = [head, f'<rect x="{pad_l}" y="{pad_t}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>']
    for v in (v0, (v0 + v1) / 2, v1):
        out.append(
            f'<text x="{pad_l - 4}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end">{escape(fmt(v) + unit)}</text>'
        )
    for t, anchor in ((t0, "start"), (t1, "end")):
        out.append(
            f'<text x="{x(t):.1f}" y="{height - 8}" font-size="10" text-anchor="{anchor}">'
            f'{_time_label(t, t1 - t0)}</text>'
        )
    for i, (label, s) in enumerate(sorted(series.items())):
        c = (colours or {}).get(label) or COLOURS[i % len(COLOURS)]
        dash = "" if (i // len(COLOURS)) % 2 == 0 else ' stroke-dasharray="4 2"'
        coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in s)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5"{dash} points="{coords}"/>')
        if len(s) == 1:
            out.append(f'<circle cx="{x(s[0][0]):.1f}" cy="{y(s[0][1]):.1f}" r="2.5" fill="{c}"/>')
        if i < 12:
            ly = pad_t + 12 * i + 8
            out.append(
                f'<line x1="{width - pad_r + 8}" y1="{ly}" x2="{width - pad_r + 22}" y2="{ly}" stroke="{c}" '
                f'stroke-width="2"{dash}/><text x="{width - pad_r + 26}" y="{ly + 4}" font-size="10">'
                f'{escape(label)}</text>'
            )
    return "".join(out) + "</svg>"
