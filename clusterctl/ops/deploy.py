"""The deploy workflows: ``deploy`` (with release gates, surge or a playbook), ``scale``'s placement,
``rollback`` and ``start | stop | restart``, and the gateway's drain hook they are given.

A typed request goes in (the inventory loaded, the hosts selected, how fleets are built, the
deploy state directory, the engine's options) and the engine's report comes out
(:class:`~clusterctl.deploy.rollout.engine.DeployReport`,
:class:`~clusterctl.deploy.playbooks.run.PlaybookReport`,
:class:`~clusterctl.deploy.rollout.rollback.RollbackReport`, the
:class:`~clusterctl.deploy.rollout.lifecycle.ActionResult` rows); progress goes to ``on_event``.

The seam between deploy and the gateway is here: :func:`drain_hook` builds the gateway's hook
from the inventory (with the sudo password the CLI read at its edge) and each workflow hands it
to the engine, rollback or the lifecycle actions; nothing under ``clusterctl/deploy/`` reaches
the gateway package by itself.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

from clusterctl.deploy.placement import topology
from clusterctl.deploy.placement.scale import scale_hosts
from clusterctl.deploy.playbooks.load import Playbook, load_playbook
from clusterctl.deploy.playbooks.run import PlaybookReport as PlaybookReport  # re-exported: the CLI renders it
from clusterctl.deploy.playbooks.run import PlaybookRun
from clusterctl.deploy.rollout import engine
from clusterctl.deploy.rollout.drain import GatewayHook
from clusterctl.deploy.rollout.engine import DeployOptions, DeployReport, Event
from clusterctl.deploy.rollout.lifecycle import Action, ActionResult, run_action
from clusterctl.deploy.rollout.release_gates import ReleaseDeploy, ReleaseGates
from clusterctl.deploy.rollout.rollback import RollbackReport, rollback
from clusterctl.deploy.rollout.surge import with_surge
from clusterctl.deploy.state import StateStore
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.factory import FleetFactory
from clusterctl.fleet.fleet import Fleet
from clusterctl.gateway.hook import gateway_hook
from clusterctl.inventory.model import Host, Instance, Inventory

OnEvent = Callable[[Event], None]


def _quiet(e: Event) -> None:
    return None


def drain_hook(
    inv: Inventory, state_dir: Union[str, Path, None], become_password: Optional[str]
) -> Optional[GatewayHook]:
    """The gateway's drain hook for ``inv`` (``None`` without a ``gateway:`` section): its
    marked-down set in ``state_dir``, its hosts reached with ``become_password``."""
    return gateway_hook(inv, state_dir, become_password=become_password)


@contextmanager
def held(hook: Optional[GatewayHook]) -> Iterator[Optional[GatewayHook]]:
    """``hook`` for one run: its connections to the gateway hosts (opened on its first change,
    reused by the next) are closed when the run ends, however it ends."""
    try:
        yield hook
    finally:
        close = getattr(hook, "close", None)
        if callable(close):
            close()


@dataclass(frozen=True)
class DeployRequest:
    """``inventory`` loaded, ``hosts`` selected, ``fleets`` with the command's SSH options,
    ``state_dir`` resolved, ``options`` checked; ``release``: the release gates (None: none);
    ``gateway_password``: the sudo password for the gateway hosts the drain hook reaches."""

    inventory: Inventory
    hosts: Sequence[Host]
    fleets: FleetFactory
    state_dir: str
    options: DeployOptions
    release: Optional[ReleaseGates] = None
    gateway_password: Optional[str] = field(default=None, repr=False)  # never in a repr or log

    def hook(self) -> Optional[GatewayHook]:
        return drain_hook(self.inventory, self.state_dir, self.gateway_password)


def run_deploy(request: DeployRequest, on_event: OnEvent = _quiet) -> DeployReport:
    """One deploy (``options.plan_only``: the plan alone); raises
    :class:`~clusterctl.deploy.rollout.engine.PreflightRefused`,
    :class:`~clusterctl.deploy.rollout.lock.LockHeld` or another ClusterctlError before anything changed."""
    r, opts = request, request.options
    args = (r.inventory, r.hosts, r.fleets, r.state_dir, opts)
    with held(r.hook()) as hook:
        if r.release is not None and r.release.any and not opts.plan_only:
            cls = with_surge(ReleaseDeploy) if opts.surge else ReleaseDeploy
            return cls(*args, on_event=on_event, release=r.release, gateway=hook).run()
        deploy = with_surge(engine.Deploy) if opts.surge else engine.Deploy
        return deploy(*args, on_event=on_event, gateway=hook).run()


def scale_rollout_hosts(inv: Inventory, store: StateStore, template: str) -> list[Host]:
    """The hosts a rollout of ``template``'s scale touches (its pattern's and those still holding a replica)."""
    return [inv.hosts[h] for h in scale_hosts(inv, store.load(), template)]


def place_scaled(request: DeployRequest, store: StateStore, on_note: Optional[Callable[[str], None]] = None) -> None:
    """Before a scale's rollout (:func:`run_deploy` of ``options.instances``; removed replicas are
    drained first): place the new replicas with the GPU topology of the hosts they may go to and
    record them, so the engine (which keeps recorded placements) starts them there.
    ``on_note``: hosts whose topology could not be read."""
    inv = request.inventory
    res, missing = topology.place(inv, store.load(), topology.fleet_reader(request.fleets, inv))
    if missing and on_note is not None:
        on_note(f"no GPU topology from {', '.join(missing)}: placed by contiguous GPU indexes")
    if res.changed:
        store.save_placements(res.state.placements)


def run_playbook(request: DeployRequest, path: str, on_event: OnEvent = _quiet) -> tuple[Playbook, PlaybookReport]:
    """Load the playbook at ``path`` and show its plan (``options.plan_only``) or run it."""
    book = load_playbook(path)
    r = request
    with held(r.hook()) as hook:
        runner = PlaybookRun(book, r.inventory, r.hosts, r.fleets, r.state_dir, r.options, on_event, gateway=hook)
        return book, runner.plan() if r.options.plan_only else runner.run()


@dataclass(frozen=True)
class RollbackRequest:
    """``rollback``'s request: as :class:`DeployRequest`, with the instances pattern and timeouts."""

    inventory: Inventory
    hosts: Sequence[Host]
    fleets: FleetFactory
    state_dir: str
    instances: Optional[str] = None
    gate_timeout_s: float = 600.0
    break_lock: bool = False
    drain_timeout_s: float = 120.0
    gateway_password: Optional[str] = field(default=None, repr=False)  # never in a repr or log


