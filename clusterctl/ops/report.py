"""The report run's workflow (``clusterctl report run``): the checks, then the stored run.

:func:`passive` turns doctor's snapshot (:func:`clusterctl.ops.doctor.gather`) into the
analyzer registry's findings and the metrics the history keeps; :func:`active` runs the
active checks (drift, leak, bench) on the instances of the selected hosts, stored under
their own pattern; :func:`store` hands either to :func:`clusterctl.report.run.report_run`
(history, comparison, files, notification).  Errors are
:class:`~clusterctl.errors.ClusterctlError`; progress lines go to ``on_event``.

The other report commands read or write what the runs leave: :func:`history_runs` and
:func:`trends` (the history database), :func:`timer_files` (``install-timer``'s units or cron
entry), :func:`file_sd` (Prometheus targets) and :func:`server` (``report serve``).  The CLI
parses the options, calls one of these and renders.
"""

from __future__ import annotations

import sys
import time
from http.server import ThreadingHTTPServer
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from clusterctl.config import UserConfig
from clusterctl.diagnose.findings import Finding
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import Inventory
from clusterctl.ops.doctor import DoctorRequest, Gathered, OnEvent, gather
from clusterctl.report.history import History, Metric, Run
from clusterctl.report.run import Options, Result, to_json, to_markdown
from clusterctl.deploy.placement.deployed import with_replicas
from clusterctl.deploy.state import resolve_state_dir
from clusterctl.diagnose.bundle import context
from clusterctl.diagnose.thresholds import check_file
from clusterctl.report.active import parse_kinds
from clusterctl.report.filesd import render as render_file_sd
from clusterctl.report.metrics import from_snapshot
from clusterctl.report.notify import parse_duration
from clusterctl.report.run import report_run
from clusterctl.report.schedule import Schedule, cron_line, service_unit, timer_unit
from clusterctl.report.serve import make_server
from clusterctl.report.active import run_active, targets
from clusterctl.diagnose.doctor import diagnose


@dataclass
class Checked:
    """What one run checked: ``findings``, ``metrics``, ``meta``, and the ``pattern`` it is stored under."""

    findings: list[Finding]
    metrics: list[Metric]
    meta: dict[str, Any]
    pattern: str


def passive(request: DoctorRequest, gathered: Gathered) -> Checked:
    """Doctor's passive checks (every analyzer, ``request.acks`` applied) on the gathered snapshot."""
    snap = gathered.snapshot
    findings = diagnose(context(snap, gathered.inventory, request.thresholds), None, acks=request.acks)
    meta: dict[str, Any] = {"source": request.bundle} if request.bundle else {"inventory": request.inventory_path}
    return Checked(findings, from_snapshot(snap.facts, snap.raw), meta, request.pattern)


def passive_run(
    request: DoctorRequest,
    on_event: Optional[OnEvent] = None,
    *,
    acks: Callable[[], list[dict[str, Any]]] = list,
) -> Checked:
    """The snapshot gathered (live hosts or a bundle), then ``acks()`` read (after the snapshot:
    reading a bundle's ``-i`` inventory binds the state of its cluster), then :func:`passive`."""
    got = gather(request, on_event) if on_event is not None else gather(request)
    return passive(replace(request, acks=acks()), got)


def active(
    inventory: Inventory,
    path: str,
    hosts: set[str],
    pattern: str,
    kinds: tuple[str, ...],
    *,
    timeout: float,
    on_event: Callable[[str], None] = lambda s: None,
) -> Checked:
    """The active checks on the instances placed on ``hosts``.

    The run is stored under the pattern ``PATTERN --active KINDS``, so it is compared
    with the previous active run, never with a passive one."""
    tgts = targets(inventory, hosts)
    if not tgts:
        raise ClusterctlError(
            f"{path}: no instance with a placement on the hosts {pattern!r} selects: nothing for --active to check"
        )
    outcome = run_active(
        tgts, kinds, thresholds=check_file("drift.yaml"), timeout=timeout, progress=lambda s: on_event(f"active: {s}")
    )
    for why in outcome.skipped:
        on_event(f"active: skipped {why}")
    meta = {
        "inventory": path,
        "active": list(kinds),
        "instances": [t.instance for t in tgts],
        "skipped": outcome.skipped,
    }
    return Checked(outcome.findings, outcome.metrics, meta, f"{pattern} --active {','.join(kinds)}")


