"""One autoscaler round: measure each autoscaled template, decide, act, audit.

For each template with an ``autoscale:`` policy (docs/autoscale.md):

1. **Measure** its replicas with ``clusterctl status``'s collection
   (``deploy.status.collect_status``: unit state, ``/health``, two ``/metrics``
   samples ``window_s`` apart) and turn each row into the policy's signal;
   a replica whose metrics could not be read has no value (missing).
2. **Decide** (:func:`clusterctl.autoscale.decide.decide`, pure).
3. **Act** (not with ``plan_only``), under the deploy lock of the template's
   hosts, taken with the autoscaler's own run id (an operator's deploy or
   scale holding it wins: the decision is recorded as ``waited`` and nothing
   changes).  Scale-out: placement of the new replicas on allowed,
   uncordoned GPUs (the preferred GPU model first), the count and places
   recorded, the new replicas marked down at the gateway (reason
   ``autoscale: starting``) so no request reaches them before their gates,
   the deploy engine rolls them out (staging, health gates, rollback of a
   failed batch), then they are marked up and the gateway synced from fresh
   measurements.  A failed scale-out is rolled back by the engine, the count
   and places restored, the marks lifted; the next scale-out backs off.
   Scale-in: the count recorded, the engine drains the highest-numbered
   replicas (marked down at the gateway, in-flight requests finished, up to
   ``drain_timeout_s``) and removes them.
4. **Audit**: one line in ``autoscale/history.jsonl`` (signals, rule, action,
   outcome), the hold timers in ``autoscale/state.json``.

Nothing here prints: progress goes to ``on_event(str)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterctl.autoscale import record
from clusterctl.autoscale.decide import Decision, ReplicaSignal, ScalerState, Signals, decide, record_outcome
from clusterctl.deploy.rollout.engine import DeployReport, FleetFactory
from clusterctl.deploy.state import Cordon, DeployState, StateStore, cordon_key, utc_now, who_am_i
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import AutoscalePolicy, Instance, Inventory
from clusterctl.inventory.multinode import hosts_in_order
from clusterctl.deploy.placement.deployed import wanted_instances
from clusterctl.deploy.placement.place import desired_instances, desired_replicas, replica_number
from clusterctl.deploy.placement.scale import ScalePlan, plan_scale, replica_names, scale_hosts
from clusterctl.deploy.rollout import lock
from clusterctl.gateway import state as gwstate
from clusterctl.gateway.hook import Hook, fleet_hook
from clusterctl.gateway.sync import decide as gw_decide
from clusterctl.inventory.select import select_hosts
from clusterctl.deploy.rollout import engine as deploy_engine
from clusterctl.gateway import sync as gateway_sync
from clusterctl.gateway import observe as gateway_observe
from clusterctl.deploy.status import instances as deploy_status

if TYPE_CHECKING:
    from clusterctl.deploy.status.instances import InstanceStatus

#: The reason new replicas are marked down at the gateway with until their gates pass.
STARTING_REASON = "autoscale: starting"
#: The holder the autoscaler's deploy lock names.
HOLDER_PREFIX = "autoscaler"


@dataclass
class Outcome:
    """One template's round: the decision, what was measured, and how acting went.

    ``outcome``: ``planned`` (--plan), ``none`` (nothing to do), ``ok``, ``failed`` (rolled back),
    ``waited`` (the deploy lock or the count belonged to an operator's run), ``error``."""

    template: str
    decision: Decision
    signals: Signals
    outcome: str = "planned"
    detail: str | None = None
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    run_id: str | None = None
    seconds: float = 0.0
    policy: AutoscalePolicy | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "template": self.template,
            **self.decision.to_json(),
            "outcome": self.outcome,
            "detail": self.detail,
            "added": self.added,
            "removed": self.removed,
            "run_id": self.run_id,
            "seconds": round(self.seconds, 2),
            "replicas": {
                r.name: {"state": r.state, "value": r.value, "worth": r.worth, "error": r.error}
                for r in self.signals.replicas
            },
        }


