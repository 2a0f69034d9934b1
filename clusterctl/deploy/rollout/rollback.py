"""``clusterctl rollback``: put back what the last apply replaced, on request.

For every selected host, the instances that have a copy in
``/var/lib/clusterctl/deploy/previous/`` (and match ``--instances``) get
their previous unit, env and model link back, and are restarted; an instance
the last apply created (``previous/NAME.absent``) is stopped and removed.
Running instances are drained first (gateway mark-down); restored instances
that pass their gate are marked up again (:func:`~clusterctl.deploy.rollout.drain.put_back`).
The current files are kept in ``previous/`` in exchange, so a second
rollback goes forward again.  Restored instances must pass the same gates as
a deploy.  Under the deploy lock, with an audit record.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from clusterctl.deploy.rollout import apply as ap
from clusterctl.deploy.rollout import audit, gates, lock
from clusterctl.deploy import remote
from clusterctl.deploy.rollout import drain as dr
from clusterctl.deploy.rollout.drain import DrainResult
from clusterctl.deploy.rollout.journal import first_error
from clusterctl.deploy.rollout.engine import Event, FleetFactory, desired
from clusterctl.deploy.rollout.plan import matches
from clusterctl.deploy.rollout.rollback_order import rollback_in_order
from clusterctl.deploy.state import utc_now
from clusterctl.inventory.model import Host, Instance, Inventory
from clusterctl.deploy.units.secrets import resolve_secrets
from clusterctl.fleet.fleet import Fleet

#: The first value of ``--served-model-name`` on a unit's command line (what /v1/models lists).
_SERVED = re.compile(r"""--served-model-name[= ]+["']?([^\s"'\\]+)""")


@dataclass
class RollbackReport:
    """``result``: ``ok``, ``nothing`` (no previous copies), ``failed`` (a host or gate failed)."""

    run_id: str
    result: str
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    gates: list[gates.GateResult] = field(default_factory=list)
    seconds: float = 0.0
    #: instance -> how its drain ended (instances running before the rollback restarted them).
    drained: dict[str, str] = field(default_factory=dict)
    #: instance -> what :func:`~clusterctl.deploy.rollout.drain.put_back` did at the gateway once it passed its gate.
    gateway: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.result in ("ok", "nothing")

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "result": self.result,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "hosts": [{"host": h, **d} for h, d in self.hosts.items()],
            "gates": [g.to_dict() for g in self.gates],
            "drained": self.drained,
            "gateway": self.gateway,
        }


def candidates(state: remote.HostState, pattern: str | None) -> list[str]:
    """Instances of a host with a previous copy (``NAME.service`` or ``NAME.absent``) matching ``pattern``."""
    names = {f.rsplit(".", 1)[0] for f in state.previous if f.endswith((".service", ".absent"))}
    return sorted(n for n in names if matches(n, pattern))


def _api_key(inv: Inventory, state_dir: str, name: str) -> str | None:
    inst = desired(inv, state_dir)[0].get(name)
    return resolve_secrets(inv, inst).get("VLLM_API_KEY") if inst is not None else None


def _targets(
    inv: Inventory, state_dir: str, restored: dict[str, list[str]], states: dict[str, remote.HostState]
) -> list[gates.GateTarget]:
    out = []
    for host, names in restored.items():
        for name in names:
            st = states.get(host, remote.HostState(host)).instances.get(name)
            if st is None or ap.is_headless(st.unit_text):  # a replica's worker: gated through its head
                continue
            model = inv.models.get(st.x.get("Model", ""))
            flag = _SERVED.search(st.unit_text)
            served = flag.group(1) if flag else (model.served_name or model.name) if model else st.x.get("Model", name)
            port = int(st.x.get("Port") or ap.unit_port(st.unit_text) or 0)
            out.append(
                gates.GateTarget(name, host, inv.hosts[host].address, port, served, _api_key(inv, state_dir, name))
            )
    return out


def _restored_targets(inv: Inventory, state: remote.HostState, names: Sequence[str]) -> list[Instance]:
    """The running instances of ``names`` on the host of ``state`` a rollback drains (a multi-node
    replica's headless workers left out: drained through their head)."""
    todo = []
    for n in names:
        have = state.instances.get(n)
        if have is not None and have.active == "active" and not ap.is_headless(have.unit_text):
            inst = ap.instance_for_drain(inv, state.host, n, have.unit_text)
            if inst is not None:
                todo.append(inst)
    return todo


def drain_restored(
    inv: Inventory, state: remote.HostState, names: Sequence[str], gateway: dr.GatewayHook | None, timeout: float
) -> list[DrainResult]:
    """Drain (gateway mark-down first) the running instances of ``names`` on the host of ``state``."""
    return [dr.drain(inv, i, timeout=timeout, gateway=gateway) for i in _restored_targets(inv, state, names)]


def drain_restored_all(
    inv: Inventory,
    states: Mapping[str, remote.HostState],
    todo: Mapping[str, Sequence[str]],
    gateway: dr.GatewayHook | None,
    timeout: float,
) -> list[DrainResult]:
    """Drain the running instances of ``todo`` (host -> names) on every host at once: one gateway
    change marks them all down (a hook with ``mark_down_many``), then the drains wait for their
    requests in flight in parallel (at most 16 at a time), each ``timeout`` seconds at most.
    A gateway that cannot mark them down raises, as a drain's mark-down does."""
    insts = [i for h in todo for i in _restored_targets(inv, states[h], todo[h])]
    if not insts:
        return []
    many = getattr(gateway, "mark_down_many", None)
    if callable(many):
        many([i.name for i in insts])
    with cf.ThreadPoolExecutor(max_workers=min(16, len(insts))) as ex:
        return list(ex.map(lambda i: dr.drain(inv, i, timeout=timeout, gateway=gateway), insts))


