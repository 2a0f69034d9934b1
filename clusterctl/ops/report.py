"""The report run's workflow (``clusterctl report run``): the checks, then the stored run.

:func:`passive` turns doctor's snapshot (:func:`clusterctl.ops.doctor.gather`) into the
analyzer registry's findings and the metrics the history keeps; :func:`active` runs the
active checks (drift, leak, bench) on the instances of the selected hosts, stored under
their own pattern; :func:`store` hands either to :func:`clusterctl.report.run.report_run`
(history, comparison, files, notification).  Errors are
:class:`~clusterctl.errors.ClusterctlError`; progress lines go to ``on_event``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from clusterctl.config import UserConfig
from clusterctl.diagnose.findings import Finding
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import Inventory
from clusterctl.ops.doctor import DoctorRequest, Gathered, OnEvent, gather
from clusterctl.report.history import Metric
from clusterctl.report.run import Options, Result
from clusterctl.deploy.state import resolve_state_dir
from clusterctl.diagnose.bundle import context
from clusterctl.diagnose.thresholds import check_file
from clusterctl.report.metrics import from_snapshot
from clusterctl.report.run import report_run


@dataclass
class Checked:
    """What one run checked: ``findings``, ``metrics``, ``meta``, and the ``pattern`` it is stored under."""

    findings: list[Finding]
    metrics: list[Metric]
    meta: dict[str, Any]
    pattern: str


def passive(request: DoctorRequest, gathered: Gathered) -> Checked:
    """Doctor's passive checks (every analyzer, ``request.acks`` applied) on the gathered snapshot."""
    from clusterctl.diagnose.doctor import diagnose

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
    from clusterctl.report.active import run_active, targets

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
