"""The doctor workflow: facts from the hosts (or a bundle), then findings merged from every source.

:func:`run_doctor` takes a :class:`DoctorRequest` (parsed and loaded by the CLI)
and returns a :class:`DoctorRun`: the findings of the analyzer registry
(``diagnose.doctor.diagnose``), of the RDMA bandwidth test (``diagnose.active``,
``--active``) and of the checks that send requests to the instances
(``drift.doctor_checks``: drift, leak), with the run's meta.  :func:`gather` is
its first half (the snapshot alone: ``doctor --learn``, ``collect``, ``report
run``).  Progress and warnings go to ``on_event`` as :class:`DoctorEvent`;
errors are :class:`~clusterctl.errors.ClusterctlError`.

The request is built here from what the command line gave: :func:`resolve` turns
:class:`DoctorOptions` (the ``--checks`` text, ``--baseline`` file, ``--since`` text ...)
into :class:`Resolved` (analyzer checks, live checks, thresholds, since), every bad
option a ``ClusterctlError`` naming it; :func:`live_request` and :func:`bundle_request`
add the hosts or the bundle and the acknowledgements (:func:`load_acks`).  The CLI
selects the hosts and reads the sudo password (its edge), calls one of these and renders.
:func:`learn` is ``doctor --learn``; :func:`list_acks`, :func:`add_ack` and
:func:`remove_ack` are ``doctor ack``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable, Optional

from clusterctl.config import UserConfig
from clusterctl.diagnose.bundle import Snapshot
from clusterctl.diagnose.findings import Finding
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.results import HostResult, HostStatus
from clusterctl.inventory.model import Host, Inventory
from clusterctl.deploy.placement.deployed import with_replicas as placed
from clusterctl.diagnose import acks as ack_store
from clusterctl.diagnose.active import Runner, RunOutput, active_findings as bandwidth
from clusterctl.diagnose.baseline import learn as learn_baseline, load_baseline, write_baseline
from clusterctl.diagnose.bundle import context, only_hosts
from clusterctl.diagnose.current import HISTORY, parse_when
from clusterctl.diagnose.thresholds import load_thresholds
from clusterctl.drift import doctor_checks
from clusterctl.fleet.factory import make_fleet
from clusterctl.fleet.fleet import Fleet
from clusterctl.inventory.loader import load_inventory as load
from clusterctl.inventory.nodeset import expand
from clusterctl.inventory.select import select_hosts
from clusterctl.probe.run import FactsResult
from clusterctl.probe.snapshot import gather as gather_hosts
from clusterctl.diagnose.doctor import diagnose, resolve_checks
from clusterctl.diagnose.bundle import read_bundle as read


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


@dataclass(frozen=True)
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
    # read after the snapshot instead of ``acks`` when given: loading the -i inventory binds the
    # state of its cluster, where `doctor ack -i` keeps them
    load_acks: Optional[Callable[[], list[dict[str, Any]]]] = None
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


def host_row(r: FactsResult) -> HostResult:
    """A probe result's progress row (``probe.run.FactsResult`` -> ``HostResult``)."""
    status = HostStatus.OK if r.ok else HostStatus(r.fleet_status if r.fleet_status != "ok" else "error")
    return HostResult(r.host, status, duration_s=r.duration_s, error=r.reason)


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
                on_facts=lambda r: on_event(DoctorEvent("host", result=host_row(r))),
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
    got = gathered if gathered is not None else gather(request, on_event)
    snap, inv = got.snapshot, got.inventory
    if request.bundle:
        meta: dict[str, Any] = {"source": str(Path(request.bundle)), "bundle": snap.meta}
    else:
        meta = {"inventory": request.inventory_path, "pattern": request.pattern, **snap.meta}
    thresholds = request.thresholds
    acks = request.load_acks() if request.load_acks is not None else request.acks
    findings = diagnose(context(snap, inv, thresholds), request.checks, since=request.since, acks=acks)
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


# ------------------------------------------------------------------ building the request