def deploy_state_dir(cfg: UserConfig) -> Optional[Path]:
    """The deploy state directory (its autoscaler decisions are charted), ``None`` when unreadable."""
    try:
        return resolve_state_dir(None, cfg)
    except ClusterctlError:
        return None


def store(checked: Checked, opts: Options, *, started: float, meta: dict[str, Any]) -> Result:
    """The checked run stored, compared with the previous one of ``opts.pattern``, written out."""
    return report_run(checked.findings, opts, started=started, meta=meta, metrics=checked.metrics)


def renotify_seconds(text: str) -> float:
    """``--renotify`` (6h, 30m, 0: never) in seconds; a bad value raises naming the option."""
    try:
        return parse_duration(text)
    except ClusterctlError as e:
        raise ClusterctlError(f"--renotify: {e}") from None


def kinds(text: str) -> tuple[str, ...]:
    """``--active``'s checks (drift, leak, bench) checked; an unknown one raises."""
    return parse_kinds(text)


def db_path(db: Optional[str], cfg: UserConfig) -> Path:
    """The history database: ``--db``, else ``report.db`` in the state directory."""
    return Path(db) if db else Path(cfg.state_dir) / "report.db"


@dataclass(frozen=True)
class Outputs:
    """What ``report run`` writes and how it notifies (the command line's values)."""

    db: Optional[str] = None
    out: Optional[str] = None  # directory for report.json, report.md, report.html
    textfile: Optional[str] = None  # node_exporter .prom file
    notify_cmd: Optional[str] = None
    renotify_s: float = 6 * 3600.0
    retention_days: float = 35.0
    lock_wait_s: float = 0.0


def run_options(outputs: Outputs, pattern: str, cfg: UserConfig) -> Options:
    """The stored run's options (``report.run.Options``) for ``pattern``, in ``cfg``'s state."""
    return Options(
        db=db_path(outputs.db, cfg),
        pattern=pattern,
        out_dir=Path(outputs.out) if outputs.out else None,
        textfile=Path(outputs.textfile) if outputs.textfile else None,
        notify_cmd=outputs.notify_cmd,
        renotify_s=outputs.renotify_s,
        retention_days=outputs.retention_days,
        lock_wait_s=outputs.lock_wait_s,
        state_dir=deploy_state_dir(cfg),
    )


def store_run(checked: Checked, outputs: Outputs, cfg: UserConfig, *, started: float, meta: dict[str, Any]) -> Result:
    """:func:`store` with the options of ``outputs``; an OS error (an unwritable file) raises
    ``ClusterctlError`` naming the file."""
    try:
        return store(checked, run_options(outputs, checked.pattern, cfg), started=started, meta=meta)
    except OSError as e:
        raise ClusterctlError(f"{e.filename or ''}: {e.strerror}") from None


def rendered(result: Result, meta: dict[str, Any], fmt: str) -> Optional[str]:
    """What ``report run`` prints: ``json``, ``markdown``, or None (``none``)."""
    if fmt == "json":
        return to_json(result, meta) + "\n"
    if fmt == "markdown":
        return to_markdown(result)
    return None


def active_checks(
    inventory: Inventory,
    cfg: UserConfig,
    path: str,
    hosts: set[str],
    pattern: str,
    kinds_: tuple[str, ...],
    *,
    timeout: float,
    on_event: Callable[[str], None] = lambda s: None,
) -> Checked:
    """:func:`active` on the inventory as deployed (template replicas placed in ``cfg``'s state)."""
    return active(with_replicas(inventory, cfg=cfg), path, hosts, pattern, kinds_, timeout=timeout, on_event=on_event)


