"""Placement: template replicas onto free GPU groups (pure; no I/O).

A template (``replicas`` x ``tp`` over a host pattern) expands into instances
named ``<template>-<n>`` (n = 1, 2, ...).  The rules, in order:

* **Stable.** A replica recorded in the state keeps its host, GPUs and port
  while they stay valid (host still in the inventory and the template's
  pattern, GPUs exist, TP size unchanged, no explicit instance claims them);
  only replicas without a place are placed.  Adding a host moves nothing.
* **Scale.** The replica count is the state's override (``clusterctl scale``)
  or else the inventory's ``replicas``; scaling down drops the
  highest-numbered replicas, scaling up adds the lowest missing numbers.
* **Free GPUs.** GPUs of explicit instances and of every replica kept are not
  free.  New placements avoid cordoned hosts and GPUs; a replica already on a
  cordoned GPU stays (listed in ``on_cordoned``) unless the caller moves it
  with :func:`reschedule`.  Placement never changes a cordon.
* **One host per TP group, close together.** Among a host's free GPUs the
  group with the nearest worst pair is chosen, by the probe's topology levels
  (facts ``gpus.topology``: INTERNAL < SINGLE (one PCIe switch) < MULTIPLE <
  HOSTBRIDGE < NODE (same socket) < SYSTEM < unknown), then the smaller sum of
  levels, then the best fit (the smallest run of consecutive free indexes
  that holds it), then the narrowest span of indexes (without topology:
  contiguous indexes), then the lowest indexes.
* **Spread.** A new replica goes to the host with the fewest replicas of its
  template, then the closest group, then inventory order.
* **CPU engines.** A template whose engine has ``device: cpu`` (tp 1) takes
  no GPU: each replica takes its host's CPU slot (``host:cpu``,
  :data:`~clusterctl.inventory.model.CPU_SLOT`), so hosts without GPUs
  qualify and any number of its replicas may share a host (pre-flight checks
  the host's RAM).  It spreads like the others (fewest replicas, then
  inventory order) and avoids cordoned hosts.
* **Ports.** ``port_base`` + the replica's slot on its host: the lowest
  offset whose port no other instance on that host uses.  A kept replica keeps
  its port unless it collides or is below ``port_base``.
* **Across hosts.** A template with ``nodes: N`` (N > 1) places each replica
  on N hosts, one stage of ``tp`` GPUs on each (the closest group of each
  host, as above); :mod:`clusterctl.deploy.placement.nodes` chooses the hosts
  (one GPU model, RDMA, the same leaf, spread).  Its port is the lowest from
  ``port_base`` free on all N hosts; a recorded place is kept while every
  stage stays valid.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from dataclasses import dataclass, field, fields, replace
from math import comb
from typing import Any, Collection, Iterable, Mapping, Sequence

from clusterctl.deploy.placement.nodes import Choice, candidate, choose
from clusterctl.deploy.state import DeployState, Placement, cordon_key
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import CPU_SLOT, GpuRef, Instance, InstanceTemplate, Inventory
from clusterctl.inventory.nodeset import fold
from clusterctl.inventory.select import select_hosts

#: NVML common-ancestor levels, nearest first (docs/facts.md, ``gpus.topology``).
LEVEL_RANK = {"INTERNAL": 0, "SINGLE": 1, "MULTIPLE": 2, "HOSTBRIDGE": 3, "NODE": 4, "SYSTEM": 5}
UNKNOWN_RANK = 6
#: Above this many candidate groups on one host, only contiguous runs of free indexes are tried.
MAX_COMBINATIONS = 5000

#: One host's ``gpus.topology`` facts: entries ``{"gpus": [a, b], "level": "NODE"}``.
HostTopology = Sequence[Mapping[str, Any]]


class PlacementError(ClusterctlError):
    """The request cannot be placed as asked (a name clash, a replica that does not exist)."""


@dataclass
class PlacementResult:
    """What the inventory plus the state mean, and what changed.

    ``instances``: every instance that should run, explicit ones first, then
    each template's replicas by number.  ``new``: replicas that got a place
    this time and had none.  ``moved``: replica → why it got a new place.
    ``removed``: replicas in the state that are no longer wanted (scale down,
    template gone).  ``unplaced``: replica → why it has no place (it is not in
    ``instances``).  ``on_cordoned``: kept replica → the cordon it sits on.
    ``not_moved``: replica :func:`reschedule` was asked to move but could not
    (it stays where it was) → why.  ``state``: the state to save once the
    caller applies (``StateStore.save_placements(result.state.placements)``).
    """

    instances: dict[str, Instance]
    state: DeployState
    new: list[str] = field(default_factory=list)
    moved: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    unplaced: dict[str, str] = field(default_factory=dict)
    on_cordoned: dict[str, str] = field(default_factory=dict)
    not_moved: dict[str, str] = field(default_factory=dict)
    #: replica across hosts placed this time (new or moved) -> where and why there (nodes.Choice.note)
    spans: dict[str, str] = field(default_factory=dict)

    before: dict[str, dict[str, Placement]] = field(default_factory=dict, repr=False)

    @property
    def changed(self) -> bool:
        """Whether ``state.placements`` differs from the state given (something to save)."""
        return self.state.placements != self.before


def replica_name(template: str, n: int) -> str:
    """The name of replica ``n`` (1-based) of ``template``."""
    return f"{template}-{n}"


def replica_number(template: str, name: str) -> int | None:
    """``n`` for a name ``<template>-<n>``; ``None`` for any other name."""
    prefix = f"{template}-"
    rest = name[len(prefix) :] if name.startswith(prefix) else ""
    return int(rest) if rest.isdigit() and not rest.startswith("0") else None


def desired_replicas(tpl: InstanceTemplate, state: DeployState) -> int:
    """The replica count: the ``scale`` override when set, else the inventory's."""
    return state.replicas.get(tpl.name, tpl.replicas)


