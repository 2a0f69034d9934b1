"""``scale``: change a template's replica count (an override kept in the deploy state).

The override (``replicas.json``) wins over the inventory's ``replicas`` until
it is reset.  What it means is computed by placement: scaling up adds the
lowest missing replica numbers, scaling down drops the highest ones; nothing
else moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from clusterctl.deploy.placement.place import (
    HostTopology,
    PlacementResult,
    desired_instances,
    desired_replicas,
    replica_number,
)
from clusterctl.deploy.state import DeployState, StateStore
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.fields import suggest
from clusterctl.inventory.model import Inventory
from clusterctl.inventory.multinode import member_name
from clusterctl.inventory.select import select_hosts

MAX_REPLICAS = 65535


class ScaleError(ClusterctlError):
    """An unknown template or a replica count out of range."""


@dataclass
class ScalePlan:
    """What ``scale TEMPLATE --replicas N`` would do.

    ``before``: the count now in force (override or inventory); ``added``:
    replicas that would get a place; ``removed``: replicas that would be
    drained and stopped (highest numbers first); ``unplaced``: replica → why it
    cannot get a place; ``result``: the whole placement with the new count.
    """

    template: str
    before: int
    after: int
    added: list[str]
    removed: list[str]
    unplaced: dict[str, str]
    result: PlacementResult
    #: the worker units (``NAME-nodeR``) of removed replicas across hosts: their units go too
    removed_workers: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.unplaced


def check_template(inv: Inventory, template: str) -> None:
    if template not in inv.templates:
        known = ", ".join(inv.templates) or "none"
        raise ScaleError(
            f"template {template!r} is not in the inventory {inv.path} (templates: {known})"
            + suggest(template, list(inv.templates))
        )


def plan_scale(
    inv: Inventory,
    state: DeployState,
    template: str,
    replicas: int | None,
    *,
    topology: Mapping[str, HostTopology] | None = None,
) -> ScalePlan:
    """The placement with ``template`` at ``replicas`` (``None``: back to the inventory's count).

    Raises :class:`ScaleError` for an unknown template or a count out of range.
    """
    check_template(inv, template)
    if replicas is not None and not 0 <= replicas <= MAX_REPLICAS:
        raise ScaleError(f"--replicas {replicas}: expected 0-{MAX_REPLICAS}")
    tpl = inv.templates[template]
    before = desired_replicas(tpl, state)
    wanted = state.copy()
    if replicas is None:
        wanted.replicas.pop(template, None)
    else:
        wanted.replicas[template] = replicas
    result = desired_instances(inv, wanted, topology=topology)
    mine = [n for n in result.new + list(result.moved) if replica_number(template, n) is not None]
    gone = [n for n in result.removed if replica_number(template, n) is not None]
    gone.sort(key=lambda n: -(replica_number(template, n) or 0))
    unplaced = {n: why for n, why in result.unplaced.items() if replica_number(template, n) is not None}
    old = state.placements.get(template, {})
    workers = [member_name(n, r) for n in gone if n in old for r in range(1, len(old[n].stages))]
    return ScalePlan(template, before, desired_replicas(tpl, wanted), mine, gone, unplaced, result, workers)


def record_scale(store: StateStore, template: str, replicas: int | None) -> None:
    """Write the override for ``template`` (``None`` removes it), under the state lock."""
    with store.update() as st:
        if replicas is None:
            st.replicas.pop(template, None)
        else:
            st.replicas[template] = replicas


def scale_hosts(inv: Inventory, state: DeployState, template: str) -> list[str]:
    """Hosts a scale of ``template`` touches (inventory order): its pattern's hosts and any
    host still holding one of its recorded replicas."""
    names = {h.name for h in select_hosts(inv, inv.templates[template].hosts)}
    names.update(h for p in state.placements.get(template, {}).values() for h in p.hosts)
    return [h for h in inv.hosts if h in names]


def replica_names(sp: ScalePlan) -> list[str]:
    """Every replica of the template after the scale plus those it removes: exactly what a
    rollout of the scale touches (a glob ``T-*`` would also match a template named ``T-x``), with the
    worker units of removed replicas across hosts (the engine adds those of the replicas it keeps)."""
    kept = [n for n, i in sp.result.instances.items() if i.template == sp.template]
    return kept + sp.removed + sp.removed_workers
