"""One report run, independent of how its findings were gathered.

:func:`report_run` takes the lock, compares the findings with the previous
run, stores the run, prunes old runs, writes the report files (JSON,
Markdown, HTML, textfile) and notifies; the CLI only gathers findings.
Exit code as doctor: the worst finding (0 OK, 1 WARN, 2 CRIT, 3 UNKNOWN).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from clusterctl.diagnose.findings import Finding, Severity, exit_code, worst
from clusterctl.files import RunLock, write_atomic
from clusterctl.report import notify as notify_mod
from clusterctl.report.diff import Diff, diff
from clusterctl.report.findings import md_cell, summary
from clusterctl.report.history import DEFAULT_RETENTION_DAYS, History, Metric
from clusterctl.report.textfile import render as render_textfile
from clusterctl.autoscale.chart import charts
from clusterctl.autoscale.record import read_history


@dataclass
class Options:
    """What a run writes: ``out_dir`` gets report.{json,md,html}; ``textfile`` a .prom file."""

    db: Path
    pattern: str = "all"
    out_dir: Path | None = None
    textfile: Path | None = None
    notify_cmd: str | None = None
    renotify_s: float = 6 * 3600.0
    retention_days: float = DEFAULT_RETENTION_DAYS
    lock_wait_s: float = 0.0
    html: bool = True
    #: the deploy state directory: its autoscaler decisions are charted (replicas against load)
    state_dir: Path | None = None


@dataclass
class Result:
    run_id: int
    previous_id: int | None
    findings: list[Finding]
    change: Diff
    started: float
    finished: float
    pruned: int
    notified: bool = False
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    pattern: str = "all"
    #: the cluster whose state (history, acks) this run used (``meta["cluster"]``); "" when not keyed
    cluster: str = ""

    @property
    def exit_code(self) -> int:
        return exit_code(self.findings)


def host_summary(findings: list[Finding]) -> list[dict[str, Any]]:
    """One row per host: worst severity, problem count and the worst problem's message."""
    rows: dict[str, dict[str, Any]] = {}
    for f in findings:
        host = f.host or "(cluster)"
        row = rows.setdefault(host, {"host": host, "worst": Severity.OK, "problems": 0, "top": ""})
        if f.severity != Severity.OK:
            row["problems"] += 1
        if f.severity.rank > row["worst"].rank or (not row["top"] and f.severity != Severity.OK):
            row["worst"] = f.severity if f.severity.rank > row["worst"].rank else row["worst"]
            row["top"] = f"{f.check} {f.subject}: {f.message}" if f.severity != Severity.OK else row["top"]
    out = sorted(rows.values(), key=lambda r: (-r["worst"].rank, r["host"]))
    return [{**r, "worst": r["worst"].name} for r in out]


_TP_STATE = {Severity.OK: "OK", Severity.WARN: "DEGRADED", Severity.CRIT: "UNAVAILABLE", Severity.UNKNOWN: "UNKNOWN"}


def tp_groups(findings: list[Finding]) -> list[dict[str, str]]:
    """Each instance's TP-group state from the ``tp.group`` findings: OK, DEGRADED, UNAVAILABLE or UNKNOWN."""
    return sorted(
        (
            {"instance": f.subject.split(":", 1)[1], "state": _TP_STATE[f.severity], "message": f.message}
            for f in findings
            if f.check == "tp.group" and f.subject.startswith("tp-group:")
        ),
        key=lambda g: g["instance"],
    )