def _rank(level: Any) -> int:
    return LEVEL_RANK.get(str(level).upper(), UNKNOWN_RANK) if level is not None else UNKNOWN_RANK


def _pair_ranks(topology: HostTopology | None) -> dict[tuple[int, int], int] | None:
    if not topology:
        return None
    ranks: dict[tuple[int, int], int] = {}
    for entry in topology:
        pair = entry.get("gpus")
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(g, int) for g in pair):
            a, b = sorted(pair)
            ranks[(a, b)] = _rank(entry.get("level"))
    return ranks


def _group_cost(
    group: tuple[int, ...],
    ranks: dict[tuple[int, int], int] | None,
    run_of: Mapping[int, tuple[int, int]] | None = None,
) -> tuple[int, ...]:
    """Smaller is better: (worst pair level, sum of levels, fit, span, the indexes).

    ``fit`` is the total length of the runs of consecutive free indexes the
    group takes GPUs from (``run_of``: index -> (run start, run length)):
    taking from the smallest hole that holds the group keeps larger runs
    whole for later, wider groups (best fit).
    """
    span = group[-1] - group[0]
    # Without topology every pair counts as unknown: constant within the host, and
    # a host with known close GPUs wins over one whose layout nobody reported.
    levels = [
        UNKNOWN_RANK if ranks is None else ranks.get((a, b), UNKNOWN_RANK) for a, b in itertools.combinations(group, 2)
    ]
    fit = sum(dict(run_of[g] for g in group).values()) if run_of else 0
    return (max(levels, default=0), sum(levels), fit, span, *group)


def _runs(free: list[int]) -> dict[int, tuple[int, int]]:
    """Sorted free index -> (start, length) of the run of consecutive indexes it is in."""
    out: dict[int, tuple[int, int]] = {}
    start = 0
    for i in range(1, len(free) + 1):
        if i == len(free) or free[i] != free[i - 1] + 1:
            for g in free[start:i]:
                out[g] = (free[start], i - start)
            start = i
    return out