def autoscaled(inv: Inventory, names: Sequence[str] = ()) -> dict[str, AutoscalePolicy]:
    """template -> policy, for ``names`` (all autoscaled templates when empty); an unknown or
    policy-less name raises :class:`ClusterctlError`."""
    out = {n: t.autoscale for n, t in inv.templates.items() if t.autoscale is not None}
    for n in names:
        if n not in inv.templates:
            raise ClusterctlError(
                f"template {n!r} is not in the inventory {inv.path} (templates: {', '.join(inv.templates) or 'none'})"
            )
        if n not in out:
            raise ClusterctlError(f"template {n!r} has no autoscale: policy in {inv.path} (docs/autoscale.md)")
    return {n: p for n, p in out.items() if not names or n in names}


def replica_value(signal: str, row: InstanceStatus) -> float | None:
    """The policy's signal from one status row (``None``: its metrics were not read)."""
    read = row.kv_usage is not None or row.waiting is not None or row.running is not None
    if not read:
        return None
    if signal == "load":
        return row.load
    if signal == "queue":
        return row.waiting
    if signal == "kv":
        return row.kv_usage
    if row.ttft_p90_s is not None:
        return float(row.ttft_p90_s)
    # no first token in the window: idle only when nothing waits for one
    return 0.0 if (row.waiting or 0) == 0 else None


def _gpu_model(inv: Inventory, inst: Instance) -> str:
    host = inv.hosts.get(inst.placement[0].host) if inst.placement else None
    return host.gpus.model if host is not None else ""


def template_replicas(inv: Inventory, state: DeployState, template: str) -> dict[str, Instance]:
    res = desired_instances(inv, state)
    return {n: i for n, i in res.instances.items() if i.template == template}


def measure(
    inv: Inventory,
    state_dir: Path,
    make_fleet: FleetFactory,
    template: str,
    policy: AutoscalePolicy,
    on_event: Callable[[str], None] | None = None,
) -> Signals:
    """The template's replicas measured over the policy's window."""
    state = StateStore(state_dir).load()
    current = desired_replicas(inv.templates[template], state)
    instances = template_replicas(inv, state, template)
    hosts = sorted({g.host for i in instances.values() for g in i.placement})
    rows: list[InstanceStatus] = []
    if instances:
        with make_fleet([inv.hosts[h] for h in hosts if h in inv.hosts]) as fleet:
            rows = deploy_status.collect_status(
                inv,
                instances,
                fleet,
                window=policy.window_s,
                state_dir=state_dir,
                include_extra=False,
                on_event=on_event,
                tp_check=False,
            )
    by_name = {r.name: r for r in rows}
    reps = []
    for name, inst in instances.items():
        r = by_name.get(name)
        worth = policy.worth_of(_gpu_model(inv, inst))
        if r is None:
            reps.append(ReplicaSignal(name, "unknown", None, worth, "not measured"))
            continue
        v = replica_value(policy.signal, r)
        err = None if v is not None else (r.message or "metrics not read")
        reps.append(ReplicaSignal(name, r.state, v, worth, err if r.state == "serving" else (r.message or r.state)))
    new_worth = policy.worth_of(policy.prefer_gpu) if policy.prefer_gpu else (min((r.worth for r in reps), default=1.0))
    return Signals(current, tuple(reps), new_worth)


def restricted(inv: Inventory, state: DeployState, template: str, policy: AutoscalePolicy, prefer: bool) -> DeployState:
    """A copy of ``state`` with cordons (never saved) on what the policy does not allow for new
    replicas: hosts outside ``hosts``, GPUs outside ``gpus``, and with ``prefer`` hosts whose GPU
    model is not ``prefer_gpu``.  The operator's own cordons are all still there."""
    out = state.copy()
    mine = [h.name for h in select_hosts(inv, inv.templates[template].hosts)]
    allowed = set(mine) if policy.hosts is None else {h.name for h in select_hosts(inv, policy.hosts)}
    gpus = {(g.host, g.index) for g in policy.gpus}
    why = Cordon(f"autoscale policy of {template}", "autoscaler", utc_now())
    for h in mine:
        host = inv.hosts[h]
        if h not in allowed or (prefer and policy.prefer_gpu and host.gpus.model != policy.prefer_gpu):
            out.cordons.setdefault(cordon_key(h), why)
        elif gpus:
            for i in range(host.gpus.count):
                if (h, i) not in gpus:
                    out.cordons.setdefault(cordon_key(h, i), why)
    return out


