"""node_exporter textfile-collector output, written atomically.

node_exporter reads ``*.prom`` files in its ``--collector.textfile.directory``;
a file it reads half-written is an error there, so the text goes to a
temporary file in the same directory (not ending in ``.prom``) that is
renamed over the target (:func:`clusterctl.files.write_atomic`).
"""

from __future__ import annotations

from clusterctl.diagnose.findings import Finding
from clusterctl.report.diff import Diff
from clusterctl.report.findings import to_prometheus


def render(findings: list[Finding], change: Diff, *, finished: float, duration_s: float) -> str:
    """The doctor metrics plus the run's own: problems new/ongoing/resolved, last run time and duration."""
    out = [to_prometheus(findings).rstrip("\n")]
    out += [
        "# HELP clusterctl_report_problems Problems (findings that are not OK) by state since the last run.",
        "# TYPE clusterctl_report_problems gauge",
    ]
    for state in ("new", "ongoing", "resolved"):
        out.append(f'clusterctl_report_problems{{state="{state}"}} {len(getattr(change, state))}')
    out += [
        "# HELP clusterctl_report_last_run_timestamp_seconds When the last report run finished (Unix time).",
        "# TYPE clusterctl_report_last_run_timestamp_seconds gauge",
        f"clusterctl_report_last_run_timestamp_seconds {finished:.3f}",
        "# HELP clusterctl_report_duration_seconds How long the last report run took.",
        "# TYPE clusterctl_report_duration_seconds gauge",
        f"clusterctl_report_duration_seconds {duration_s:.3f}",
    ]
    return "\n".join(out) + "\n"
