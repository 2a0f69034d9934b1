"""The self-contained HTML report: tables and inline SVG trend charts, no external assets.

Rendered from ``clusterctl/templates/report.html.j2`` with autoescaping; the
only markup not escaped is the SVG built by :mod:`clusterctl.report.svg`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from clusterctl.diagnose.findings import Severity
from clusterctl.report.findings import group, summary
from clusterctl.report.history import History
from clusterctl.report.svg import MAX_POINTS, line_chart, plain
from clusterctl.report import overview as ov
from clusterctl.report.run import host_summary, tp_groups

if TYPE_CHECKING:
    from clusterctl.report.run import Result

#: Days of history the trend charts show.
TREND_DAYS = 35.0


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("clusterctl", "templates"),
        autoescape=select_autoescape(["j2", "html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["utc"] = _utc
    return env


def _pct(v: float) -> str:
    return f"{100 * v:.3g}%"


def _gib(v: float) -> str:
    return f"{v / 2**30:.3g} GiB"


def _ms(v: float) -> str:
    return f"{1000 * v:.3g} ms"


def _per_s(v: float) -> str:
    return f"{plain(v)}/s"


#: Metric name -> (chart title, y-axis label format), in the order the report shows them.
#: Metrics not listed get a chart titled with their name after these.
CHARTS: dict[str, tuple[str, Callable[[float], str]]] = {
    "gpu_memory_used_bytes": ("GPU memory used", _gib),
    "gpu_utilization_ratio": ("GPU utilisation", _pct),
    "vllm_kv_cache_usage_ratio": ("KV-cache usage per instance", _pct),
    "vllm_requests_waiting": ("Queue length (requests waiting) per instance", plain),
    "roce_paused_ratio": ("RoCE: fraction of time paused (PFC) per NIC", _pct),
    "roce_cnp_per_second": ("RoCE: CNP rate per NIC", _per_s),
    "bench_ttft_p50_seconds": ("TTFT of the last bench, median", _ms),
    "bench_ttft_p99_seconds": ("TTFT of the last bench, p99", _ms),
    "drift_exact_match_ratio": ("Drift: exact-match rate against the baseline", _pct),
    "drift_mean_kl": ("Drift: mean KL against the baseline (nats)", plain),
    "leak_sightings": ("Context-leak check: cross-session sightings", plain),
}

#: Lines per chart before they are averaged per host (a legend of more is unreadable).
MAX_LINES = 12

SEVERITY_COLOURS = {"CRIT": "#d62728", "WARN": "#ff9f0e", "UNKNOWN": "#9467bd"}


def charts(hist: History, *, now: float, days: float = TREND_DAYS, pattern: str | None = None) -> list[Markup]:
    """Problems per run by severity (runs of ``pattern`` only, when given), then one chart per
    recorded metric: one line per host/subject, or per host (mean) when more than :data:`MAX_LINES`;
    averaged by SQLite into at most :data:`~clusterctl.report.svg.MAX_POINTS` time slices."""
    since = now - days * 86400.0
    sev = hist.severity_series(since=since, pattern=pattern)
    out = [
        Markup(
            line_chart(
                "Problems per run",
                {name: [(t, float(c.get(name, 0))) for t, c in sev] for name in ("CRIT", "WARN", "UNKNOWN")},
                colours=SEVERITY_COLOURS,
            )
        )
    ]
    names = hist.metric_names(since=since)
    for name in [n for n in CHARTS if n in names] + [n for n in names if n not in CHARTS]:
        title, fmt = CHARTS.get(name, (name, plain))
        hosts = hist.series_hosts(name, since=since)
        if len(hosts) > MAX_LINES:  # a line per host is unreadable: the spread across every series
            s = hist.series_buckets(name, since=since, buckets=MAX_POINTS)
            out.append(
                Markup(
                    line_chart(
                        f"{title} (median, p90, max of {sum(hosts.values())} series on {len(hosts)} hosts)",
                        spread(s),
                        fmt=fmt,
                        colours=SPREAD_COLOURS,
                    )
                )
            )
            continue
        per_host = sum(hosts.values()) > MAX_LINES
        s = hist.series_buckets(name, since=since, buckets=MAX_POINTS, per_host=per_host)
        lines = {
            (f"{h} (mean of {hosts.get(h, 0)})" if per_host else h if subj == "host" else f"{h} {subj}"): v
            for (h, subj), v in s.items()
        }
        out.append(Markup(line_chart(title, lines, fmt=fmt)))
    return out


SPREAD_COLOURS = {"median": "#1f77b4", "p90": "#ff7f0e", "max": "#d62728"}


def spread(
    series: dict[tuple[str, str], list[tuple[float, float]]], buckets: int = MAX_POINTS
) -> dict[str, list[tuple[float, float]]]:
    """Median, p90 and max across all ``series`` per time slice (for charts of many hosts)."""
    pts = [p for v in series.values() for p in v]
    if not pts:
        return {}
    t0, t1 = min(t for t, _ in pts), max(t for t, _ in pts)
    width = (t1 - t0) / buckets or 1.0
    slices: dict[int, list[float]] = {}
    times: dict[int, list[float]] = {}
    for t, v in pts:
        b = min(buckets - 1, int((t - t0) / width))
        slices.setdefault(b, []).append(v)
        times.setdefault(b, []).append(t)
    out: dict[str, list[tuple[float, float]]] = {"median": [], "p90": [], "max": []}
    for b in sorted(slices):
        vs = sorted(slices[b])
        t = sum(times[b]) / len(times[b])
        out["median"].append((t, vs[len(vs) // 2]))
        out["p90"].append((t, vs[min(len(vs) - 1, int(0.9 * len(vs)))]))
        out["max"].append((t, vs[-1]))
    return out


#: Load shown on the overview's heatmaps: metric per cell kind, and its label.
LOADS = {
    "gpu": ("gpu_utilization_ratio", "GPU utilisation", 1.0),
    "nic": ("roce_paused_ratio", "fraction of time paused (PFC)", 0.2),
}  # darkest at 20%: paused_fraction_warn of checks/roce.yaml
#: Tables longer than this start collapsed (their <details> closed).
OPEN_ROWS = 20


def overview(result: "Result", hist: History) -> dict[str, Any]:
    """Heatmaps (hosts x GPUs, hosts x NICs; by worst finding and by load) and top offenders."""
    loads = {k: hist.run_values(result.run_id, metric) for k, (metric, _, _) in LOADS.items()}
    g = ov.grids(result.findings, loads)
    maps = []
    for k, label in (("gpu", "GPU"), ("nic", "data NIC")):
        if g[k].cells:
            maps.append(
                Markup(ov.heatmap(f"Hosts x {label}s: worst finding ({g[k].cells} {label}s)", g[k], by="severity"))
            )
            maps.append(Markup(ov.heatmap(f"Hosts x {label}s: {LOADS[k][1]}", g[k], by="load", scale=LOADS[k][2])))
    return {
        "heatmaps": maps,
        "top_hosts": ov.top_hosts(host_summary(result.findings)),
        "top_problems": ov.top_problems(result.findings),
        "gpus": g["gpu"].cells,
        "nics": g["nic"].cells,
    }


def render_html(result: "Result", hist: History, extra_charts: Sequence[str] = ()) -> str:
    """The report page for ``result`` with trends from ``hist`` (and ``extra_charts``: SVGs made
    here, e.g. the autoscaler's replicas against load)."""
    ctx: dict[str, Any] = {
        "summary": summary(result.findings),
        "result": result,
        "stamp": _utc(result.started) + " UTC",
        "hosts": host_summary(result.findings),
        "change": result.change,
        "tp_groups": tp_groups(result.findings),
        "groups": group(result.findings, min_severity=Severity.UNKNOWN),
        "charts": charts(hist, now=result.finished, pattern=result.pattern) + [Markup(c) for c in extra_charts],
        "runs": hist.runs(limit=20),
        "overview": overview(result, hist),
        "open_rows": OPEN_ROWS,
    }
    return _env().get_template("report.html.j2").render(**ctx)
