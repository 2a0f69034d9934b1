"""What the RoCE, QoS and data-network checks share.

The fabric profile (inventory ``fabric``, the reference lossless profile when
there is no inventory), each host's RoCE NICs in its facts, the leaf switch
a host hangs off (inventory label ``leaf``), the ``roce`` thresholds
(``checks/roce.yaml``) and "odd one out" comparisons across hosts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clusterctl.diagnose.registry import AnalysisContext
from clusterctl.diagnose.thresholds import number, section
from clusterctl.inventory.model import FabricProfile
from clusterctl.inventory.nodeset import fold
from clusterctl.probe.factgroups import Nic, NicsFact

FILE = "roce"

#: Per-speed rows used when checks/roce.yaml has none (same as the shipped file).
DEFAULT_SPEEDS = [
    {"min_gbps": 400, "cnp_per_s_warn": 20000, "pause_per_s_warn": 10000},
    {"min_gbps": 200, "cnp_per_s_warn": 10000, "pause_per_s_warn": 5000},
    {"min_gbps": 100, "cnp_per_s_warn": 5000, "pause_per_s_warn": 2500},
    {"min_gbps": 25, "cnp_per_s_warn": 1250, "pause_per_s_warn": 600},
    {"min_gbps": 0, "cnp_per_s_warn": 500, "pause_per_s_warn": 250},
]


def profile(ctx: AnalysisContext) -> FabricProfile:
    """The inventory's fabric profile; the reference lossless profile without one."""
    inv = ctx.inventory
    fab = getattr(inv, "fabric", None) if inv is not None else None
    return fab if isinstance(fab, FabricProfile) else FabricProfile()


def is_roce_fabric(ctx: AnalysisContext) -> bool:
    return profile(ctx).kind == "roce"


def limit(ctx: AnalysisContext, group: str, key: str, default: float) -> float:
    """A number from ``checks/roce.yaml`` (``group.key``), ``default`` when absent."""
    return number(section(ctx.thresholds, FILE, group), key, default)


def speed_row(ctx: AnalysisContext, gbps: float | None) -> dict[str, float]:
    """The per-speed thresholds for a link of ``gbps`` (the slowest row when unknown)."""
    rows = (ctx.thresholds or {}).get(FILE, {}).get("speeds") if isinstance(ctx.thresholds, Mapping) else None
    if not isinstance(rows, list) or not rows:
        rows = DEFAULT_SPEEDS
    rows = sorted((r for r in rows if isinstance(r, dict)), key=lambda r: -float(r.get("min_gbps", 0)))
    for r in rows:
        if gbps is not None and gbps >= float(r.get("min_gbps", 0)):
            return {k: float(v) for k, v in r.items()}
    return {k: float(v) for k, v in rows[-1].items()}


def hosts(ctx: AnalysisContext) -> list[str]:
    """Hosts with facts, in inventory order where the inventory knows them."""
    names = list(ctx.facts)
    if ctx.inventory is not None:
        order = {h: i for i, h in enumerate(ctx.inventory.hosts)}
        names.sort(key=lambda h: order.get(h, len(order)))
    return names


def roce_nics(ctx: AnalysisContext, host: str) -> list[Nic]:
    """The host's NICs with a netdev and an RDMA port on Ethernet (none without facts)."""
    nics = ctx.fact(host, NicsFact)
    return nics.roce if nics is not None else []


def leaf_of(ctx: AnalysisContext, host: str) -> str | None:
    """The ``leaf`` label of the host in the inventory, ``None`` without one."""
    inv = ctx.inventory
    if inv is None or host not in inv.hosts:
        return None
    leaf = inv.hosts[host].labels.get("leaf")
    return str(leaf) if leaf is not None else None


def node_setup_command(hosts: Iterable[str]) -> str:
    """An action's tail naming ``clusterctl node setup`` for ``hosts`` (docs/bring-up.md)."""
    return f"; `clusterctl node setup --hosts '{folded(sorted(hosts))}'` converges it (--plan first shows the changes)"


def folded(names: Iterable[str]) -> str:
    names = list(names)
    try:
        return fold(names)
    except Exception:  # noqa: BLE001 - names that do not fold are listed
        return ",".join(names)


@dataclass
class LeafVerdict:
    """How a symptom spreads over the leaves: ``leaves`` (leaf -> its affected
    hosts) where at least ``leaf_fraction`` of a leaf's (2 or more) hosts are
    affected, ``members`` (leaf -> hosts checked under it)."""

    leaves: dict[str, list[str]]
    members: dict[str, list[str]]

    def leaf_for(self, host: str) -> str | None:
        for leaf, hit in self.leaves.items():
            if host in hit:
                return leaf
        return None


def by_leaf(ctx: AnalysisContext, checked: Iterable[str], affected: Iterable[str]) -> LeafVerdict:
    """Group ``affected`` hosts by leaf among the ``checked`` ones."""
    frac = limit(ctx, "pfc", "leaf_fraction", 0.75)
    hit = set(affected)
    members: dict[str, list[str]] = {}
    for h in checked:
        leaf = leaf_of(ctx, h)
        if leaf is not None:
            members.setdefault(leaf, []).append(h)
    leaves = {}
    for leaf, hs in members.items():
        bad = [h for h in hs if h in hit]
        if len(hs) >= 2 and len(bad) >= 2 and len(bad) / len(hs) >= frac:
            leaves[leaf] = bad
    return LeafVerdict(leaves, members)


def host_action(verdict: LeafVerdict, ctx: AnalysisContext, host: str, alone: str, symptom: str) -> str:
    """The action for one affected host: the leaf switch when its whole leaf
    shows ``symptom``, else ``alone`` plus how its leaf neighbours look."""
    leaf = verdict.leaf_for(host)
    if leaf is not None:
        return f"look at the leaf switch {leaf}: every host under it shows {symptom} ({folded(verdict.leaves[leaf])})"
    own = leaf_of(ctx, host)
    others = [h for h in verdict.members.get(own or "", []) if h != host]
    if others:
        return f"{alone}; the other hosts under {own} ({folded(others)}) do not show {symptom}"
    return alone


def odd_one_out(
    values: Mapping[str, Hashable], host: str, expected: Hashable | None, show: Callable[[Any], str] = str
) -> str:
    """How ``values[host]`` compares with the profile's ``expected`` and the other hosts:
    ``"the profile and the other 7 hosts use 3"``, ``"the other 7 hosts use 3 (the
    profile says 4)"``, or ``"the profile says 3"`` when no other host has a value."""
    others = Counter(v for h, v in values.items() if h != host)
    if not others:
        return f"the profile says {show(expected)}" if expected is not None else "no other host to compare"
    common, n = others.most_common(1)[0]
    total = sum(others.values())
    if n == total:
        some = "the other host uses" if n == 1 else f"the other {n} hosts use"
    else:
        some = f"{n} of the other {total} hosts use"
    if expected is None:
        return f"{some} {show(common)}"
    if common == expected:
        return f"the profile and {some} {show(expected)}"
    too = " too" if values.get(host) == common else ""
    return f"{some} {show(common)}{too} (the profile says {show(expected)})"
