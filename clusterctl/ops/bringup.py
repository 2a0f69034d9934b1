"""The bring-up workflows ``net apply``, ``node setup``, ``engine list`` and ``engine install/remove``: a typed request
(inventory, hosts, rollout and fleet options) -> the feature's planner/applier
(:class:`clusterctl.bringup.netqos.NetApply`, :class:`clusterctl.bringup.nodesetup.NodeSetup`)
-> a :class:`BringupPlan` (what would change per host) whose :meth:`BringupPlan.apply` carries it
out in ``--serial`` batches (``engine list`` only reads: :func:`engine_list`).  Progress goes to ``on_event(kind, message, host)``; the CLI parses
the options and renders plans and reports (``cli/_plan_views.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol, Sequence

from clusterctl.bringup.batch import ApplyReport, OnEvent, Plan
from clusterctl.bringup.engine_install import EngineOp
from clusterctl.bringup.engines import EngineRow, list_engines
from clusterctl.bringup.netqos import NetApply
from clusterctl.bringup.nodesetup import NodeSetup
from clusterctl.config import UserConfig
from clusterctl.deploy.rollout.batches import parse_serial
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.factory import FleetFactory, fleet_factory
from clusterctl.fleet.fleet import Fleet
from clusterctl.inventory.model import Host, Inventory


def _no_password() -> Optional[str]:
    return None


@dataclass(frozen=True)
class BringupRequest:
    """``inventory`` loaded from ``path``, ``hosts`` selected, ``serial`` as given on the command
    line (None: one host at a time), ``host_key_policy`` checked.  ``load_config`` and
    ``become_password`` are called once the request has passed its checks, in that order (so a
    bad ``--serial`` or fabric is reported before any prompt for the sudo password)."""

    path: str
    inventory: Inventory
    hosts: Sequence[Host]
    load_config: Callable[[], UserConfig]
    become_password: Callable[[], Optional[str]] = _no_password
    serial: Optional[str] = None
    max_fail_percentage: float = 0.0
    fanout: Optional[int] = None
    connect_timeout: Optional[float] = None
    host_key_policy: Optional[str] = None


class Runner(Protocol):
    def plan(self) -> Sequence[Plan]: ...

    def run(self, plans: Any = None) -> ApplyReport: ...


@dataclass(frozen=True)
class BringupPlan:
    """What the run would change per host (``plans``, in the hosts' order); :meth:`apply` changes it."""

    runner: Runner
    plans: list[Any]

    def apply(self) -> ApplyReport:
        """Apply the pending, readable plans batch by batch (each host re-read and checked after)."""
        return self.runner.run(self.plans)


def _steps(request: BringupRequest) -> list[str]:
    return list(parse_serial(request.serial) or ["1"])


def fleets(request: BringupRequest) -> FleetFactory:
    """How the request's fleets are built (reads the user config, then the sudo password)."""
    cfg = request.load_config()
    return fleet_factory(
        cfg,
        fanout=request.fanout,
        connect_timeout=request.connect_timeout,
        host_key_policy=request.host_key_policy,
        become_password=request.become_password(),
    )


def net_apply_runner(request: BringupRequest, on_event: OnEvent | None = None) -> NetApply:
    """The ``net apply`` planner/applier; raises :class:`ClusterctlError` (a bad ``--serial``, a
    fabric that is not RoCE) before anything is read from the hosts or asked of the user."""
    steps = _steps(request)
    if request.inventory.fabric.kind != "roce":
        raise ClusterctlError(
            f"{request.path}: fabric.kind is {request.inventory.fabric.kind}: net apply sets RoCE QoS only"
        )
    return NetApply(
        request.inventory,
        request.hosts,
        fleets(request),
        serial=steps,
        max_fail_percentage=request.max_fail_percentage,
        on_event=on_event,
    )


def node_setup_runner(request: BringupRequest, revert: bool = False, on_event: OnEvent | None = None) -> NodeSetup:
    """The ``node setup`` (``--revert``) planner/applier; raises :class:`ClusterctlError` on a bad
    ``--serial`` before anything is read from the hosts or asked of the user."""
    steps = _steps(request)
    return NodeSetup(
        request.inventory,
        request.hosts,
        fleets(request),
        serial=steps,
        max_fail_percentage=request.max_fail_percentage,
        revert=revert,
        on_event=on_event,
    )


def plan(runner: Runner) -> BringupPlan:
    """Read every host and what would change (``--plan`` shows it; :meth:`BringupPlan.apply` does it)."""
    return BringupPlan(runner, list(runner.plan()))


def net_apply(request: BringupRequest, on_event: OnEvent | None = None) -> BringupPlan:
    """``net apply``'s plan: every selected host's RoCE QoS and what would change."""
    return plan(net_apply_runner(request, on_event))


def node_setup(request: BringupRequest, revert: bool = False, on_event: OnEvent | None = None) -> BringupPlan:
    """``node setup``'s plan (``revert``: what earlier applies recorded, to put back)."""
    return plan(node_setup_runner(request, revert, on_event))


def engine_list(request: BringupRequest, names: Sequence[str] | None = None) -> list[EngineRow]:
    """``engine list``: per selected host, each engine of the inventory (or ``names``); read-only
    (``serial`` and ``max_fail_percentage`` are not used)."""
    return list_engines(request.inventory, request.hosts, fleets(request), names)


def engine_op_runner(
    request: BringupRequest,
    name: str,
    *,
    remove: bool = False,
    wheels: Optional[str] = None,
    index_url: Optional[str] = None,
    on_event: OnEvent | None = None,
) -> EngineOp:
    """The ``engine install`` / ``engine remove`` planner/applier of engine ``name``
    (:mod:`clusterctl.bringup.engine_install`); raises :class:`ClusterctlError` (a bad ``--serial``,
    an unknown engine, a path it cannot own, a wheelhouse without the version) before anything is
    read from the hosts or asked of the user (the fleets are built at the first read)."""
    steps = _steps(request)
    made: list[FleetFactory] = []

    def make(hosts: Iterable[Host]) -> Fleet:
        if not made:
            made.append(fleets(request))
        return made[0](hosts)

    return EngineOp(
        request.inventory,
        name,
        request.hosts,
        make,
        remove=remove,
        wheels=wheels,
        index_url=index_url,
        serial=steps,
        max_fail_percentage=request.max_fail_percentage,
        on_event=on_event,
    )


def engine_install(
    request: BringupRequest,
    name: str,
    *,
    wheels: Optional[str] = None,
    index_url: Optional[str] = None,
    on_event: OnEvent | None = None,
) -> BringupPlan:
    """``engine install``'s plan: the hosts that lack engine ``name`` (apply: needs ``wheels`` or ``index_url``)."""
    return plan(engine_op_runner(request, name, wheels=wheels, index_url=index_url, on_event=on_event))


def engine_remove(request: BringupRequest, name: str, on_event: OnEvent | None = None) -> BringupPlan:
    """``engine remove``'s plan: the hosts that have engine ``name`` and no unit running it."""
    return plan(engine_op_runner(request, name, remove=True, on_event=on_event))