def plan_out(
    inv: Inventory, state: DeployState, template: str, policy: AutoscalePolicy, target: int
) -> ScalePlan | None:
    """The scale plan for ``target`` placed where the policy allows (the preferred GPU model first,
    then any allowed GPU); fewer replicas when only fewer fit (``ScalePlan.after`` says how many)."""
    cur = plan_scale(inv, state, template, None).before
    tries = [True, False] if policy.prefer_gpu else [False]
    best: ScalePlan | None = None
    for prefer in tries:
        st = restricted(inv, state, template, policy, prefer)
        n = target
        while n > cur:
            sp = plan_scale(inv, st, template, n)
            if sp.fits:
                if best is None or sp.after > best.after:
                    best = sp
                break
            n -= 1
        if best is not None and best.after == target:
            break
    return best


def _lock_hosts(inv: Inventory, state: DeployState, template: str, extra: Sequence[str] = ()) -> list[str]:
    names = set(scale_hosts(inv, state, template)) | set(extra)
    return [h for h in inv.hosts if h in names]


def _hook(inv: Inventory, state_dir: Path, make_fleet: FleetFactory) -> Hook | None:
    return fleet_hook(inv, state_dir, make_fleet)


def sync_gateway_now(
    inv: Inventory, state_dir: Path, make_fleet: FleetFactory, window_s: float, say: Callable[[str], None]
) -> str | None:
    """A forced gateway sync from fresh measurements; ``None`` or why it failed."""
    gw = inv.gateway
    if gw is None:
        return None
    try:
        st = gwstate.load(state_dir)
        instances = wanted_instances(inv, state_dir)
        hosts = sorted({g.host for i in instances.values() for g in i.placement} | set(gw.hosts))
        with make_fleet([inv.hosts[h] for h in hosts if h in inv.hosts]) as fleet:
            observed, _ = gateway_observe.observe(
                inv, instances, fleet, window=window_s, state_dir=state_dir, tp_check=False, on_event=say
            )
            servers = gw_decide(inv, instances, observed, marked_down=st.marked_down)
            res = gateway_sync.sync_gateway(
                inv, fleet, instances, servers, state_dir=state_dir, force=True, on_event=say, observed=observed
            )
    except ClusterctlError as e:
        return str(e)
    bad = [f"{h.host}: {h.error}" for h in res.hosts if not h.ok]
    return "; ".join(bad) or None


def _deploy(
    inv: Inventory,
    state_dir: Path,
    make_fleet: FleetFactory,
    template: str,
    names: list[str],
    hosts: list[str],
    policy: AutoscalePolicy,
    me: lock.LockInfo,
    say: Callable[[str], None],
) -> DeployReport:
    dopts = deploy_engine.DeployOptions(
        instances=",".join(names), gate_timeout_s=policy.gate_timeout_s, drain_timeout_s=policy.drain_timeout_s
    )
    d = deploy_engine.Deploy(
        inv,
        [inv.hosts[h] for h in hosts],
        make_fleet,
        str(state_dir),
        dopts,
        on_event=lambda e: (
            None if e.kind == "bytes" else say(f"[{e.kind}] " + (f"{e.host}: " if e.host else "") + e.message)
        ),
        gateway=_hook(inv, state_dir, make_fleet),  # its drains go through the same gateway
    )
    d.me = me  # the autoscaler already holds the deploy lock with this run id
    return d.run()


def _gates_passed(rep: DeployReport, inv: Inventory, state_dir: Path, names: Sequence[str]) -> dict[str, str | None]:
    """name -> ``None`` (applied, every gate passed) or why not."""
    where = wanted_instances(inv, state_dir)
    out: dict[str, str | None] = {}
    for n in names:
        host = where[n].placement[0].host if n in where else None
        o = rep.hosts.get(host) if host else None
        gates = [g for g in (o.gates if o else []) if g.instance == n]
        if any(not g.ok for g in gates):
            out[n] = "gate: " + "; ".join(g.reason for g in gates if not g.ok)
        elif o is None or o.status != "applied":
            out[n] = f"{host}: {o.status if o else 'not reached'}" + (f": {o.error}" if o and o.error else "")
        elif not gates:
            out[n] = "no gate result"
        else:
            out[n] = None
    return out