def best_group(free: Sequence[int], tp: int, topology: HostTopology | None = None) -> tuple[int, ...] | None:
    """The closest ``tp`` GPUs among ``free`` indexes (rules in the module doc); ``None`` if too few."""
    found = _best_group(sorted(free), tp, _pair_ranks(topology))
    return found[1] if found else None


def _best_group(
    free: list[int], tp: int, ranks: dict[tuple[int, int], int] | None
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(cost, group) of the closest ``tp`` of the sorted ``free`` indexes; ``None`` if too few."""
    if tp < 1 or len(free) < tp:
        return None
    candidates: Iterable[tuple[int, ...]]
    if _combinations(len(free), tp) <= MAX_COMBINATIONS:
        candidates = itertools.combinations(free, tp)
    else:
        candidates = (tuple(free[i : i + tp]) for i in range(len(free) - tp + 1))
    run_of = _runs(free)
    return min((_group_cost(g, ranks, run_of), g) for g in candidates)


def _combinations(n: int, k: int) -> int:
    return comb(n, k)


class _Board:
    """The GPUs and ports taken so far, per host."""

    def __init__(self, inv: Inventory, state: DeployState) -> None:
        self.inv = inv
        self.state = state
        self.gpu_owner: dict[GpuRef, str] = {}
        self.ports: dict[str, set[int]] = {}

    def claim(self, name: str, host: str, gpus: Iterable[int], port: int | None) -> None:
        for i in gpus:
            if i != CPU_SLOT:  # a CPU slot is no GPU: replicas share it
                self.gpu_owner[GpuRef(host, i)] = name
        if port is not None:
            self.ports.setdefault(host, set()).add(port)

    def free(self, host: str, avoid: Collection[GpuRef] = ()) -> list[int]:
        """Free, uncordoned GPU indexes of ``host`` (none when the host is cordoned)."""
        if self.state.host_cordoned(host):
            return []
        return [
            i
            for i in range(self.inv.hosts[host].gpus.count)
            if GpuRef(host, i) not in self.gpu_owner
            and GpuRef(host, i) not in avoid
            and not self.state.gpu_cordoned(host, i)
        ]

    def port(self, host: str, base: int) -> int | None:
        """The lowest ``base + slot`` no instance on ``host`` uses; ``None`` past 65535."""
        used = self.ports.get(host, set())
        return next((p for p in range(base, 65536) if p not in used), None)

    def common_port(self, hosts: Iterable[str], base: int, mine: Placement | None = None) -> int | None:
        """The lowest port from ``base`` that no instance uses on any of ``hosts`` (a replica across hosts
        takes its port on each); ``mine``'s own port counts as free on its own hosts; ``None`` past 65535."""
        used = [self.ports.get(h, set()) - ({mine.port} if mine and h in mine.hosts else set()) for h in hosts]
        return next((p for p in range(base, 65536) if all(p not in u for u in used)), None)


def on_cpu(inv: Inventory, tpl: InstanceTemplate) -> bool:
    """Whether ``tpl``'s engine runs on CPUs (``device: cpu``): its replicas take CPU slots, no GPUs."""
    engine = inv.engines.get(tpl.engine)
    return engine is not None and engine.device == "cpu"


def _invalid(inv: Inventory, tpl: InstanceTemplate, hosts: set[str], p: Placement, board: _Board) -> str | None:
    """Why a recorded placement can no longer be kept; ``None`` when it can."""
    if len(p.stages) != tpl.nodes:
        return f"nodes changed from {len(p.stages)} to {tpl.nodes}"
    if len(p.stages) > 1:
        return _invalid_stages(inv, tpl, hosts, p, board)
    if p.host not in inv.hosts:
        return f"host {p.host} is no longer in the inventory"
    if p.host not in hosts:
        return f"host {p.host} no longer matches hosts {tpl.hosts!r}"
    cpu = on_cpu(inv, tpl)
    if cpu != (p.gpus == (CPU_SLOT,)):
        return "engine now runs on CPU" if cpu else "engine now runs on GPUs"
    if cpu:
        return None
    if len(p.gpus) != tpl.tp:
        return f"TP size changed from {len(p.gpus)} to {tpl.tp}"
    count = inv.hosts[p.host].gpus.count
    for i in p.gpus:
        ref = GpuRef(p.host, i)
        if i >= count:
            return f"GPU {ref} no longer exists ({p.host} has {count})"
        if ref in board.gpu_owner:
            return f"GPU {ref} is now used by {board.gpu_owner[ref]}"
    return None


def _invalid_stages(inv: Inventory, tpl: InstanceTemplate, hosts: set[str], p: Placement, board: _Board) -> str | None:
    """:func:`_invalid` for a replica across hosts: every stage must still be valid, and one GPU model."""
    if len(set(p.hosts)) != len(p.hosts):
        return "two of its stages are on one host"
    for host, gpus in p.stages:
        why = _invalid(inv, replace(tpl, nodes=1), hosts, Placement(host, gpus, p.port), board)
        if why:
            return why
    models = {inv.hosts[h].gpus.model for h in p.hosts}
    if len(models) > 1:
        return f"its hosts now have different GPU models ({', '.join(sorted(map(str, models)))})"
    return None


def _cordon_of(state: DeployState, p: Placement) -> str | None:
    for key in [k for h, gpus in p.stages for k in [cordon_key(h)] + [cordon_key(h, i) for i in gpus]]:
        if key in state.cordons:
            c = state.cordons[key]
            return f"{key} cordoned by {c.who} at {c.when}" + (f": {c.reason}" if c.reason else "")
    return None


#: What a replica takes from its template: every field the two classes share but the name.
_FROM_TEMPLATE = tuple(
    sorted({f.name for f in fields(Instance)} & {f.name for f in fields(InstanceTemplate)} - {"name"})
)


def _instance(tpl: InstanceTemplate, name: str, p: Placement) -> Instance:
    """Replica ``name`` of ``tpl`` at ``p``: model, engine, args, env, secrets, ... copied from the template."""
    carried = {k: copy.copy(getattr(tpl, k)) for k in _FROM_TEMPLATE}
    # across hosts: the head's GPUs first (its host is rank 0: inventory/multinode.hosts_in_order)
    return Instance(
        name=name,
        placement=tuple(GpuRef(h, i) for h, gpus in p.stages for i in sorted(gpus)),
        port=p.port,
        template=tpl.name,
        **carried,
    )


def _no_room(inv: Inventory, tpl: InstanceTemplate, hosts: list[str], board: _Board, avoid: Collection[GpuRef]) -> str:
    cordoned = [h for h in hosts if board.state.host_cordoned(h)]
    if on_cpu(inv, tpl):
        return (
            f"no uncordoned host with a free port from {tpl.port_base} in {tpl.hosts!r} (engine "
            f"{tpl.engine} runs on CPU)" + (f"; cordoned hosts: {fold(cordoned)}" if cordoned else "")
        )
    free = {h: len(board.free(h, avoid)) for h in hosts if h not in cordoned}
    detail = ", ".join(f"{h} {n}" for h, n in free.items()) or "none"
    need = (
        f"{tpl.tp} on one host"
        if tpl.nodes == 1
        else f"{tpl.tp} on each of {tpl.nodes} hosts with one GPU model and a common free port"
    )
    text = f"not enough free uncordoned GPUs: needs {need} of {tpl.hosts!r}; free per host: {detail}"
    return text + (f"; cordoned hosts: {fold(cordoned)}" if cordoned else "")


def desired_instances(
    inv: Inventory,
    state: DeployState,
    *,
    topology: Mapping[str, HostTopology] | None = None,
    move: Collection[str] = (),
) -> PlacementResult:
    """Every instance the inventory and the state ask for, placing what has no place.

    ``topology`` maps a host to its facts ``gpus.topology`` (hosts without an
    entry use contiguous indexes).  ``move`` names replicas to place anew
    away from the GPUs they hold (what :func:`reschedule` uses).  ``state`` is
    not changed; ``result.state`` is the updated copy.  Raises
    :class:`PlacementError` when an explicit instance has a replica's name.
    """
    topology = topology or {}
    out = DeployState(placements={}, cordons=dict(state.cordons), replicas=dict(state.replicas))
    board = _Board(inv, state)
    result = PlacementResult(instances=dict(inv.instances), state=out, before=state.placements)
    for inst in inv.instances.values():
        for ref in inst.placement:
            board.gpu_owner[ref] = inst.name
        for host in inst.hosts:
            board.ports.setdefault(host, set()).add(inst.port)

    wanted: dict[str, tuple[InstanceTemplate, list[str], list[str]]] = {}
    for tpl in inv.templates.values():
        names = [replica_name(tpl.name, n) for n in range(1, desired_replicas(tpl, state) + 1)]
        clash = [n for n in names if n in inv.instances]
        if clash:
            inst = inv.instances[clash[0]]
            where = f" ({inst.location})" if inst.location else ""
            raise PlacementError(
                f"instance {clash[0]}{where} has the name of a replica of template {tpl.name}; rename the instance"
            )
        wanted[tpl.name] = (tpl, names, [h.name for h in select_hosts(inv, tpl.hosts)])
    for tpl_name, recorded in state.placements.items():
        if tpl_name not in wanted:
            result.removed.extend(recorded)

    # Keep every valid recorded placement first, so new replicas of one
    # template never take the GPUs of another template's existing replicas.
    kept: dict[str, dict[str, Placement]] = {}
    why_new: dict[str, str] = {}  # replica with a recorded place it must leave -> why
    avoid: set[GpuRef] = set()
    for tpl, names, hosts in wanted.values():
        recorded = state.placements.get(tpl.name, {})
        kept[tpl.name] = {}
        host_set = set(hosts)
        for name in sorted(recorded, key=lambda n: replica_number(tpl.name, n) or 0):
            p = recorded[name]
            if name not in names:
                result.removed.append(name)
                continue
            if name in move:
                avoid.update(GpuRef(h, i) for h, gpus in p.stages for i in gpus)
                for h in p.hosts:  # free again only once it has moved
                    board.ports.setdefault(h, set()).add(p.port)
                why_new[name] = "moved on request"
                continue
            why = _invalid(inv, tpl, host_set, p, board)
            if why:
                why_new[name] = why
                continue
            for h, gpus in p.stages:
                board.claim(name, h, gpus, None)
            kept[tpl.name][name] = p
    for tpl, names, hosts in wanted.values():
        for name, p in list(kept[tpl.name].items()):
            taken = [board.ports.setdefault(h, set()) for h in p.hosts]
            port = (
                p.port
                if p.port >= tpl.port_base and all(p.port not in u for u in taken)
                else board.common_port(p.hosts, tpl.port_base)
            )
            if port is None:
                why_new[name] = f"no free port from {tpl.port_base} on {'/'.join(p.hosts)}"
                del kept[tpl.name][name]
                continue
            for u in taken:
                u.add(port)
            kept[tpl.name][name] = replace(p, port=port)

    for tpl, names, hosts in wanted.values():
        placed = out.placements.setdefault(tpl.name, {})
        per_host = {h: 0 for h in hosts}
        for p in kept[tpl.name].values():
            for h in p.hosts:
                per_host[h] = per_host.get(h, 0) + 1
        queue: _HostQueue | _StageChooser | None = None  # built on the first replica to place
        no_room = ""
        for name in names:
            p_kept = kept[tpl.name].get(name)
            if p_kept is not None:
                placed[name] = p_kept
                cordon = _cordon_of(state, p_kept)
                if cordon:
                    result.on_cordoned[name] = cordon
                continue
            previous = state.placements.get(tpl.name, {}).get(name) if name in move else None
            queue = queue or (
                _StageChooser(inv, tpl, hosts, per_host, board, topology, avoid)
                if tpl.nodes > 1
                else _HostQueue(tpl, hosts, per_host, board, topology, avoid, on_cpu(inv, tpl))
            )
            p_new = queue.place(previous)
            if p_new is None:
                no_room = no_room or _no_room(inv, tpl, hosts, board, avoid)
                result.unplaced[name] = no_room
                continue
            for h, gpus in p_new.stages:
                board.claim(name, h, gpus, p_new.port)
                per_host[h] += 1
                queue.refresh(h)
            if isinstance(queue, _StageChooser) and queue.last is not None:
                result.spans[name] = describe(p_new, queue.last)
            placed[name] = p_new
            if name in why_new:
                result.moved[name] = why_new[name]
            else:
                result.new.append(name)
        if not placed:
            del out.placements[tpl.name]
        for name, p in sorted(placed.items(), key=lambda kv: replica_number(tpl.name, kv[0]) or 0):
            result.instances[name] = _instance(tpl, name, p)
    return result


class _HostQueue:
    """The hosts of one template, best first: fewest replicas of it, closest free group, inventory order.

    A heap of (key, version, host); only the host that just received a
    replica is re-scored, so placing R replicas over H hosts costs about
    R log H, not R x H.
    """

    def __init__(
        self,
        tpl: InstanceTemplate,
        hosts: list[str],
        per_host: dict[str, int],
        board: _Board,
        topology: Mapping[str, HostTopology],
        avoid: Collection[GpuRef],
        cpu: bool = False,
    ) -> None:
        self.tpl, self.per_host, self.board, self.avoid, self.cpu = tpl, per_host, board, avoid, cpu
        self.order = {h: i for i, h in enumerate(hosts)}
        self.ranks = {h: _pair_ranks(topology.get(h)) for h in hosts}
        self.version = dict.fromkeys(hosts, 0)
        self.group: dict[str, tuple[int, ...]] = {}
        self.heap: list[tuple[tuple[Any, ...], int, str]] = []
        for h in hosts:
            self.refresh(h)

    def refresh(self, host: str) -> None:
        """Re-score ``host`` after its free GPUs or replica count changed."""
        self.version[host] += 1
        if self.cpu:  # the host's CPU slot: free unless the host is cordoned (or a moving replica leaves it)
            free = not self.board.state.host_cordoned(host) and GpuRef(host, CPU_SLOT) not in self.avoid
            found: tuple[tuple[int, ...], tuple[int, ...]] | None = ((0, 0, 0), (CPU_SLOT,)) if free else None
        else:
            found = _best_group(self.board.free(host, self.avoid), self.tpl.tp, self.ranks[host])
        if found is None:
            self.group.pop(host, None)
            return
        cost, group = found
        self.group[host] = group
        key = (self.per_host.get(host, 0), cost[:3], self.order[host])
        heapq.heappush(self.heap, (key, self.version[host], host))

    def place(self, previous: Placement | None) -> Placement | None:
        """The best free group and its port for one new replica, or ``None`` when none is left.

        ``previous``: where a moving replica was (its port stays claimed, and is
        reused when it lands on that host again).
        """
        while self.heap:
            _, version, host = heapq.heappop(self.heap)
            if version != self.version[host] or host not in self.group:
                continue  # stale entry
            group = self.group[host]
            if previous is not None and previous.host == host and previous.port >= self.tpl.port_base:
                return Placement(host, group, previous.port)
            port = self.board.port(host, self.tpl.port_base)
            if port is not None:
                return Placement(host, group, port)
            self.group.pop(host)  # no port left on this host
        return None


class _StageChooser:
    """The hosts of one ``nodes: N`` template: N hosts per replica (placement/nodes.py: choose), each
    with its closest free group of ``tp`` GPUs and a port free on all of them."""

    def __init__(
        self,
        inv: Inventory,
        tpl: InstanceTemplate,
        hosts: list[str],
        per_host: dict[str, int],
        board: _Board,
        topology: Mapping[str, HostTopology],
        avoid: Collection[GpuRef],
    ) -> None:
        self.inv, self.tpl, self.hosts, self.per_host, self.board, self.avoid = inv, tpl, hosts, per_host, board, avoid
        self.ranks = {h: _pair_ranks(topology.get(h)) for h in hosts}
        self.groups: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.last: Choice | None = None
        for h in hosts:
            self.refresh(h)

    def refresh(self, host: str) -> None:
        found = _best_group(self.board.free(host, self.avoid), self.tpl.tp, self.ranks[host])
        if found is None:
            self.groups.pop(host, None)
        else:
            self.groups[host] = found

    def place(self, previous: Placement | None) -> Placement | None:
        """N hosts' stages and a common port for one new replica, or ``None`` when they cannot be found."""
        cands = [
            candidate(self.inv, h, group, cost[:3], self.per_host.get(h, 0), i)
            for i, h in enumerate(self.hosts)
            if h in self.groups
            for cost, group in [self.groups[h]]
        ]
        while True:
            self.last = choice = choose(cands, self.tpl.nodes)
            if choice is None:
                return None
            names = [c.host for c in choice.stages]
            port = (
                previous.port
                if previous is not None
                and previous.port >= self.tpl.port_base
                and self.board.common_port(names, previous.port, previous) == previous.port
                else self.board.common_port(names, self.tpl.port_base)
            )
            if port is not None:
                head, *rest = choice.stages
                return Placement(head.host, head.group, port, tuple((c.host, c.group) for c in rest))
            worst = max(choice.stages, key=lambda c: len(self.board.ports.get(c.host, ())))
            cands = [c for c in cands if c.host != worst.host]  # no port in common: drop the busiest


def describe(p: Placement, choice: Choice | None = None) -> str:
    """One line for a replica across hosts: its stages (head first), port, and why these hosts."""
    stages = ", ".join(
        f"{h} GPUs {','.join(map(str, g))}" + (" (head)" if n == 0 else f" (rank {n})")
        for n, (h, g) in enumerate(p.stages)
    )
    return f"{len(p.stages)} hosts: {stages}; port {p.port}" + (f"; {choice.note}" if choice else "")


def reschedule(
    inv: Inventory,
    state: DeployState,
    instance_names: Collection[str],
    topology: Mapping[str, HostTopology] | None = None,
) -> PlacementResult:
    """Move the named template replicas to free uncordoned GPUs, never back onto the ones they left.

    For failover.  Every other replica stays put.  A replica that finds no
    room stays where it was and is listed in ``not_moved`` with the reason.
    Raises :class:`PlacementError` for a name that is not a placed template
    replica (explicit instances are fixed by the inventory).
    """
    recorded = {name: tpl for tpl, reps in state.placements.items() for name in reps}
    for name in instance_names:
        if name in inv.instances:
            raise PlacementError(f"{name} is an explicit instance; its GPUs are fixed in the inventory")
        if name not in recorded or recorded[name] not in inv.templates:
            raise PlacementError(f"{name} is not a placed replica of any template")
    result = desired_instances(inv, state, topology=topology, move=set(instance_names))
    for name in instance_names:
        if name in result.unplaced:
            tpl = inv.templates[recorded[name]]
            p = state.placements[recorded[name]][name]
            result.not_moved[name] = result.unplaced.pop(name)
            result.state.placements.setdefault(tpl.name, {})[name] = p
            result.instances[name] = _instance(tpl, name, p)
    return result