def run_rollback(request: RollbackRequest, on_event: OnEvent = _quiet) -> RollbackReport:
    """Roll the matching instances back to their previous copies (drained through the gateway first)."""
    r = request
    with held(drain_hook(r.inventory, r.state_dir, r.gateway_password)) as hook:
        return rollback(
            r.inventory,
            r.hosts,
            r.fleets,
            r.state_dir,
            instances=r.instances,
            gate_timeout_s=r.gate_timeout_s,
            break_lock=r.break_lock,
            drain_timeout_s=r.drain_timeout_s,
            on_event=on_event,
            gateway=hook,
        )


def instance_hosts(instances: Sequence[Instance]) -> list[str]:
    """The hosts ``instances`` run on (every member of a multi-node replica)."""
    return sorted({g.host for i in instances for g in i.placement})


@dataclass(frozen=True)
class ActionRequest:
    """``start | stop | restart`` of ``instances`` (selected; ``wanted``: every instance wanted,
    for a replica's members); ``fleet``: over :func:`instance_hosts` (not yet entered)."""

    inventory: Inventory
    instances: Sequence[Instance]
    wanted: dict[str, Instance]
    state_dir: Path
    fleet: Fleet
    action: Action
    drain_first: bool = True
    drain_timeout: float = 120.0
    poll: float = 1.0
    health_timeout: float = 900.0
    gateway_password: Optional[str] = field(default=None, repr=False)  # never in a repr or log


def run_instance_action(request: ActionRequest, on_event: Optional[Callable[[str], None]] = None) -> list[ActionResult]:
    """Drain (gateway mark-down first), stop, start or restart each instance; one row each.
    A gateway that cannot be set up is a ClusterctlError (``gateway: ...``) before anything changed."""
    r = request
    try:
        gateway = drain_hook(r.inventory, r.state_dir, r.gateway_password)
    except ClusterctlError as e:
        raise ClusterctlError(f"gateway: {e}") from e
    with held(gateway), r.fleet as fleet:
        return run_action(
            r.inventory,
            fleet,
            r.instances,
            r.action,
            drain_first=r.drain_first,
            drain_timeout=r.drain_timeout,
            poll=r.poll,
            health_timeout=r.health_timeout,
            gateway=gateway,
            on_event=on_event,
            wanted=r.wanted,
        )
