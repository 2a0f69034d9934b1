"""The doctor workflow: facts from the hosts (or a bundle), then findings merged from every source.

:func:`run_doctor` takes a :class:`DoctorRequest` (parsed and loaded by the CLI)
and returns a :class:`DoctorRun`: the findings of the analyzer registry
(``diagnose.doctor.diagnose``), of the RDMA bandwidth test (``diagnose.active``,
``--active``) and of the checks that send requests to the instances
(``drift.doctor_checks``: drift, leak), with the run's meta.  :func:`gather` is
its first half (the snapshot alone: ``doctor --learn``, ``collect``, ``report
run``).  Progress and warnings go to ``on_event`` as :class:`DoctorEvent`;
errors are :class:`~clusterctl.errors.ClusterctlError`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from clusterctl.config import UserConfig
from clusterctl.diagnose.bundle import Snapshot
from clusterctl.diagnose.findings import Finding
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.results import HostResult, HostStatus
from clusterctl.inventory.model import Host, Inventory
from clusterctl.deploy.placement.deployed import with_replicas as placed
from clusterctl.diagnose.active import active_findings as bandwidth, fleet_runner
from clusterctl.diagnose.bundle import context, gather as gather_hosts, only_hosts
from clusterctl.diagnose.current import HISTORY
from clusterctl.drift import doctor_checks
from clusterctl.fleet.factory import make_fleet
from clusterctl.inventory.loader import load_inventory as load
from clusterctl.inventory.nodeset import expand
from clusterctl.inventory.select import select_hosts


@dataclass(frozen=True)
class Probe:
    """How live hosts are probed (doctor's options)."""

    interval: float = 2.0
    timeout: float = 60.0
    fanout: Optional[int] = None
    connect_timeout: Optional[float] = None
    deadline: Optional[float] = None
    sudo: bool = False
    become_password: Optional[str] = field(default=None, repr=False)  # never in a repr or log
    host_key_policy: Optional[str] = None  # already checked (None: each host's own)
    raw_outputs: bool = False


@dataclass
class DoctorRequest:
    """One doctor run.  Live: ``inventory`` (with its replicas), ``inventory_path`` and the
    selected ``hosts``.  Bundle: ``bundle`` (path) and ``bundle_host``; the bundle's own
    inventory is read unless ``load_inventory`` (the ``-i`` file, loaded after the bundle) is given."""

    cfg: UserConfig
    thresholds: dict[str, Any]
    pattern: str = "all"
    inventory: Optional[Inventory] = None
    inventory_path: Optional[str] = None
    hosts: list[Host] = field(default_factory=list)
    bundle: Optional[str] = None
    bundle_host: Optional[str] = None
    load_inventory: Optional[Callable[[], Inventory]] = None  # the -i inventory, as deployed
    checks: Optional[list[str]] = None  # analyzer checks (None: all)
    live_checks: list[str] = field(default_factory=list)  # drift, leak: requests to the instances
    since: Optional[float] = None  # epoch seconds of --since
    since_text: Optional[str] = None
    acks: list[dict[str, Any]] = field(default_factory=list)
    active: bool = False  # ib_write_bw between host pairs
    probe: Probe = field(default_factory=Probe)


@dataclass(frozen=True)
class DoctorEvent:
    """``probe-start`` (``count`` hosts), ``host`` (``result``), ``note`` and ``warning``
    (``text``), ``probe-end``."""

    kind: str
    text: str = ""
    count: int = 0
    result: Optional[HostResult] = None


OnEvent = Callable[[DoctorEvent], None]


@dataclass
class Gathered:
    """The snapshot a run looked at, its inventory (None: a bundle without one) and when it began."""

    snapshot: Snapshot
    inventory: Optional[Inventory]
    started: float  # time.monotonic()


@dataclass
class DoctorRun:
    findings: list[Finding]
    meta: dict[str, Any]
    gathered: Gathered


def _ignore(_e: DoctorEvent) -> None:
    pass


def with_replicas(inv: Inventory, cfg: UserConfig) -> Inventory:
    """The inventory as deployed (template replicas placed), as doctor and report read it."""
    return placed(inv, cfg=cfg)


def live_snapshot(request: DoctorRequest, on_event: OnEvent = _ignore) -> Snapshot:
    """One snapshot of ``request.hosts`` over SSH; per-host progress and fleet warnings as events."""
    p = request.probe
    fleet = make_fleet(
        request.hosts,
        request.cfg,
        fanout=p.fanout,
        connect_timeout=p.connect_timeout,
        command_timeout=p.timeout + p.interval,
        deadline=p.deadline,
        become_password=p.become_password,
        host_key_policy=p.host_key_policy,
    )

    def as_row(r: Any) -> HostResult:
        status = HostStatus.OK if r.ok else HostStatus(r.fleet_status if r.fleet_status != "ok" else "error")
        return HostResult(r.host, status, duration_s=r.duration_s, error=r.reason)

    on_event(DoctorEvent("probe-start", count=len(request.hosts)))
    try:
        with fleet:
            snap = gather_hosts(
                fleet,
                request.inventory,
                request.hosts,
                interval_s=p.interval,
                timeout=p.timeout,
                sudo=p.sudo,
                on_facts=lambda r: on_event(DoctorEvent("host", result=as_row(r))),
                raw_outputs=p.raw_outputs,
                on_event=lambda s: on_event(DoctorEvent("note", s)),
            )
    finally:
        on_event(DoctorEvent("probe-end"))
    for w in fleet.warnings:
        on_event(DoctorEvent("warning", w))
    return snap


def read_bundle(request: DoctorRequest) -> tuple[Snapshot, Optional[Inventory]]:
    """``(snapshot, inventory or None)`` of ``request.bundle``; the ``-i`` inventory beats the bundle's."""
    from clusterctl.diagnose.bundle import read_bundle as read

    assert request.bundle is not None
    snap, inv_path = read(request.bundle, host=request.bundle_host)
    if request.load_inventory is not None:
        return snap, request.load_inventory()
    return snap, with_replicas(load(inv_path), request.cfg) if inv_path else None


def bundle_hosts(snap: Snapshot, inv: Optional[Inventory], pattern: str) -> Snapshot:
    """The bundle's hosts that ``pattern`` selects (inventory syntax when the bundle has one)."""
    names = {h.name for h in select_hosts(inv, pattern)} if inv is not None else set(expand(pattern))
    kept = only_hosts(snap, names)
    if not (kept.facts or kept.raw or kept.missing):
        raise ClusterctlError(f"pattern {pattern!r} selects no host of the bundle")
    return kept


def gather(request: DoctorRequest, on_event: OnEvent = _ignore) -> Gathered:
    """The snapshot of a run: the bundle's selected hosts, or the live hosts."""
    started = time.monotonic()
    if request.bundle:
        snap, inv = read_bundle(request)
        if request.pattern != "all":
            snap = bundle_hosts(snap, inv, request.pattern)
        return Gathered(snap, inv, started)
    return Gathered(live_snapshot(request, on_event), request.inventory, started)


def settled_counts(findings: list[Finding]) -> dict[str, int]:
    """How many rows are acknowledged and how many are history (both OK rows, not counted)."""
    return {
        "acknowledged": sum(f.message.startswith("acknowledged until ") for f in findings),
        "history": sum(f.message.startswith(HISTORY) for f in findings),
    }


def run_doctor(request: DoctorRequest, on_event: OnEvent = _ignore, gathered: Optional[Gathered] = None) -> DoctorRun:
    """Findings of every source on the snapshot (gathered here unless given), and the run's meta."""
    from clusterctl.diagnose.doctor import diagnose

    got = gathered if gathered is not None else gather(request, on_event)
    snap, inv = got.snapshot, got.inventory
    if request.bundle:
        meta: dict[str, Any] = {"source": str(Path(request.bundle)), "bundle": snap.meta}
    else:
        meta = {"inventory": request.inventory_path, "pattern": request.pattern, **snap.meta}
    thresholds = request.thresholds
    findings = diagnose(context(snap, inv, thresholds), request.checks, since=request.since, acks=request.acks)
    if request.active:
        findings += active_findings(request, snap, inv)
    requested = request.live_checks
    if requested:  # refused on a bundle by the CLI: live hosts always have their inventory
        assert inv is not None

        findings += doctor_checks.run(
            inv, set(snap.facts) | set(snap.missing), requested, timeout=min(request.probe.timeout, 30)
        )
    selected = request.checks
    meta["duration_s"] = round(time.monotonic() - got.started, 3)
    meta["checks"] = (selected or ["all"]) + requested if requested else (selected or "all")
    meta.update(settled_counts(findings), since=request.since_text)
    return DoctorRun(findings, meta, got)


def active_findings(request: DoctorRequest, snap: Snapshot, inv: Optional[Inventory]) -> list[Finding]:
    """``doctor --active``: ib_write_bw between pairs of the probed hosts (docs/doctor-roce.md)."""
    live = not request.bundle
    thresholds, p = request.thresholds, request.probe
    hosts = [inv.hosts[h] for h in snap.facts if live and inv is not None and h in inv.hosts]
    if not hosts:
        return bandwidth(snap.facts, snap.missing, live=live, inventory=inv, thresholds=thresholds)
    width = p.fanout or request.cfg.fanout
    fleet = make_fleet(
        hosts,
        request.cfg,
        fanout=width,
        connect_timeout=p.connect_timeout,
        command_timeout=60,
        host_key_policy=p.host_key_policy,
    )
    with fleet:
        return bandwidth(
            snap.facts,
            snap.missing,
            live=live,
            inventory=inv,
            runner=fleet_runner(fleet),
            addresses={h.name: h.address for h in hosts},
            thresholds=thresholds,
            max_pairs=max(1, width // 2),
        )