def act(
    inv: Inventory,
    state_dir: Path,
    make_fleet: FleetFactory,
    template: str,
    policy: AutoscalePolicy,
    decision: Decision,
    out: Outcome,
    say: Callable[[str], None],
) -> None:
    """Carry out ``decision`` (an ``out`` or ``in``); fills ``out.outcome``/``detail``/``added``/``removed``."""
    store = StateStore(state_dir)
    state = store.load()
    if decision.action == "out":
        sp = plan_out(inv, state, template, policy, decision.target)
        if sp is None:
            out.outcome, out.detail = "failed", "no room: no allowed, uncordoned GPUs for a new replica"
            return
    else:
        sp = plan_scale(inv, state, template, decision.target)
    me = lock.LockInfo(holder=f"{HOLDER_PREFIX}:{who_am_i()}")
    out.run_id = me.run_id
    hosts = _lock_hosts(
        inv, state, template, [h for p in sp.result.state.placements.get(template, {}).values() for h in p.hosts]
    )
    try:
        with make_fleet([inv.hosts[h] for h in hosts]) as fleet:
            acquired = lock.acquire(fleet, hosts, me)
    except lock.LockHeld as e:
        out.outcome, out.detail = "waited", f"an operator's run holds the deploy lock: {e}"
        return
    try:
        # under the lock: an operator's scale recorded meanwhile wins
        now_state = store.load()
        if now_state.replicas.get(template) != state.replicas.get(template):
            out.outcome, out.detail = (
                "waited",
                (
                    f"the count of {template} changed meanwhile "
                    f"({state.replicas.get(template)} -> {now_state.replicas.get(template)}): "
                    "an operator's scale wins"
                ),
            )
            return
        if decision.action == "out":
            _scale_out(inv, store, make_fleet, template, policy, sp, hosts, me, out, say)
        else:
            _scale_in(inv, store, make_fleet, template, policy, sp, hosts, me, out, say, replica_names(sp))
    finally:
        with make_fleet([inv.hosts[h] for h in acquired.locked]) as fleet:
            lock.release(fleet, acquired.locked, me.run_id)


def _scale_out(
    inv: Inventory,
    store: StateStore,
    make_fleet: FleetFactory,
    template: str,
    policy: AutoscalePolicy,
    sp: ScalePlan,
    hosts: list[str],
    me: lock.LockInfo,
    out: Outcome,
    say: Callable[[str], None],
) -> None:
    state_dir = store.directory
    before = sp.before
    # replicas above the count in force are new; a lower one placed now only had no recorded place
    added = [n for n in sp.added if (replica_number(template, n) or 0) > before]
    out.added = added
    with store.update() as st:
        st.replicas[template] = sp.after
        places = st.placements.setdefault(template, {})
        for n in sp.added:
            places[n] = sp.result.state.placements[template][n]
    hook = _hook(inv, state_dir, make_fleet)
    try:
        if hook is not None:
            say(f"autoscale {template}: {', '.join(added)} marked down at the gateway until their gates pass")
            hook.mark_down_many(added, STARTING_REASON)
        rep = _deploy(inv, state_dir, make_fleet, template, replica_names(sp), hosts, policy, me, say)
        why = _gates_passed(rep, inv, state_dir, added)
        failed = {n: w for n, w in why.items() if w is not None}
        if rep.ok and not failed:
            if hook is not None:
                hook.mark_up_many(added)
                err = sync_gateway_now(inv, state_dir, make_fleet, min(policy.window_s, 2.0), say)
                if err:
                    out.outcome, out.detail = "ok", f"replicas serve; gateway sync: {err}"
                    return
            out.outcome = "ok"
            out.detail = f"{before} -> {sp.after}: " + ", ".join(
                # a nodes: N replica: every host, the head first
                f"{n} on {' + '.join(hosts_in_order(sp.result.instances[n]))}"
                for n in added
            )
            return
        out.outcome = "failed"
        out.detail = (
            f"deploy {rep.result}: " + "; ".join(f"{n}: {w}" for n, w in failed.items())
            if failed
            else f"deploy {rep.result}"
        )
    except ClusterctlError as e:
        out.outcome, out.detail = "failed", f"{type(e).__name__}: {e}"
    # roll back what the autoscaler recorded (the engine rolled back the hosts)
    with store.update() as st:
        st.replicas[template] = before
        for n in added:
            st.placements.get(template, {}).pop(n, None)
    if hook is not None:
        try:
            hook.mark_up_many(added)  # the names are no longer wanted: the marks only go away
        except ClusterctlError as e:
            out.detail = f"{out.detail}; gateway: {e}"


