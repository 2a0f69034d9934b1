"""``clusterctl failover``: take instances whose TP group is UNAVAILABLE out, move them, put them back.

One run (docs/gateway.md, "Failover"):

1. **Detect.** Doctor's snapshot of the instances' hosts and of their
   templates' hosts (one SSH round trip per host, ``probe.snapshot.gather``), then
   doctor's ``tp.group`` check and GPU checks on it: the instances whose TP
   group is UNAVAILABLE (CRIT), the failed GPUs, the GPU topology.
2. **Decide** (:mod:`clusterctl.gateway.failover_plan`): the cap, what moves
   where, what is only marked down, which GPUs get cordoned.  ``--plan``
   stops here and changes nothing.
3. **Cordon** the failed GPUs (reason ``failover: ...``; existing cordons
   are kept as they are).
4. **Mark down** every instance taken out at the gateway (reason
   ``failover: TP group UNAVAILABLE``), so no new request reaches it.
5. **Drain and stop** the replicas that move (``deploy/rollout/lifecycle.py``: wait
   for requests in flight up to ``drain_timeout_s``, then ``systemctl stop``;
   a replica across hosts moves whole: every member's unit is stopped, and it
   is placed again on N healthy hosts).
6. **Record** their new placements and **roll out** exactly those replicas
   through the deploy engine (lock, staging, the unit removed from the old
   host, started on the new one, health gates, rollback of a failed batch).
   A replica across hosts counts as moved only when every one of its new
   hosts applied and its head passed its gate.
7. **Sync** the gateway: moved replicas that passed their gates are marked
   up; the others stay down; weights from fresh load scores.  Instances over
   the cap keep the state the last sync gave them (failover leaves them alone).

Nothing here prints: progress goes to ``on_event(str)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clusterctl.deploy.rollout.engine import DeployOptions, DeployReport, FleetFactory
from clusterctl.deploy.placement.place import HostTopology
from clusterctl.deploy.state import StateStore
from clusterctl.diagnose.findings import Finding
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.gateway.failover_plan import FailoverPlan, plan_failover
from clusterctl.gateway.sync import SyncResult, tp_unavailable
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.deploy.placement.deployed import wanted_instances
from clusterctl.deploy.placement.place import desired_instances
from clusterctl.deploy.placement.topology import host_topology
from clusterctl.diagnose import bundle
from clusterctl.diagnose.registry import run_analyzers
from clusterctl.probe import snapshot
from clusterctl.diagnose.thresholds import load_thresholds
from clusterctl.diagnose.tp import check_tp_groups
from clusterctl.gateway import state as gwstate
from clusterctl.gateway.hook import Hook, fleet_hook
from clusterctl.fleet.fleet import Fleet
from clusterctl.inventory.select import select_hosts
from clusterctl.probe.factgroups import GpusFact
from clusterctl.gateway import sync as gateway_sync
from clusterctl.gateway import observe as gateway_observe
from clusterctl.deploy.rollout import lifecycle
from clusterctl.deploy.rollout import engine as deploy_engine

#: Reason recorded in the gateway state for instances failover marks down.
MARK_DOWN_REASON = "failover: TP group UNAVAILABLE"


@dataclass
class FailoverOptions:
    """The operator's flags: ``max_share`` in [0, 1]; timeouts in seconds; ``window_s``: the
    load-score window of the final gateway sync."""

    max_share: float = 0.25
    plan_only: bool = False
    drain_timeout_s: float = 120.0
    gate_timeout_s: float = 600.0
    window_s: float = 1.0
    #: hosts the operator told failover not to place on (``--avoid-host``): cordoned by the run.
    avoid_hosts: tuple[str, ...] = ()


@dataclass
class Detection:
    """What doctor found: instance → ``tp.group`` message (UNAVAILABLE ones), GPU findings, topology,
    and hosts that could not be checked (host → why)."""

    unavailable: dict[str, str]
    gpu_findings: list[Finding]
    topology: dict[str, HostTopology]
    unchecked: dict[str, str] = field(default_factory=dict)


@dataclass
class FailoverReport:
    """One run: the plan, per moved replica ``None`` (moved, gates passed) or why it failed,
    the deploy engine's report and the final gateway sync (``None`` without a gateway or
    when nothing moved)."""

    plan: FailoverPlan
    detection: Detection
    planned: bool = False
    moved: dict[str, str | None] = field(default_factory=dict)
    deploy: DeployReport | None = None
    gateway: SyncResult | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        """0 nothing to do or all moved; 1 some over the cap or not movable; 2 a move (or the gateway) failed."""
        if (
            self.errors
            or any(v is not None for v in self.moved.values())
            or (self.gateway is not None and not self.gateway.ok)
        ):
            return ExitCode.CRIT
        p = self.plan
        if p.over_cap or p.fixed or p.no_room:
            return ExitCode.WARN
        return ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        return {
            **self.plan.to_json(),
            "planned": self.planned,
            "unchecked": self.detection.unchecked,
            "moved": self.moved,
            "errors": self.errors,
            "deploy": self.deploy.to_dict() if self.deploy else None,
            "gateway": self.gateway.to_json() if self.gateway else None,
            "exit_code": int(self.exit_code),
        }


def scan_hosts(inv: Inventory, instances: Mapping[str, Instance]) -> list[str]:
    """Hosts to look at (inventory order): every instance's, and every host a template may use."""
    names = {g.host for i in instances.values() for g in i.placement}
    for tpl in inv.templates.values():
        names.update(h.name for h in select_hosts(inv, tpl.hosts))
    return [h for h in inv.hosts if h in names]