def gate_restored(
    inv: Inventory,
    state_dir: str,
    fleet: Fleet,
    restored: dict[str, list[str]],
    timeout_s: float,
    on_event: Callable[[Event], None],
) -> list[gates.GateResult]:
    """The deploy gate of the instances a rollback restarted (host -> names), with the units now on the hosts."""
    after = remote.read_hosts(fleet, hosts=[h for h, n in restored.items() if n])
    targets = _targets(inv, state_dir, restored, after)
    wanted = {t.instance: t.host for t in targets}

    def units() -> dict[str, gates.UnitState]:
        now = remote.read_hosts(fleet, hosts=sorted(set(wanted.values())), timeout=30)
        return {
            n: (s.active, s.sub, s.restarts)
            for n, h in wanted.items()
            for s in [now.get(h, remote.HostState(h)).instances.get(n)]
            if s is not None
        }

    return gates.wait_gates(
        targets,
        timeout_s=timeout_s,
        units=units,
        on_result=lambda g: on_event(
            Event("gate", f"{g.instance}: {'pass' if g.ok else 'FAIL'} ({g.reason})", g.host, g.ok)
        ),
        explain=lambda t: first_error(fleet, t.host, t.instance),
    )


def rollback(
    inv: Inventory,
    hosts: Sequence[Host],
    make_fleet: FleetFactory,
    state_dir: str,
    *,
    instances: str | None = None,
    gate_timeout_s: float = 600.0,
    break_lock: bool = False,
    drain_timeout_s: float = 120.0,
    lock_ttl_s: float = lock.DEFAULT_TTL_S,
    on_event: Callable[[Event], None] = lambda e: None,
    gateway: dr.GatewayHook | None = None,
) -> RollbackReport:
    """Roll back ``instances`` (pattern) on ``hosts``; see the module docstring.  ``gateway``: the
    drain hook (``ops.deploy.drain_hook``) running instances are marked down through (None: none)."""
    t0 = time.monotonic()
    me, started = lock.LockInfo(), utc_now()
    rep = RollbackReport(me.run_id, "nothing")
    with make_fleet(hosts) as fleet:
        states = remote.read_hosts(fleet)
        todo = {h: candidates(s, instances) for h, s in states.items() if not s.error}
        for h, s in states.items():
            if s.error:
                rep.hosts[h] = {"status": "unreadable", "error": s.error}
        todo = {h: n for h, n in todo.items() if n}
        if not todo:
            on_event(Event("phase", "nothing to roll back (no previous copies)"))
            rep.seconds = time.monotonic() - t0
            return rep
        entries: list[dict[str, Any]] = []

        def record() -> dict[str, Any]:
            return audit.record(
                "rollback",
                run_id=me.run_id,
                who=me.holder,
                started=started,
                instances=entries,
                result=rep.result,
                hosts=list(todo),
            )

        with lock.held(
            fleet,
            list(todo),
            me,
            ttl_s=lock_ttl_s,
            break_lock=break_lock,
            audit=record,
            fresh_fleet=lambda: make_fleet([inv.hosts[h] for h in todo]),
        ) as got:
            todo = {h: n for h, n in todo.items() if h in got.locked}
            on_event(Event("phase", f"rolling back {sum(map(len, todo.values()))} instances on {len(todo)} hosts"))
            drained = drain_restored_all(inv, states, todo, gateway, drain_timeout_s)
            rep.drained = {
                r.instance: ("drained" if r.drained else f"drain timed out, {r.remaining} in flight") for r in drained
            }
            # a multi-node replica's members: stop all, then the workers, then the head (not all at once)
            replies, order = rollback_in_order(fleet, todo, desired(inv, state_dir)[0], own_run_id=me.run_id)
            for line in order:
                on_event(Event("phase", line))
            restored: dict[str, list[str]] = {}
            removed: list[str] = []
            for h, r in replies.items():
                restored[h] = list(r.data.get("restored", []))
                rep.hosts[h] = {
                    "status": "rolled_back" if r.ok else "failed",
                    "error": r.error,
                    "restored": restored[h],
                    "removed": r.data.get("removed", []),
                    "missing": r.data.get("missing", []),
                }
                entries += [{"instance": n, "host": h, "action": "restored"} for n in restored[h]]
                entries += [{"instance": n, "host": h, "action": "removed"} for n in r.data.get("removed", [])]
                removed += list(r.data.get("removed", []))
                on_event(Event("host", "rolled back" if r.ok else f"rollback failed: {r.error}", h, r.ok))
            # members restarted in order are gated too (their headless workers are not: gate_restored)
            restarted = {
                h: list(dict.fromkeys(restored.get(h, []) + list(r.data.get("held", []))))
                for h, r in replies.items()
                if r.ok
            }
            rep.gates = gate_restored(inv, state_dir, fleet, restarted, gate_timeout_s, on_event)
            rep.gateway = dr.put_back(gateway, [g.instance for g in rep.gates if g.ok] + removed)
            for n, note in rep.gateway.items():
                on_event(Event("host", f"{n}: {note}", None, note.startswith("up")))
            bad = [h for h, d in rep.hosts.items() if d["status"] == "failed"] + [g.host for g in rep.gates if not g.ok]
            rep.result = "failed" if bad else "ok"
        audit.append(state_dir, record())
    rep.seconds = time.monotonic() - t0
    return rep