def _scale_in(
    inv: Inventory,
    store: StateStore,
    make_fleet: FleetFactory,
    template: str,
    policy: AutoscalePolicy,
    sp: ScalePlan,
    hosts: list[str],
    me: lock.LockInfo,
    out: Outcome,
    say: Callable[[str], None],
    names: list[str],
) -> None:
    before = sp.before
    out.removed = list(sp.removed)
    with store.update() as st:
        st.replicas[template] = sp.after
    try:
        rep = _deploy(inv, store.directory, make_fleet, template, names, hosts, policy, me, say)
    except ClusterctlError as e:
        rep, err = None, f"{type(e).__name__}: {e}"
    if rep is not None and rep.ok:
        drained = {k: v for o in rep.hosts.values() for k, v in o.drained.items()}
        out.outcome = "ok"
        out.detail = f"{before} -> {sp.after}: " + ", ".join(f"{n} ({drained.get(n, 'removed')})" for n in sp.removed)
        return
    out.outcome = "failed"
    out.detail = (
        err
        if rep is None
        else f"deploy {rep.result}: " + "; ".join(f"{o.host}: {o.error}" for o in rep.hosts.values() if o.error)
    )
    with store.update() as st:
        st.replicas[template] = before


def decide_template(
    inv: Inventory,
    state_dir: Path,
    make_fleet: FleetFactory,
    template: str,
    policy: AutoscalePolicy,
    *,
    plan_only: bool = False,
    now: Callable[[], float] = time.time,
    on_event: Callable[[str], None] | None = None,
) -> Outcome:
    """One decision for one template (module doc); audited unless ``plan_only``."""
    say = on_event or (lambda s: None)
    t0 = time.monotonic()
    states = record.load_states(state_dir)
    prev = states.get(template, ScalerState())
    signals = measure(inv, state_dir, make_fleet, template, policy, on_event=say)
    at = now()
    d = decide(signals, prev, policy, at)
    out = Outcome(template, d, signals, policy=policy)
    if plan_only:
        out.outcome = "planned"
        return out
    if d.action == "none":
        out.outcome = "none"
    else:
        say(f"autoscale {template}: {d.action} {d.current} -> {d.target} ({d.rule})")
        try:
            act(inv, state_dir, make_fleet, template, policy, d, out, say)
        except ClusterctlError as e:
            out.outcome, out.detail = "error", str(e)
    nxt = record_outcome(
        prev,
        d,
        "ok" if out.outcome in ("ok", "none") else "waited" if out.outcome == "waited" else "failed",
        policy,
        at,
    )
    states = record.load_states(state_dir)
    states[template] = nxt
    record.save_states(state_dir, states)
    out.seconds = time.monotonic() - t0
    record.append_history(
        state_dir,
        {
            "ts": round(at, 3),
            "time": utc_now(),
            "signal": policy.signal,
            "high": policy.high,
            "low": policy.low,
            "min": policy.min_replicas,
            "max": policy.max_replicas,
            **out.to_json(),
        },
    )
    return out


def run_round(
    inv: Inventory,
    state_dir: Path,
    make_fleet: FleetFactory,
    templates: Mapping[str, AutoscalePolicy],
    *,
    plan_only: bool = False,
    lock_wait_s: float = 0.0,
    now: Callable[[], float] = time.time,
    on_event: Callable[[str], None] | None = None,
) -> list[Outcome]:
    """One decision per template (under the autoscaler's lock unless ``plan_only``); a template
    whose measurement fails is an ``error`` outcome, the others go on."""
    outs = []
    for name, policy in templates.items():
        if plan_only:
            outs.append(
                decide_template(inv, state_dir, make_fleet, name, policy, plan_only=True, now=now, on_event=on_event)
            )
            continue
        with record.deciding(state_dir, lock_wait_s):
            outs.append(decide_template(inv, state_dir, make_fleet, name, policy, now=now, on_event=on_event))
    return outs