def detect(
    inv: Inventory,
    instances: Mapping[str, Instance],
    fleet: Fleet,
    hosts: Sequence[str],
    on_event: Callable[[str], None] | None = None,
) -> Detection:
    """Doctor's snapshot of ``hosts`` (``fleet`` holds them) and its TP-group and GPU checks."""
    snap = snapshot.gather(fleet, inv, [inv.hosts[h] for h in hosts], on_event=on_event)
    ctx = bundle.context(snap, replace(inv, instances=dict(instances)), load_thresholds())
    tp = check_tp_groups(ctx)
    names = tp_unavailable(tp)
    unavailable = {
        f.subject.removeprefix("tp-group:"): f.message for f in tp if f.subject.removeprefix("tp-group:") in names
    }
    topology: dict[str, HostTopology] = {
        h: t for h, facts in snap.facts.items() if (t := host_topology(GpusFact.parse(facts)))
    }
    return Detection(unavailable, run_analyzers(ctx, only=["gpu"]), topology, dict(snap.missing))


def _hook(inv: Inventory, state_dir: Path, make_fleet: FleetFactory) -> Hook | None:
    return fleet_hook(inv, state_dir, make_fleet)


def run_failover(
    inv: Inventory,
    state_dir: Path,
    make_fleet: FleetFactory,
    opts: FailoverOptions,
    on_event: Callable[[str], None] | None = None,
) -> FailoverReport:
    """One failover run (module doc).  Raises :class:`ClusterctlError` only before anything changed
    (unreadable state, placement errors); later failures are in the report."""
    say = on_event or (lambda s: None)
    store = StateStore(state_dir)
    state = store.load()
    instances = dict(desired_instances(inv, state).instances)
    hosts = scan_hosts(inv, instances)
    say(f"failover: checking TP groups of {len(instances)} instances on {len(hosts)} hosts")
    with make_fleet([inv.hosts[h] for h in hosts]) as fleet:
        det = detect(inv, instances, fleet, hosts, on_event=say)
    plan = plan_failover(
        instances,
        det.unavailable,
        state,
        inv,
        max_share=opts.max_share,
        gpu_findings=det.gpu_findings,
        topology=det.topology,
        avoid_hosts=opts.avoid_hosts,
    )
    report = FailoverReport(plan, det, planned=opts.plan_only)
    if opts.plan_only or not plan.taken_out:
        return report

    with store.update() as st:
        for key, c in plan.cordons.items():
            st.cordons.setdefault(key, c)
    for key, c in plan.cordons.items():
        say(f"failover: cordoned {key} ({c.reason})")
    hook = _hook(inv, state_dir, make_fleet)
    try:
        for name in plan.taken_out:
            if hook is not None:
                say(f"failover: {name}: marking down at the gateway")
                hook.mark_down(name, MARK_DOWN_REASON)
    except ClusterctlError as e:
        report.errors.append(str(e))
        report.moved = {m.instance: "not moved: the gateway could not mark it down" for m in plan.moves}
        return report
    if plan.moves:
        _move(inv, store, make_fleet, opts, plan, instances, report, say)
    if hook is not None:
        report.gateway = _sync(inv, state_dir, make_fleet, opts, plan, report, say)
    return report