def _history(path: Path) -> History:
    if not path.exists():
        raise ClusterctlError(f"{path}: no report history yet (run `clusterctl report run` first)")
    return History(path)


def history_runs(path: Path, limit: int) -> list[Run]:
    """The latest ``limit`` runs of the history database at ``path``, newest first."""
    with _history(path) as h:
        return h.runs(limit)


@dataclass(frozen=True)
class Trends:
    """Problems per run (``runs``: (started, counts per severity)) and each recorded metric's
    latest, minimum and maximum per host and subject (``metrics`` rows)."""

    runs: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)


def trends(path: Path, days: float, now: Optional[float] = None) -> Trends:
    """The runs and metrics of the last ``days`` days (counted back from ``now``, default the clock)."""
    since = (time.time() if now is None else now) - days * 86400
    with _history(path) as h:
        sev = h.severity_series(since=since)
        metrics = {n: h.series(n, since=since) for n in h.metric_names()}
    rows = [
        {
            "metric": n,
            "host": host,
            "subject": subj,
            "latest": pts[-1][1],
            "min": min(v for _, v in pts),
            "max": max(v for _, v in pts),
            "samples": len(pts),
        }
        for n, s in metrics.items()
        for (host, subj), pts in sorted(s.items())
        if pts
    ]
    return Trends(list(sev), rows)


@dataclass(frozen=True)
class TimerRequest:
    """``report install-timer``: the run's pattern, inventory and outputs, and its schedule (every
    ``every`` minutes, or the systemd calendar time ``on_calendar``; daily for ``active`` checks)."""

    pattern: str = "all"
    inventory: Optional[str] = None
    db: str = "/var/lib/clusterctl/report.db"
    out: Optional[str] = None
    textfile: Optional[str] = None
    notify_cmd: Optional[str] = None
    every: int = 5
    active: Optional[str] = None
    on_calendar: Optional[str] = None
    cron: bool = False
    user: Optional[str] = None
    unit_dir: str = "/etc/systemd/system"
    cron_dir: str = "/etc/cron.d"


def timer_files(request: TimerRequest) -> dict[Path, str]:
    """The files that schedule ``report run`` (path -> text): a systemd service and timer, or a
    cron entry; raises on bad checks or schedule values."""
    r = request
    argv = [sys.executable, "-m", "clusterctl.cli.main", "report", "run", r.pattern, "--db", r.db]
    argv += ["--format", "none", "--lock-wait", "60"]
    if r.inventory:
        argv += ["-i", str(Path(r.inventory).resolve())]
    for flag, value in (("--out", r.out), ("--textfile", r.textfile), ("--notify-cmd", r.notify_cmd)):
        if value:
            argv += [flag, value]
    if r.active:
        argv += ["--active", ",".join(parse_kinds(r.active))]
    s = Schedule(
        tuple(argv),
        every_min=r.every,
        user=r.user,
        name="clusterctl-report-active" if r.active else "clusterctl-report",
        on_calendar=r.on_calendar or ("daily" if r.active else None),
    )
    if r.cron:
        return {Path(r.cron_dir) / s.name: cron_line(s)}
    return {
        Path(r.unit_dir) / f"{s.name}.service": service_unit(s),
        Path(r.unit_dir) / f"{s.name}.timer": timer_unit(s),
    }


def file_sd(inventory: Inventory, cfg: UserConfig) -> str:
    """The Prometheus file_sd target list of every instance of ``inventory`` as deployed (JSON)."""
    return render_file_sd(with_replicas(inventory, cfg=cfg))


def server(
    textfile: Optional[str], listen: str, port: int, *, out: Optional[str], db: Optional[str]
) -> ThreadingHTTPServer:
    """``report serve``'s HTTP server, bound (not yet serving); an OS error when it cannot listen."""
    return make_server(textfile, listen, port, out_dir=out, db=db)
