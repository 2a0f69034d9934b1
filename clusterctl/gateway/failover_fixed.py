"""Why ``clusterctl failover`` does not move an explicit instance, in words an operator can act on.

An explicit instance (``instances:`` in the inventory) runs where the inventory says: its ``placement``
names the hosts and GPUs.  Failover moves only template replicas, whose place clusterctl chose and keeps in
``placements.json``; moving an explicit instance would put the inventory and the hosts at odds (the next
``deploy`` would restart it on the failed GPUs, ``drift`` would report the unit it left).  So failover marks
it down at the gateway and says, per instance, which member failed and what to change: its ``placement``
in the inventory (then ``deploy --instances NAME``), or a template (``nodes: N`` for a replica across
hosts, docs/multinode.md) so that failover can move it.  The same for one host and for many.
"""

from __future__ import annotations

from collections.abc import Iterable

from clusterctl.inventory.model import Instance


def stages(inst: Instance) -> str:
    """``gpu01 GPUs 0,1 + gpu02 GPUs 0,1``: the placement, host by host in placement order."""
    by_host: dict[str, list[str]] = {}
    for g in inst.placement:
        by_host.setdefault(g.host, []).append("cpu" if g.is_cpu else str(g.index))
    return " + ".join(f"{h} GPUs {','.join(gs)}" for h, gs in by_host.items())


def why_not_moved(inst: Instance, failed: Iterable[str], inventory_path: str = "") -> str:
    """The reason ``failover`` gives for leaving ``inst`` where it is; ``failed``: its failed targets
    (``HOST`` or ``HOST:GPU``, :func:`clusterctl.gateway.failover_plan.failed_targets`)."""
    where = f" ({inventory_path})" if inventory_path else ""
    bad = ", ".join(sorted(failed)) or "its TP group"
    nodes = f" (`nodes: {len(inst.hosts)}`: one stage per host)" if len(inst.hosts) > 1 else ""
    return (
        f"explicit placement in the inventory{where}: {stages(inst)}; failed: {bad}; failover does not move it "
        f"(the next deploy would put it back there): change its placement and run "
        f"`clusterctl deploy --instances {inst.name}`, or make it a template replica{nodes}, which failover moves"
    )
