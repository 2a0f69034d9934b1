"""What ``clusterctl failover`` would do (pure; no I/O): pick, cap, cordon, reschedule.

Input: the instances that should run, doctor's ``tp.group`` CRIT findings
(instance → the finding) and the GPU findings behind them, the deploy state.

* **Cap.** At most ``floor(max_share x number of instances)`` instances are
  taken out in one run, in name order; the rest are listed as over the cap
  and left alone (not marked down, not moved).  Every instance failover
  takes out counts, whether it can be moved or not.
* **Movable.** Only template replicas are rescheduled (placement's
  :func:`~clusterctl.deploy.placement.place.reschedule`: free, uncordoned GPUs,
  never the ones it left).  An explicit instance (fixed placement in the
  inventory) is marked down at the gateway and reported, not moved (``fixed_why``:
  the inventory decides where it runs; :mod:`clusterctl.gateway.failover_fixed`); a
  replica for which no room is left is marked down and stays where it was.
  A ``nodes: N`` replica (one TP group across hosts: one bad member on any
  host makes doctor's ``tp.group`` UNAVAILABLE for all of it) moves whole:
  all N stages placed again, on N hosts, off the GPUs it left.
* **Cordons.** Each failed GPU of a group taken out is cordoned with the
  reason ``failover: <check>: <message>`` (a host-wide finding such as NVML
  down cordons the host), so later placements also avoid it.  When the
  finding's action is node-level (:func:`node_level`: "drain the node ...",
  a power cycle: XID 79, a lost GPU), the whole host is cordoned instead,
  the reason ending with ``(node-level: <action>)``: the group must not be
  re-placed on other GPUs of a node that is about to be drained; any host
  with a node-level CRIT finding is cordoned so (when the run takes
  something out), also one whose instance is over the cap.  Hosts the
  operator names (``avoid_hosts``, ``failover --avoid-host``) are cordoned
  with the reason ``failover: --avoid-host (operator)``.  A target that
  is already cordoned (by an operator or an earlier run) is left as it is:
  failover adds cordons, it never replaces or removes one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterctl.deploy.placement.place import HostTopology, PlacementResult, reschedule
from clusterctl.deploy.state import Cordon, DeployState, Placement, cordon_key, placement_json, utc_now, who_am_i
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.gateway.failover_fixed import why_not_moved
from clusterctl.inventory.model import Instance, Inventory

#: Prefix of the reason of every cordon failover records.
CORDON_PREFIX = "failover: "
#: Reason (after the prefix) of a host the operator told failover to avoid.
AVOID_REASON = "--avoid-host (operator)"


@dataclass
class Move:
    """A replica failover moves: from its old place to its new one (a replica across hosts moves whole:
    every stage, ``Placement.stages``)."""

    instance: str
    template: str
    old: Placement
    new: Placement

    def to_json(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "template": self.template,
            "from": placement_json(self.old),
            "to": placement_json(self.new),
        }


@dataclass
class FailoverPlan:
    """The decision for one run.

    ``findings``: every instance whose TP group is UNAVAILABLE → doctor's
    message.  ``moves``: replicas to move.  ``fixed``: explicit instances to
    mark down (not movable).  ``no_room``: replicas to mark down that cannot
    be placed elsewhere → why.  ``over_cap``: instances left alone by the
    cap.  ``cordons``: targets (``HOST`` or ``HOST:GPU``) to cordon →
    the cordon.  ``cap``: how many instances one run may take out.
    ``placement``: the rescheduled placement (``None`` when nothing moves).
    """

    total: int
    cap: int
    findings: dict[str, str] = field(default_factory=dict)
    moves: list[Move] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)
    #: each of ``fixed`` -> why it is not moved and what to change (gateway/failover_fixed.py)
    fixed_why: dict[str, str] = field(default_factory=dict)
    no_room: dict[str, str] = field(default_factory=dict)
    over_cap: list[str] = field(default_factory=list)
    cordons: dict[str, Cordon] = field(default_factory=dict)
    placement: PlacementResult | None = None

    @property
    def taken_out(self) -> list[str]:
        """Instances marked down at the gateway by this run (moved or not)."""
        return sorted([m.instance for m in self.moves] + self.fixed + list(self.no_room))

    @property
    def nothing(self) -> bool:
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        return {
            "instances": self.total,
            "cap": self.cap,
            "unavailable": dict(sorted(self.findings.items())),
            "moves": [m.to_json() for m in self.moves],
            "fixed": self.fixed,
            "fixed_why": dict(sorted(self.fixed_why.items())),
            "no_room": dict(sorted(self.no_room.items())),
            "over_cap": self.over_cap,
            "cordons": {k: {"reason": c.reason, "who": c.who, "when": c.when} for k, c in sorted(self.cordons.items())},
        }


def cap_for(total: int, max_share: float) -> int:
    """How many of ``total`` instances one run may take out: ``floor(max_share x total)``."""
    return int(math.floor(max_share * total + 1e-9))


#: A finding's action that takes the whole node out (the catalogue's RESTART_BM, CHECK_MECHANICALS,
#: WORKFLOW_NVLINK buckets; gpu.lost; NVML down): "drain the node ...", a power cycle.
NODE_LEVEL = re.compile(r"\bdrain the node\b|\bpower[- ]cycle", re.IGNORECASE)


def node_level(f: Finding) -> bool:
    """Whether ``f``'s action is for the whole node (module doc)."""
    return bool(NODE_LEVEL.search(f.action or ""))


