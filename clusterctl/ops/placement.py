"""The placement workflows: ``cordon``, ``uncordon``, ``cordons``, ``placement show`` and ``scale``.

A :class:`PlacementRequest` (the inventory loaded, the deploy state directory resolved after it,
so the directory is the inventory's cluster's) goes in; each function returns a typed result the
CLI renders.  Everything but :func:`scale_deploy` reads and writes the control-side deploy state
alone and contacts no host (docs/placement.md).  Problems with the inventory, the state or the
arguments are :class:`~clusterctl.errors.ClusterctlError` raised before anything is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from clusterctl.deploy.placement import cordon as cordons_
from clusterctl.deploy.placement import scale as scale_
from clusterctl.deploy.placement.cordon import Target
from clusterctl.deploy.placement.place import PlacementResult, desired_instances, replica_number
from clusterctl.deploy.placement.scale import ScalePlan as ScalePlan  # re-exported: the CLI reports it
from clusterctl.deploy.rollout.batches import parse_serial
from clusterctl.deploy.rollout.engine import DeployOptions
from clusterctl.deploy.state import Cordon, DeployState, StateStore
from clusterctl.fleet.factory import FleetFactory
from clusterctl.inventory.model import Host, Instance, Inventory
from clusterctl.ops.deploy import DeployRequest, place_scaled, scale_rollout_hosts


@dataclass(frozen=True)
class PlacementRequest:
    """``state_dir``: the deploy state directory, resolved once the inventory (if any) is loaded;
    ``inventory``: None where the command reads the state alone (``cordons``)."""

    state_dir: Path
    inventory: Optional[Inventory] = None

    @property
    def store(self) -> StateStore:
        return StateStore(self.state_dir)

    def inv(self) -> Inventory:
        if self.inventory is None:
            raise ValueError("internal: this placement workflow needs the inventory")
        return self.inventory

    def load(self) -> DeployState:
        """The deploy state; :class:`~clusterctl.deploy.state.StateError` on a corrupt file."""
        return self.store.load()


# --- cordons ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cordoned:
    """``target`` cordoned: its ``entry`` (reason, who, when), whether it is ``new``, and the
    replicas still placed there (``staying``: they stay until moved)."""

    target: str
    entry: Cordon
    new: bool
    staying: list[str]


@dataclass(frozen=True)
class Uncordoned:
    """``target`` uncordoned; ``removed``: the cordon that was there (None: none was);
    ``left``: the cordons that still apply to it (the host's own, or its GPUs')."""

    target: str
    removed: Optional[Cordon]
    left: list[str]


def cordon(request: PlacementRequest, target: str, reason: str) -> Cordoned:
    """Cordon ``target`` (``HOST`` or ``HOST:GPU`` of the inventory) with ``reason`` (stripped)."""
    tgt = cordons_.parse_target(request.inv(), target)
    entry, fresh, staying = cordons_.cordon(request.store, tgt, reason.strip())
    return Cordoned(tgt.key, entry, fresh, staying)


def uncordon(request: PlacementRequest, target: str) -> Uncordoned:
    """Remove the cordon on exactly ``target`` (``HOST`` or ``HOST:GPU`` of the inventory)."""
    tgt: Target = cordons_.parse_target(request.inv(), target)
    removed, left = cordons_.uncordon(request.store, tgt)
    return Uncordoned(tgt.key, removed, left)


def cordons(request: PlacementRequest) -> list[dict[str, str]]:
    """Every cordon as ``{target, reason, who, when}``, by target."""
    st = request.load()
    return [{"target": k, "reason": c.reason, "who": c.who, "when": c.when} for k, c in sorted(st.cordons.items())]


# --- placement show -----------------------------------------------------------------------------


def stages(inst: Instance) -> dict[str, list[int]]:
    """Host -> GPU indexes of an instance, the head's host first (a replica across hosts has several)."""
    return {h: [g.index for g in inst.placement if g.host == h] for h in dict.fromkeys(g.host for g in inst.placement)}


@dataclass(frozen=True)
class Placement:
    """``rows``: one per instance and per unplaced replica (template, replica, host, gpus, port,
    status; ``stages`` for a replica across hosts), by template and replica number;
    ``unplaced``: replica -> why it has no place."""

    rows: list[dict[str, Any]]
    unplaced: dict[str, str]

    @property
    def code(self) -> int:
        """0 every replica has a place, 1 some replica is unplaced."""
        return 1 if self.unplaced else 0