@dataclass(frozen=True)
class DoctorOptions:
    """doctor's options as the command line gave them, checked and resolved by :func:`resolve`."""

    checks: Optional[str] = None  # --checks: comma-separated checks or groups (None: every analyzer)
    baseline: Optional[str] = None  # --baseline FILE written by --learn
    since: Optional[str] = None  # --since: 2h, 3d, 2026-11-30T10:00Z
    active: bool = False  # --active: ib_write_bw between host pairs
    bundle: Optional[str] = None  # --from PATH
    learn: Optional[str] = None  # --learn FILE
    explain_input: bool = False  # --explain-input


@dataclass(frozen=True)
class Resolved:
    """What a run checks: ``checks`` (analyzer names, None: all), ``live_checks`` (drift, leak:
    requests to the instances), ``thresholds`` (checks/*.yaml, the baseline under ``"baseline"``),
    ``since`` (epoch seconds, None: the current run and boot only) and its text."""

    checks: Optional[list[str]] = None
    live_checks: list[str] = field(default_factory=list)
    thresholds: dict[str, Any] = field(default_factory=dict)
    since: Optional[float] = None
    since_text: Optional[str] = None
    active: bool = False


def resolve(options: DoctorOptions = DoctorOptions(), now: Optional[float] = None) -> Resolved:
    """``options`` checked and resolved (``now``: epoch seconds ``--since`` counts back from, default
    the clock).  Raises :class:`~clusterctl.errors.ClusterctlError` naming the option: an unknown
    check, live checks on a bundle, ``--learn`` or ``--explain-input`` with the wrong source,
    unreadable check files or baseline, a bad ``--since``."""
    words, requested = doctor_checks.split_checks(options.checks.split(",")) if options.checks else ([], [])
    if requested and options.bundle:
        raise ClusterctlError(
            f"--checks {','.join(requested)} send requests to live instances; they cannot run on a bundle (--from)"
        )
    text = ",".join(words) or ("host.reachable" if requested else None)
    selected = resolve_checks(text.split(",")) if text else None
    thresholds = load_thresholds()
    if options.learn and options.bundle:
        raise ClusterctlError("--learn records live hosts; it cannot be combined with --from")
    if options.baseline:
        thresholds["baseline"] = load_baseline(options.baseline)
    if options.explain_input and not options.bundle:
        raise ClusterctlError("--explain-input describes the input of --from; give --from PATH")
    since = None
    if options.since:
        try:
            since = parse_when(options.since, time.time() if now is None else now)
        except ValueError as e:
            raise ClusterctlError(str(e)) from None
    return Resolved(selected, requested, thresholds, since, options.since, options.active)


def load_acks(state_dir: str | Path) -> list[dict[str, Any]]:
    """The acknowledgements kept in ``state_dir`` (``doctor ack``); an unreadable file raises."""
    return ack_store.load(state_dir)


def live_request(
    cfg: UserConfig,
    pattern: str,
    inventory: Inventory,
    inventory_path: str,
    hosts: list[Host],
    probe: Probe,
    resolved: Resolved = Resolved(),
    acks: Optional[list[dict[str, Any]]] = None,
    load_acks: Optional[Callable[[], list[dict[str, Any]]]] = None,
) -> DoctorRequest:
    """The request for the selected live ``hosts`` of ``inventory`` (read as deployed: template
    replicas placed in ``cfg``'s state); the acknowledgements ``acks``, or ``load_acks()`` read
    after the snapshot."""
    return DoctorRequest(
        cfg=cfg,
        thresholds=resolved.thresholds,
        pattern=pattern,
        inventory=with_replicas(inventory, cfg),
        inventory_path=inventory_path,
        hosts=list(hosts),
        probe=probe,
        load_acks=load_acks,
        **_checks(resolved, acks),
    )


