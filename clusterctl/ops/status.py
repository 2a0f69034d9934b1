"""The status workflow: ``status`` (one collection) and ``status --watch`` (a refresh loop).

A :class:`StatusRequest` (the inventory loaded, the deploy state directory resolved, the
instance pattern, the throughput window) goes in; :func:`select` says which instances and hosts
the command reads (the pools' routers are rows of their own), :func:`collect` reads them over a
fleet the caller built over ``Selection.hosts`` and returns a :class:`StatusRun` (the rows and
the monitoring exit code: 0 all serving, 1 some degraded or under high load, 2 some down,
failed or absent, 3 could not check).  :func:`watch` repeats a collection every ``interval``
seconds and hands each refresh to a callback.  Problems with the pattern or the state are
:class:`~clusterctl.errors.ClusterctlError`; an unreachable host is a row (docs/status.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from clusterctl.deploy.placement.deployed import wanted_instances

# InstanceStatus re-exported: the CLI's status views name the rows
from clusterctl.deploy.status.instances import InstanceStatus as InstanceStatus
from clusterctl.deploy.status.instances import collect_status, exit_code, match_instances
from clusterctl.deploy.status.routers import router_instances
from clusterctl.fleet.fleet import Fleet
from clusterctl.errors import ClusterctlError
from clusterctl.gateway import state as gwstate
from clusterctl.inventory.model import Instance, Inventory

#: What a status collection reports: one line per step (None: nothing).
OnEvent = Optional[Callable[[str], None]]


@dataclass(frozen=True)
class StatusRequest:
    """``inventory`` loaded; ``state_dir`` the deploy state directory (placed replicas, the
    gateway's marked-down set); ``pattern``: instance names, comma-separated globs, ``!glob``
    excludes (None, ``all``, ``*``: every instance, and the clusterctl units nobody wants as
    ``extra`` rows); ``window``: seconds between the two ``/metrics`` samples (0: one)."""

    inventory: Inventory
    state_dir: Path
    pattern: Optional[str] = None
    window: float = 10.0

    @property
    def everything(self) -> bool:
        return self.pattern is None or self.pattern.strip() in ("", "all", "*")


@dataclass(frozen=True)
class Selection:
    """The instances the pattern selects (name -> instance) and the hosts to read (every
    inventory host when the pattern selects everything, else the instances' hosts)."""

    instances: dict[str, Instance]
    hosts: list[str]


@dataclass(frozen=True)
class StatusRun:
    """One collection: a row per instance and the monitoring exit code of the rows."""

    rows: list[InstanceStatus]

    @property
    def code(self) -> int:
        return exit_code(self.rows)


def select(request: StatusRequest) -> Selection:
    """The instances and hosts ``request.pattern`` selects; a ClusterctlError when the deploy
    state cannot be read or the pattern selects no instance."""
    inv = request.inventory
    wanted = wanted_instances(inv, request.state_dir)
    wanted = {**wanted, **router_instances(inv, wanted)}  # the pools' routers: rows of their own
    selected = {n: wanted[n] for n in match_instances(wanted, request.pattern)}
    if not selected and not request.everything:
        raise ClusterctlError(f"pattern {request.pattern!r} selects no instance of the inventory")
    if request.everything:
        hosts = list(inv.hosts)
    else:
        hosts = _hosts_of(selected.values())
    return Selection(selected, hosts)


def _hosts_of(instances: Iterable[Instance]) -> list[str]:
    """The hosts ``instances`` run on (every member of a multi-node replica), sorted."""
    return sorted({g.host for i in instances for g in i.placement})


@dataclass(frozen=True)
class ActionSelection:
    """What ``start | stop | restart PATTERN`` acts on: ``wanted`` (every instance wanted: the
    inventory's and the placed replicas), the ``instances`` selected (a pool's router too: it is
    drained through its pool) and the ``hosts`` they run on."""

    wanted: dict[str, Instance]
    instances: list[Instance]
    hosts: list[str]


def select_for_action(request: StatusRequest) -> ActionSelection:
    """The instances ``request.pattern`` selects for a lifecycle action; a ClusterctlError when
    the deploy state cannot be read or the pattern selects none."""
    inv = request.inventory
    wanted = wanted_instances(inv, request.state_dir)
    everything = {**wanted, **router_instances(inv, wanted)}  # router-P too: drained through its pool
    names = match_instances(everything, request.pattern)
    if not names:
        raise ClusterctlError(f"pattern {request.pattern!r} selects no instance of the inventory")
    insts = [everything[n] for n in names]
    return ActionSelection(wanted, insts, _hosts_of(insts))


def marked_down(request: StatusRequest) -> dict[str, str]:
    """Instance -> reason for those the gateway keeps marked down (none without a gateway)."""
    if request.inventory.gateway is None:
        return {}
    down = gwstate.load(request.state_dir).marked_down
    return {name: str(info.get("reason", "")) for name, info in down.items()}


def collect(
    request: StatusRequest,
    selection: Selection,
    fleet: Fleet,
    *,
    window: Optional[float] = None,
    on_event: OnEvent = None,
) -> StatusRun:
    """Read the selected instances over ``fleet`` (``window``: this collection's, else the
    request's); the gateway's marked-down set is read anew each time."""
    rows = collect_status(
        request.inventory,
        selection.instances,
        fleet,
        window=request.window if window is None else window,
        state_dir=request.state_dir,
        include_extra=request.everything,
        marked_down=marked_down(request),
        on_event=on_event,
    )
    return StatusRun(rows)


def watch(
    collect: Callable[[], list[InstanceStatus]],
    *,
    interval: float,
    count: Optional[int],
    on_refresh: Callable[[list[InstanceStatus], float, int], None],
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Collect every ``interval`` seconds (from one start to the next) until Ctrl-C or ``count``
    refreshes; each refresh's rows, the seconds it took and its exit code go to ``on_refresh``.  Returns the
    exit code of the last refresh (3 when none finished)."""
    code = 3
    n = 0
    try:
        while count is None or n < count:
            t0 = time.monotonic()
            rows = collect()
            took = time.monotonic() - t0
            code = exit_code(rows)
            n += 1
            on_refresh(rows, took, code)
            if count is not None and n >= count:
                break
            sleep(max(0.0, interval - took))
    except KeyboardInterrupt:
        pass
    return code
