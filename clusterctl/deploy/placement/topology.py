"""GPU topology for placement, read from the hosts only when something must be placed.

Placement is stable, so most deploys place nothing new and need no topology.
:func:`place` computes the placement without it first and probes only the
hosts where a replica would be placed (the patterns of templates with new,
moved or unplaced replicas, minus cordoned hosts); then places again with it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from clusterctl.deploy.placement.place import HostTopology, PlacementResult, desired_instances, replica_number
from clusterctl.deploy.state import DeployState
from clusterctl.inventory.model import Host, Inventory
from clusterctl.inventory.select import select_hosts
from clusterctl.probe.factgroups import GpuSection
from clusterctl.probe import run as probe_run

#: ``read(hosts)`` → host → facts ``gpus.topology``; hosts it cannot read are left out.
TopologyReader = Callable[[list[str]], Mapping[str, HostTopology]]


def host_topology(gpus: GpuSection) -> list[dict[str, Any]]:
    """A host's GPU pairs (the typed ``gpus.topology`` of its facts) in :data:`HostTopology`'s shape."""
    return [{"gpus": list(t.gpus), "level": t.level} for t in gpus.pairs]


def hosts_to_probe(inv: Inventory, state: DeployState, res: PlacementResult) -> list[str]:
    """Hosts (inventory order) where a replica of ``res`` still needs a place."""
    pending = set(res.new) | set(res.moved) | set(res.unplaced)
    wanted: set[str] = set()
    for tpl in inv.templates.values():
        if any(replica_number(tpl.name, n) is not None for n in pending):
            wanted.update(h.name for h in select_hosts(inv, tpl.hosts) if not state.host_cordoned(h.name))
    return [h for h in inv.hosts if h in wanted]


def place(inv: Inventory, state: DeployState, read: TopologyReader | None = None) -> tuple[PlacementResult, list[str]]:
    """The placement, using the topology of the hosts that receive new replicas.

    Returns the result and the hosts whose topology was asked for but not had
    (they were placed by contiguous indexes).  ``read`` None: no topology.
    """
    res = desired_instances(inv, state)
    if read is None or not (res.new or res.moved):
        return res, []
    hosts = hosts_to_probe(inv, state, res)
    topology = dict(read(hosts)) if hosts else {}
    missing = [h for h in hosts if not topology.get(h)]
    return desired_instances(inv, state, topology=topology), missing


def fleet_reader(make_fleet: Callable[[Sequence[Host]], Any], inv: Inventory, timeout: float = 60.0) -> TopologyReader:
    """A :data:`TopologyReader` that runs the probe (one round trip per host, ``timeout`` seconds)."""

    def read(hosts: list[str]) -> dict[str, HostTopology]:
        with make_fleet([inv.hosts[h] for h in hosts]) as fleet:
            results = probe_run.collect_facts(fleet, timeout=timeout)
        return {
            h: host_topology(r.facts.gpus)
            for h, r in results.items()
            if r.status == "ok" and r.facts is not None and r.facts.gpus.pairs
        }

    return read
