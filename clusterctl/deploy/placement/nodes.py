"""Choosing the hosts of a ``nodes: N`` replica (pure; docs/placement.md, "Replicas across hosts").

A template with ``nodes: N`` (N > 1) asks for replicas that span N hosts, one
pipeline stage of ``tp`` GPUs on each (tensor parallel within a host, pipeline
parallel across hosts: docs/multinode.md).  :func:`choose` picks the N hosts
among candidates, each a host with ``tp`` free GPUs (its closest group, chosen
by the single-host rules in :mod:`clusterctl.deploy.placement.place`):

1. **One GPU model.** All N hosts have the same GPU model (a candidate set of
   mixed models is never formed).
2. **RDMA.** Hosts whose data NICs reach each other over RDMA (the fabric is
   ``roce`` or ``ib`` and the host has a data NIC with an ``rdma_device``)
   come before hosts without: a set is all-RDMA when it can be, since NCCL
   falls back to TCP sockets for the whole group when one member lacks RDMA.
3. **Same leaf.** Hosts under one leaf switch (the host's ``labels.leaf``,
   docs/inventory.md) come before sets across leaves; when no leaf has N
   candidates, the set takes the fewest leaves (the leaves with the most
   candidates first).  A host without a leaf label counts as its own leaf.
4. **Spread**, then **closeness**: the fewest replicas of the template on the
   chosen hosts, then the closest GPU groups, then inventory order.

The head (rank 0) is the chosen host first in inventory order; the workers
follow in inventory order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clusterctl.inventory.model import Host, Inventory


@dataclass(frozen=True)
class Candidate:
    """A host that can take one stage: its best free group and what ranks it."""

    host: str
    group: tuple[int, ...]
    cost: tuple[Any, ...]  # the group's closeness (smaller is better)
    load: int  # replicas of the template already on the host
    order: int  # inventory order
    model: str
    leaf: str | None
    rdma: bool


@dataclass(frozen=True)
class Choice:
    """The chosen stages (head first) and a line saying why these hosts."""

    stages: tuple[Candidate, ...]
    note: str


def rdma_capable(inv: Inventory, host: Host) -> bool:
    """Whether ``host``'s data NICs can carry NCCL over RDMA: an RDMA fabric and a data NIC with an RDMA device."""
    return inv.fabric.kind in ("roce", "ib") and any(n.rdma_device for n in host.nics_with_role("data"))


def candidate(
    inv: Inventory, host: str, group: tuple[int, ...], cost: tuple[Any, ...], load: int, order: int
) -> Candidate:
    """A :class:`Candidate` for ``host`` with its model, leaf and RDMA from the inventory."""
    h = inv.hosts[host]
    leaf = h.labels.get("leaf")
    return Candidate(
        host,
        group,
        cost,
        load,
        order,
        h.gpus.model or "?",
        str(leaf) if leaf not in (None, "") else None,
        rdma_capable(inv, h),
    )


def _key(c: Candidate) -> tuple[Any, ...]:
    return (c.load, c.cost, c.order)


def _leaf(c: Candidate) -> str:
    return c.leaf if c.leaf is not None else f"\0{c.host}"  # no label: its own leaf


def _from_leaves(pool: Sequence[Candidate], nodes: int) -> list[Candidate] | None:
    """``nodes`` of ``pool`` under one leaf if any leaf has that many (the best such set), else from the
    fewest leaves (most candidates first); best hosts by spread, closeness, inventory order."""
    leaves: dict[str, list[Candidate]] = {}
    for c in sorted(pool, key=_key):
        leaves.setdefault(_leaf(c), []).append(c)
    whole = [cs[:nodes] for cs in leaves.values() if len(cs) >= nodes]
    if whole:
        return min(whole, key=lambda cs: [_key(c) for c in cs])
    out: list[Candidate] = []
    for cs in sorted(leaves.values(), key=lambda cs: (-len(cs), _key(cs[0]))):
        out += cs[: nodes - len(out)]
        if len(out) == nodes:
            return out
    return None


def choose(cands: Sequence[Candidate], nodes: int) -> Choice | None:
    """The best ``nodes`` hosts among ``cands`` (rules in the module doc); ``None`` when no GPU model has
    ``nodes`` candidates."""
    best: tuple[tuple[Any, ...], list[Candidate], bool] | None = None
    models: dict[str, list[Candidate]] = {}
    for c in cands:
        models.setdefault(c.model, []).append(c)
    for pool in models.values():
        rdma = [c for c in pool if c.rdma]
        use, all_rdma = (rdma, True) if len(rdma) >= nodes else (pool, False)
        chosen = _from_leaves(use, nodes)
        if chosen is None:
            continue
        leaves = len({_leaf(c) for c in chosen})
        score = (
            not all_rdma,
            leaves,
            sum(c.load for c in chosen),
            max(c.cost for c in chosen),
            sorted(c.order for c in chosen),
        )
        if best is None or score < best[0]:
            best = (score, chosen, all_rdma)
    if best is None:
        return None
    _, chosen, all_rdma = best
    stages = tuple(sorted(chosen, key=lambda c: c.order))
    names = sorted({c.leaf for c in stages if c.leaf is not None})
    unlabelled = [c.host for c in stages if c.leaf is None]
    where = (
        f"leaf {names[0]}"
        if len(names) == 1 and not unlabelled
        else "across leaves " + ", ".join(names + [f"{h} (no leaf label)" for h in unlabelled])
    )
    return Choice(
        stages,
        f"{stages[0].model}, {where}, " + ("RDMA on every host" if all_rdma else "not all hosts have RDMA data NICs"),
    )