def bundle_request(
    cfg: UserConfig,
    source: str,
    *,
    pattern: str = "all",
    host: Optional[str] = None,
    load_inventory: Optional[Callable[[], Inventory]] = None,
    load_config: Optional[Callable[[], UserConfig]] = None,
    resolved: Resolved = Resolved(),
    acks: Optional[list[dict[str, Any]]] = None,
    load_acks: Optional[Callable[[], list[dict[str, Any]]]] = None,
) -> DoctorRequest:
    """The request for the bundle ``source`` (``host``: the host of loose files); the inventory
    ``load_inventory`` returns (the ``-i`` file, called after the bundle is read) beats the
    bundle's own, and is read as deployed in the state of ``load_config()`` (called after it:
    loading an inventory may bind the state to its cluster; default ``cfg``)."""

    def given() -> Inventory:
        assert load_inventory is not None
        inv = load_inventory()
        return with_replicas(inv, load_config() if load_config is not None else cfg)

    return DoctorRequest(
        cfg=cfg,
        thresholds=resolved.thresholds,
        pattern=pattern,
        bundle=source,
        bundle_host=host,
        load_inventory=given if load_inventory is not None else None,
        load_acks=load_acks,
        **_checks(resolved, acks),
    )


def _checks(resolved: Resolved, acks: Optional[list[dict[str, Any]]]) -> dict[str, Any]:
    return dict(
        checks=resolved.checks,
        live_checks=list(resolved.live_checks),
        since=resolved.since,
        since_text=resolved.since_text,
        acks=list(acks or []),
        active=resolved.active,
    )


@dataclass(frozen=True)
class Learned:
    """``doctor --learn``: the baseline written to ``path`` for ``hosts`` hosts; ``missing`` the
    hosts not learned (no facts: host -> reason)."""

    path: str
    hosts: int
    missing: dict[str, str]


def learn(request: DoctorRequest, path: str, on_event: OnEvent = _ignore) -> Learned:
    """Record the hosts' GPU configuration as the known-good baseline in ``path`` (YAML); raises
    ``ClusterctlError`` when it cannot be written."""
    snap = gather(request, on_event).snapshot
    data = learn_baseline(snap.facts)
    try:
        write_baseline(path, data)
    except OSError as e:
        raise ClusterctlError(f"{path}: cannot write the baseline: {e.strerror}") from None
    return Learned(path, len(data["hosts"]), dict(snap.missing))


def list_acks(state_dir: str | Path, now: float) -> list[dict[str, Any]]:
    """Every acknowledgement of ``state_dir``, each with ``expired`` (its time passed at ``now``)."""
    return [{**a, "expired": ack_store.until_epoch(a) <= now} for a in ack_store.load(state_dir)]


def ack_path(state_dir: str | Path) -> Path:
    """Where ``state_dir``'s acknowledgements are kept."""
    return ack_store.ack_path(state_dir)


def add_ack(
    state_dir: str | Path,
    check: str,
    subject: str,
    until: str,
    *,
    host: Optional[str] = None,
    reason: str = "",
    now: float,
) -> dict[str, Any]:
    """Acknowledge ``check`` on ``subject`` (on ``host``, else every host) until ``until`` (a duration
    such as 3d, or a time, counted from ``now``); the entry written.  Raises ``ClusterctlError`` on
    a bad or past ``--until`` or an unreadable acks file."""
    try:
        t = parse_when(until, now, option="--until", ahead=True)
    except ValueError as e:
        raise ClusterctlError(str(e)) from None
    return ack_store.add(state_dir, check, subject, t, host=host, reason=reason, now=now)


def remove_ack(state_dir: str | Path, check: str, subject: str, host: Optional[str] = None) -> int:
    """Remove the acknowledgements of ``check`` on ``subject`` (on ``host`` only when given); how many."""
    return ack_store.remove(state_dir, check, subject, host)


def fleet_runner(fleet: Fleet) -> Runner:
    """``doctor --active``'s :data:`clusterctl.diagnose.active.Runner` over ``fleet`` (SSH): each
    host's command at once, ``timeout`` seconds per command, the round cut off 30 s after that."""

    def run(cmds: Mapping[str, str], timeout: float) -> dict[str, RunOutput]:
        res = fleet.run(dict(cmds), timeout=timeout, deadline=timeout + 30)
        return {r.host: RunOutput(r.rc, r.stdout, r.error) for r in res}

    return run