def failed_targets(inst: Instance, gpu_findings: Iterable[Finding]) -> dict[str, str]:
    """Cordon targets for ``inst``'s failed members → ``check: message`` of the CRIT finding.

    A CRIT finding on one of its GPUs (subject ``gpu:N``) names that GPU, or
    its host when the finding's action is node-level; a host-wide CRIT
    finding (subject ``host``) names the host.
    """
    members = {(g.host, g.index) for g in inst.placement}
    hosts = {g.host for g in inst.placement}
    out: dict[str, str] = {}
    for f in gpu_findings:
        if f.severity != Severity.CRIT or f.host not in hosts:
            continue
        head = f.subject[4:].split("/")[0] if f.subject.startswith("gpu:") else ""
        if head.isdigit() and (f.host, int(head)) in members and node_level(f):
            out.setdefault(cordon_key(f.host), f"{f.check}: {f.message} on GPU {head} (node-level: {f.action})")
        elif head.isdigit() and (f.host, int(head)) in members:
            out.setdefault(cordon_key(f.host, int(head)), f"{f.check}: {f.message}")
        elif f.subject == "host":
            out.setdefault(cordon_key(f.host), f"{f.check}: {f.message}")
    return out


def _already_cordoned(state: DeployState, key: str) -> bool:
    host, _, gpu = key.partition(":")
    return key in state.cordons or state.host_cordoned(host) or (gpu.isdigit() and state.gpu_cordoned(host, int(gpu)))


def plan_failover(
    instances: Mapping[str, Instance],
    unavailable: Mapping[str, str],
    state: DeployState,
    inv: Inventory,
    *,
    max_share: float,
    gpu_findings: Iterable[Finding] = (),
    topology: Mapping[str, HostTopology] | None = None,
    who: str | None = None,
    when: str | None = None,
    avoid_hosts: Iterable[str] = (),
) -> FailoverPlan:
    """The failover decision (rules in the module doc).

    ``unavailable``: instance → doctor's ``tp.group`` message, for groups
    found UNAVAILABLE; names not in ``instances`` are ignored.  ``state`` is
    not changed: the cordons to add are in ``plan.cordons`` and the new
    placement in ``plan.placement``.
    """
    gpu_findings = list(gpu_findings)
    plan = FailoverPlan(total=len(instances), cap=cap_for(len(instances), max_share))
    plan.findings = {n: m for n, m in unavailable.items() if n in instances}
    chosen = sorted(plan.findings)[: plan.cap]
    plan.over_cap = sorted(plan.findings)[plan.cap :]
    who, when = who or who_am_i(), when or utc_now()
    for name in chosen:
        for key, why in failed_targets(instances[name], gpu_findings).items():
            if not _already_cordoned(state, key) and key not in plan.cordons:
                plan.cordons[key] = Cordon(reason=CORDON_PREFIX + why, who=who, when=when)
    if chosen:
        # A node-level finding anywhere (an instance over the cap, a GPU no instance uses) rules its whole
        # host out as a target: a group moved there would land on a node doctor says to drain.
        for f in gpu_findings:
            if (
                f.severity == Severity.CRIT
                and f.host
                and node_level(f)
                and not _already_cordoned(state, f.host)
                and f.host not in plan.cordons
            ):
                plan.cordons[f.host] = Cordon(
                    reason=CORDON_PREFIX + f"{f.check}: {f.message} on {f.subject} (node-level: {f.action})",
                    who=who,
                    when=when,
                )
        for host in avoid_hosts:
            if not _already_cordoned(state, host) and host not in plan.cordons:
                plan.cordons[host] = Cordon(reason=CORDON_PREFIX + AVOID_REASON, who=who, when=when)
    # A host cordon covers its GPUs: a GPU cordon of the same host in this plan says nothing more.
    for key in [k for k in plan.cordons if ":" in k and k.partition(":")[0] in plan.cordons]:
        del plan.cordons[key]
    replicas = [n for n in chosen if instances[n].template and n not in inv.instances]
    plan.fixed = [n for n in chosen if n not in replicas]
    plan.fixed_why = {
        n: why_not_moved(instances[n], failed_targets(instances[n], gpu_findings), getattr(inv, "path", ""))
        for n in plan.fixed
    }
    movable = [n for n in replicas if n in state.placements.get(instances[n].template or "", {})]
    plan.no_room = {n: "not recorded in placements.json yet (deploy places it)" for n in replicas if n not in movable}
    if not movable:
        return plan
    cordoned = state.copy()
    cordoned.cordons.update(plan.cordons)
    res = reschedule(inv, cordoned, movable, topology)
    plan.placement = res
    plan.no_room.update({n: res.not_moved[n] for n in movable if n in res.not_moved})
    for name in movable:
        if name in plan.no_room:
            continue
        tpl = instances[name].template or ""
        old = state.placements[tpl][name]
        plan.moves.append(Move(name, tpl, old, res.state.placements[tpl][name]))
    return plan
