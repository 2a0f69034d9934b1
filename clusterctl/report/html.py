"""The self-contained HTML report: tables and inline SVG trend charts, no external assets.

Rendered from ``clusterctl/templates/report.html.j2`` with autoescaping; the
only markup not escaped is the SVG built by :mod:`clusterctl.report.svg`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from clusterctl.diagnose.findings import Severity
from clusterctl.report.findings import group, summary
from clusterctl.report.history import History
from clusterctl.report.svg import line_chart

if TYPE_CHECKING:
    from clusterctl.report.run import Result

#: Days of history the trend charts show.
TREND_DAYS = 35.0


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _env() -> Environment:
    env = Environment(loader=PackageLoader("clusterctl", "templates"), autoescape=select_autoescape(["j2", "html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["utc"] = _utc
    return env


def charts(hist: History, *, now: float, days: float = TREND_DAYS) -> list[Markup]:
    """Problems per run by severity, then one chart per recorded metric (one line per host/subject)."""
    since = now - days * 86400.0
    sev = hist.severity_series(since=since)
    out = [Markup(line_chart("Problems per run", {
        name: [(t, float(c.get(name, 0))) for t, c in sev] for name in ("CRIT", "WARN", "UNKNOWN")}))]
    for name in hist.metric_names():
        s = hist.series(name, since=since)
        out.append(Markup(line_chart(name, {(h if subj == "host" else f"{h} {subj}"): v
                                            for (h, subj), v in s.items()})))
    return out


def render_html(result: "Result", hist: History) -> str:
    """The report page for ``result`` with trends from ``hist``."""
    from clusterctl.report.run import host_summary, tp_groups

    ctx: dict[str, Any] = {
        "summary": summary(result.findings), "result": result,
        "stamp": _utc(result.started) + " UTC",
        "hosts": host_summary(result.findings), "change": result.change, "tp_groups": tp_groups(result.findings),
        "groups": group(result.findings, min_severity=Severity.UNKNOWN),
        "charts": charts(hist, now=result.finished),
        "runs": hist.runs(limit=20),
    }
    return _env().get_template("report.html.j2").render(**ctx)