def to_json(result: Result, meta: dict[str, Any] | None = None) -> str:
    doc = {
        "run": {
            "id": result.run_id,
            "previous": result.previous_id,
            "started": result.started,
            "finished": result.finished,
            "exit_code": result.exit_code,
            "pruned": result.pruned,
            "notified": result.notified,
        },
        "summary": summary(result.findings),
        "hosts": host_summary(result.findings),
        "tp_groups": tp_groups(result.findings),
        "changes": result.change.to_json(),
        "findings": [f.to_json() for f in result.findings],
        "warnings": result.warnings,
        "meta": meta or {},
    }
    return json.dumps(doc, indent=2, default=str)


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def to_markdown(result: Result) -> str:
    s = summary(result.findings)
    lines = [
        f"# clusterctl report: {s['worst']}",
        "",
        (f"Cluster {md_cell(result.cluster)}. " if result.cluster else "")
        + f"Run {result.run_id} at {_stamp(result.started)}"
        + (f", compared with run {result.previous_id}" if result.previous_id else " (first run)")
        + ".",
        "",
        "## Hosts",
        "",
        "| host | worst | problems | top problem |",
        "|---|---|---|---|",
    ]
    for r in host_summary(result.findings):
        lines.append(f"| {md_cell(r['host'])} | {r['worst']} | {r['problems']} | {md_cell(r['top']) or '-'} |")
    groups = tp_groups(result.findings)
    if groups:
        lines += ["", "## TP groups", "", "| instance | state | detail |", "|---|---|---|"]
        lines += [f"| {md_cell(g['instance'])} | {g['state']} | {md_cell(g['message'])} |" for g in groups]
    for title, fs in (
        ("New", result.change.new),
        ("Resolved", result.change.resolved),
        ("Ongoing", result.change.ongoing),
    ):
        lines += ["", f"## {title} ({len(fs)})", ""]
        if not fs:
            lines.append("none")
            continue
        lines += ["| severity | host | check | subject | finding |", "|---|---|---|---|---|"]
        lines += [
            f"| {f.severity.name} | {md_cell(f.host or '-')} | {md_cell(f.check)} | {md_cell(f.subject)} | {md_cell(f.message)} |"
            for f in fs
        ]
    return "\n".join(lines) + "\n"


def report_run(
    findings: list[Finding],
    opts: Options,
    *,
    started: float,
    metrics: Iterable[Metric] = (),
    meta: dict[str, Any] | None = None,
    now: float | None = None,
) -> Result:
    """Store, compare, write and notify under the run lock (see the module docstring).

    Raises :class:`clusterctl.files.LockBusy` when another run holds
    the lock longer than ``opts.lock_wait_s``.
    """
    db = Path(opts.db)
    with RunLock(db.with_name(db.name + ".lock"), wait_s=opts.lock_wait_s), History(db) as hist:
        prev = hist.last_run(pattern=opts.pattern)
        previous = hist.findings(prev.id) if prev else None
        change = diff(previous, findings)
        finished = time.time() if now is None else now
        run_id = hist.record(
            findings, started=started, finished=finished, pattern=opts.pattern, metrics=list(metrics), meta=meta
        )
        pruned = hist.prune(opts.retention_days, now=finished)
        result = Result(
            run_id,
            prev.id if prev else None,
            findings,
            change,
            started,
            finished,
            pruned,
            pattern=opts.pattern,
            cluster=str((meta or {}).get("cluster") or ""),
        )
        if opts.out_dir is not None:
            out = Path(opts.out_dir)
            write_atomic(out / "report.json", to_json(result, meta) + "\n")
            write_atomic(out / "report.md", to_markdown(result))
            result.files += [str(out / "report.json"), str(out / "report.md")]
            if opts.html:
                from clusterctl.report.html import render_html

                write_atomic(
                    out / "report.html", render_html(result, hist, extra_charts=_autoscale_charts(opts, finished))
                )
                result.files.append(str(out / "report.html"))
        if opts.textfile is not None:
            write_atomic(
                opts.textfile,
                render_textfile(findings, change, finished=finished, duration_s=max(0.0, finished - started)),
            )
            result.files.append(str(opts.textfile))
        if opts.notify_cmd:
            d = notify_mod.decide(
                change,
                findings,
                hist.notified(),
                now=finished,
                renotify_s=opts.renotify_s,
                run={"id": run_id, "exit_code": result.exit_code, "worst": worst(findings).name},
            )
            if d.send:
                err = notify_mod.run_notify(opts.notify_cmd, d.payload)
                if err:
                    result.warnings.append(err)
                else:
                    result.notified = True
            if not d.send or result.notified:
                hist.set_notified(d.state)
    return result


def _autoscale_charts(opts: Options, now: float) -> list[str]:
    """Replicas against load for every autoscaled template of the last trend window (none without
    decisions)."""
    if opts.state_dir is None:
        return []
    from clusterctl.report.html import TREND_DAYS

    return charts(read_history(opts.state_dir, since=now - TREND_DAYS * 86400.0))