def placement_rows(res: PlacementResult) -> list[dict[str, Any]]:
    """One row per instance and per unplaced replica: template, replica, host, GPUs, port, state."""
    rows: list[dict[str, Any]] = []
    for name, inst in res.instances.items():
        if name in res.new or name in res.moved:
            status = "pending (deploy places it)"
        elif name in res.on_cordoned:
            status = f"on cordon: {res.on_cordoned[name]}"
        else:
            status = "placed" if inst.template else "explicit"
        where = stages(inst)
        head = next(iter(where))
        rows.append(
            {
                "template": inst.template,
                "replica": name,
                "host": head,
                "gpus": where[head],
                "port": inst.port,
                "status": status,
            }
            | ({"stages": [{"host": h, "gpus": g} for h, g in where.items()]} if len(where) > 1 else {})
        )
    for name, why in res.unplaced.items():
        tpl = name.rpartition("-")[0]
        rows.append(
            {"template": tpl, "replica": name, "host": None, "gpus": [], "port": None, "status": f"unplaced: {why}"}
        )
    rows.sort(
        key=lambda r: (
            r["template"] is not None,
            r["template"] or "",
            replica_number(r["template"] or "", r["replica"]) or 0,
            r["replica"],
        )
    )
    return rows


def show(request: PlacementRequest) -> Placement:
    """Where every instance is or would be placed now (without the hosts' GPU topology)."""
    res = desired_instances(request.inv(), request.load())
    return Placement(placement_rows(res), dict(res.unplaced))


# --- scale --------------------------------------------------------------------------------------


def plan_scale(request: PlacementRequest, template: str, replicas: Optional[int]) -> ScalePlan:
    """What setting ``template`` to ``replicas`` (None: the inventory's count) would change."""
    return scale_.plan_scale(request.inv(), request.load(), template, replicas)


def record_scale(request: PlacementRequest, template: str, replicas: Optional[int]) -> None:
    """Record the override (None removes it) under the state lock."""
    scale_.record_scale(request.store, template, replicas)


def replica_names(sp: ScalePlan) -> list[str]:
    """What a rollout of the scale touches (:func:`clusterctl.deploy.placement.scale.replica_names`)."""
    return scale_.replica_names(sp)


def scale_hosts(request: PlacementRequest, template: str) -> list[Host]:
    """The hosts a rollout of ``template``'s scale touches (to build its fleets over)."""
    return scale_rollout_hosts(request.inv(), request.store, template)


@dataclass(frozen=True)
class ScaleRollout:
    """How the scale's replicas are rolled out: the deploy options as given on the command line
    (``serial`` unparsed), the hosts (:func:`scale_hosts`) and their fleets, the sudo password for
    the gateway hosts the drain hook reaches."""

    hosts: list[Host]
    fleets: FleetFactory
    serial: Optional[str] = None
    max_fail_percentage: float = 0.0
    force: bool = False
    gate_timeout_s: float = 600.0
    drain_timeout_s: float = 120.0
    gateway_password: Optional[str] = field(default=None, repr=False)  # never in a repr or log


def scale_deploy(
    request: PlacementRequest,
    names: list[str],
    rollout: ScaleRollout,
    on_note: Optional[Callable[[str], None]] = None,
) -> DeployRequest:
    """The deploy of the replicas ``names`` (removed ones drained first), the new ones placed and
    recorded with the hosts' GPU topology first (``on_note``: hosts without one); run it with
    :func:`clusterctl.ops.deploy.run_deploy`.  Raises a ClusterctlError (a bad ``serial`` too)
    before anything changed."""
    opts = DeployOptions(
        instances=",".join(names),
        serial=parse_serial(rollout.serial),
        max_fail_percentage=rollout.max_fail_percentage,
        force=rollout.force,
        gate_timeout_s=rollout.gate_timeout_s,
        drain_timeout_s=rollout.drain_timeout_s,
    )
    store = request.store
    deploy = DeployRequest(
        request.inv(),
        rollout.hosts,
        rollout.fleets,
        str(store.directory),
        opts,
        gateway_password=rollout.gateway_password,
    )
    place_scaled(deploy, store, on_note)
    return deploy