def _move(
    inv: Inventory,
    store: StateStore,
    make_fleet: FleetFactory,
    opts: FailoverOptions,
    plan: FailoverPlan,
    instances: Mapping[str, Instance],
    report: FailoverReport,
    say: Callable[[str], None],
) -> None:
    """Drain and stop the replicas, record their new places, roll them out; fills ``report.moved``."""
    names = [m.instance for m in plan.moves]
    old_hosts = sorted({h for m in plan.moves for h in m.old.hosts})  # a replica across hosts: every member
    with make_fleet([inv.hosts[h] for h in old_hosts if h in inv.hosts]) as fleet:
        for r in lifecycle.stop_instances(
            inv, fleet, [instances[n] for n in names], drain_timeout=opts.drain_timeout_s, on_event=say
        ):
            say(f"failover: {r.instance}: " + ("stopped" if r.ok else f"stop failed: {r.error}"))
    with store.update() as st:
        for m in plan.moves:
            st.placements.setdefault(m.template, {})[m.instance] = m.new
    targets = {h for m in plan.moves for h in m.old.hosts + m.new.hosts}
    hosts = [inv.hosts[h] for h in inv.hosts if h in targets]
    dopts = DeployOptions(
        instances=",".join(names), gate_timeout_s=opts.gate_timeout_s, drain_timeout_s=opts.drain_timeout_s
    )
    try:
        rep = deploy_engine.Deploy(
            inv,
            hosts,
            make_fleet,
            str(store.directory),
            dopts,
            on_event=lambda e: (
                None
                if e.kind == "bytes"
                # staging byte counts: not lines
                else say(f"[{e.kind}] " + (f"{e.host}: " if e.host else "") + e.message)
            ),
            gateway=_hook(inv, store.directory, make_fleet),  # its drains go through the same gateway
        ).run()
    except ClusterctlError as e:
        report.errors.append(f"deploy: {e}")
        report.moved = {n: f"deploy: {e}" for n in names}
        return
    report.deploy = rep
    for m in plan.moves:
        report.moved[m.instance] = _moved(rep, m.instance, m.new.hosts)


def _moved(rep: DeployReport, name: str, hosts: Sequence[str]) -> str | None:
    """Why replica ``name`` did not come up on ``hosts`` (its head's first; a replica across hosts needs
    every member's host applied, and its head's gate), or ``None`` when it did."""
    for host in hosts:
        out = rep.hosts.get(host)
        if out is None or out.status != "applied":
            return f"{host}: {out.status if out else 'not reached'}" + (f": {out.error}" if out and out.error else "")
    head = rep.hosts[hosts[0]]
    gates = [g for g in head.gates if g.instance == name]
    if not gates:
        return "no gate result"
    return None if all(g.ok for g in gates) else "gate: " + "; ".join(g.reason for g in gates if not g.ok)


def _sync(
    inv: Inventory,
    state_dir: Path,
    make_fleet: FleetFactory,
    opts: FailoverOptions,
    plan: FailoverPlan,
    report: FailoverReport,
    say: Callable[[str], None],
) -> SyncResult | None:
    """Mark the replicas that moved up and sync the gateway from fresh measurements (forced)."""
    gw = inv.gateway
    assert gw is not None
    back = [n for n, why in report.moved.items() if why is None]

    def mark_up(st: gwstate.GatewayState) -> None:
        for n in back:
            st.marked_down.pop(n, None)

    try:
        st = gwstate.update(state_dir, mark_up)
        instances = wanted_instances(inv, state_dir)
        hosts = sorted({g.host for i in instances.values() for g in i.placement} | set(gw.hosts))
        with make_fleet([inv.hosts[h] for h in hosts if h in inv.hosts]) as fleet:
            observed, _ = gateway_observe.observe(
                inv, instances, fleet, window=opts.window_s, state_dir=state_dir, on_event=say
            )
            servers = gateway_sync.decide(
                inv, instances, observed, marked_down=st.marked_down, unavailable=set(plan.fixed) | set(plan.no_room)
            )
            # Over the cap means left alone: as the last sync decided (down if it ran with --tp-check).
            servers.update({n: st.servers[n] for n in plan.over_cap if n in st.servers})
            result = gateway_sync.sync_gateway(
                inv, fleet, instances, servers, state_dir=state_dir, force=True, on_event=say, observed=observed
            )  # least_score: the downs and load go as scores
    except ClusterctlError as e:
        report.errors.append(f"gateway sync: {e}")
        return None
    for n in back:
        s = result.servers.get(n)
        say(
            f"failover: {n}: "
            + (
                f"up at the gateway, weight {s.weight}"
                if s and not s.down
                else f"still down at the gateway ({s.reason if s else 'no state'})"
            )
        )
    return result
