"""Render doctor findings without a terminal library.

:func:`group` gathers identical findings (same check, severity, subject,
message and action) across hosts into one row whose hosts are a node set
(``lab[01-04]``), worst severity first.  :func:`to_json`,
:func:`to_markdown` and :func:`to_prometheus` are the machine and document
formats; the rich table lives in the CLI.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable

from clusterctl.diagnose.findings import Finding, Severity, exit_code, worst
from clusterctl.inventory.nodeset import fold


@dataclass(frozen=True)
class Group:
    """Identical findings on several hosts; ``hosts`` is a node set ("" for cluster-wide)."""

    check: str
    severity: Severity
    subject: str
    message: str
    action: str
    hosts: str
    count: int
    evidence: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity.name,
            "hosts": self.hosts,
            "count": self.count,
            "subject": self.subject,
            "message": self.message,
            "action": self.action,
            "evidence": list(self.evidence),
        }


def group(findings: Iterable[Finding], min_severity: Severity = Severity.OK) -> list[Group]:
    """Identical findings folded; sorted CRIT, WARN, UNKNOWN, OK, then by check and subject."""
    buckets: dict[tuple[str, Severity, str, str, str], list[Finding]] = {}
    for f in findings:
        if f.severity.rank < min_severity.rank:
            continue
        buckets.setdefault((f.check, f.severity, f.subject, f.message, f.action), []).append(f)
    out = []
    for (check, sev, subject, message, action), fs in buckets.items():
        hosts = [f.host for f in fs if f.host]
        out.append(Group(check, sev, subject, message, action, fold(hosts) if hosts else "", len(fs), fs[0].evidence))
    return sorted(out, key=lambda g: (-g.severity.rank, g.check, g.subject, g.hosts))


def merge_checks(groups: list[Group]) -> list[Group]:
    """Groups that differ only in their check become one row naming the checks
    (``gpu.* (11 checks)``): one unreachable host is one row, not one per check."""
    merged: dict[tuple[Severity, str, str, str, str], list[Group]] = {}
    for g in groups:
        merged.setdefault((g.severity, g.subject, g.message, g.action, g.hosts), []).append(g)
    out = []
    for (sev, subject, message, action, hosts), gs in merged.items():
        checks = [g.check for g in gs]
        if len(checks) > 3:
            prefixes = sorted({c.split(".")[0] for c in checks})
            name = ", ".join(f"{p}.*" for p in prefixes) + f" ({len(checks)} checks)"
        else:
            name = ", ".join(checks)
        out.append(Group(name, sev, subject, message, action, hosts, sum(g.count for g in gs), gs[0].evidence))
    return out


def summary(findings: list[Finding]) -> dict[str, Any]:
    """Counts per severity, the worst severity and the exit code."""
    counts = {s.name: 0 for s in Severity}
    for f in findings:
        counts[f.severity.name] += 1
    return {"worst": worst(findings).name, "exit_code": exit_code(findings), "counts": counts}


def to_json(findings: list[Finding], *, meta: dict[str, Any] | None = None) -> str:
    """``{summary, groups, findings, meta}`` as indented JSON."""
    doc = {
        "summary": summary(findings),
        "groups": [g.to_json() for g in group(findings)],
        "findings": [f.to_json() for f in findings],
        "meta": meta or {},
    }
    return json.dumps(doc, indent=2)


#: Markdown punctuation escaped in a cell.  Brackets only where they would open a
#: link (``](``), so node sets such as ``gpu[01-03]`` stay readable in the raw text.
_MD_SPECIAL = re.compile(r"([\\`*|]|\](?=\())")
_MD_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def md_cell(text: str) -> str:
    """``text`` as inert Markdown inside a table cell: one line, no raw HTML, no markup.

    Host, instance and check names come from inventories and nodes: ``<script>``
    in one must stay text in whatever renders the report (issue 21).  ``&``,
    ``<`` and ``>`` become entities; Markdown's punctuation is backslash-escaped;
    control characters and line breaks become spaces.
    """
    one_line = "".join(ch if ch.isprintable() else " " for ch in str(text))
    escaped = _MD_SPECIAL.sub(r"\\\1", one_line)
    return "".join(_MD_HTML.get(ch, ch) for ch in escaped)


def to_markdown(findings: list[Finding], *, min_severity: Severity = Severity.OK) -> str:
    """A Markdown report: summary line, then one table row per group."""
    s = summary(findings)
    lines = [
        f"# clusterctl doctor: {s['worst']}",
        "",
        ", ".join(f"{n} {k}" for k, n in s["counts"].items() if n) or "no findings",
        "",
        "| severity | check | hosts | subject | finding | action |",
        "|---|---|---|---|---|---|",
    ]
    for g in group(findings, min_severity):
        lines.append(
            "| "
            + " | ".join(
                md_cell(x) for x in (g.severity.name, g.check, g.hosts or "-", g.subject, g.message, g.action or "-")
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def to_prometheus(findings: list[Finding]) -> str:
    """Prometheus text exposition (for node_exporter's textfile collector).

    ``clusterctl_doctor_finding{check,host,subject,severity}`` counts the findings
    that are not OK with those labels (two XIDs on one GPU are one series with
    value 2: a label set appears once, as the format requires);
    ``clusterctl_doctor_check_severity{check,host}`` is the worst
    severity code (0 OK, 1 WARN, 2 CRIT, 3 UNKNOWN) per check and host;
    ``clusterctl_doctor_exit_code`` the run's exit code.
    """
    out = [
        "# HELP clusterctl_doctor_finding Findings that are not OK with these labels (0 series while none).",
        "# TYPE clusterctl_doctor_finding gauge",
    ]
    worst_of: dict[tuple[str, str], Severity] = {}
    present: dict[tuple[str, str, str, str], int] = {}
    for f in findings:
        key = (f.check, f.host or "")
        if key not in worst_of or f.severity.rank > worst_of[key].rank:
            worst_of[key] = f.severity
        if f.severity != Severity.OK:
            labels = (_label(f.check), _label(f.host or ""), _label(f.subject), f.severity.name)
            present[labels] = present.get(labels, 0) + 1
    out += [
        f'clusterctl_doctor_finding{{check="{c}",host="{h}",subject="{s}",severity="{sev}"}} {n}'
        for (c, h, s, sev), n in present.items()
    ]
    out += [
        "# HELP clusterctl_doctor_check_severity Worst severity per check and host (0 OK 1 WARN 2 CRIT 3 UNKNOWN).",
        "# TYPE clusterctl_doctor_check_severity gauge",
    ]
    out += [
        f'clusterctl_doctor_check_severity{{check="{_label(c)}",host="{_label(h)}"}} {int(s)}'
        for (c, h), s in sorted(worst_of.items())
    ]
    out += [
        "# HELP clusterctl_doctor_exit_code Exit code of the doctor run.",
        "# TYPE clusterctl_doctor_exit_code gauge",
        f"clusterctl_doctor_exit_code {exit_code(findings)}",
    ]
    return "\n".join(out) + "\n"
