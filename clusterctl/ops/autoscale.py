"""The autoscaler's workflow: a typed request (inventory, state directory, the templates'
policies, how fleets are built) -> one round (:func:`run_once`, ``autoscale plan|run``) or
rounds every interval until stopped (:func:`run_daemon`, ``autoscale daemon``).  Progress
lines go to ``on_event``; each round's outcomes to ``on_round``; the CLI renders them and
owns the signals (``should_stop``)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from clusterctl.autoscale.run import Outcome, autoscaled, run_round
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.factory import FleetFactory
from clusterctl.inventory.loader import load_inventory
from clusterctl.inventory.model import AutoscalePolicy, Inventory


@dataclass(frozen=True)
class AutoscaleRequest:
    """``policies``: template -> policy (``autoscale.run.autoscaled``), ``make_fleet`` built
    from the user config and the command line (``fleet.factory.fleet_factory``)."""

    inventory: Inventory
    state_dir: Path
    make_fleet: FleetFactory
    policies: Mapping[str, AutoscalePolicy]


def run_once(
    request: AutoscaleRequest, *, plan_only: bool, on_event: Optional[Callable[[str], None]] = None
) -> list[Outcome]:
    """One decision per template, acted on unless ``plan_only``."""
    return run_round(
        request.inventory,
        request.state_dir,
        request.make_fleet,
        request.policies,
        plan_only=plan_only,
        on_event=on_event,
    )


def daemon_interval(request: AutoscaleRequest, interval: Optional[float]) -> float:
    """Seconds between rounds: ``interval``, else the smallest ``interval_s`` of the policies."""
    return interval or min(p.interval_s for p in request.policies.values())


Reload = Callable[[AutoscaleRequest], Optional[AutoscaleRequest]]


def run_daemon(
    request: AutoscaleRequest,
    *,
    interval: Optional[float],
    rounds: int,
    should_stop: Callable[[], bool],
    on_round: Callable[[list[Outcome]], None],
    on_error: Callable[[str], None],
    on_event: Optional[Callable[[str], None]] = None,
    reload: Optional[Reload] = None,
) -> int:
    """A round every interval until ``should_stop()`` (the round in progress finishes first) or
    after ``rounds`` rounds (0: no limit); a round that fails (an unreadable state, a busy lock) is
    reported to ``on_error`` and never ends the daemon.  Returns the number of rounds run.

    ``reload`` is asked before every round after the first: a new request when the inventory
    changed (its policies, hosts and cordons apply from that round on), ``None`` when it did not.
    An inventory that no longer loads (``ClusterctlError``) is reported to ``on_error`` and the
    previous request is kept, so a half-edited file never stops or misleads the autoscaler."""
    every = daemon_interval(request, interval)
    n = 0
    while not should_stop():
        t0 = time.monotonic()
        if reload is not None and n:
            try:
                fresh = reload(request)
            except ClusterctlError as e:
                on_error(f"autoscaler: inventory not reloaded, the previous one is kept: {e}")
                fresh = None
            if fresh is not None:
                request = fresh
                every = daemon_interval(request, interval)
                if on_event:
                    on_event(f"autoscaler: inventory reloaded ({', '.join(request.policies) or 'no policy'})")
        try:
            outs = run_round(
                request.inventory,
                request.state_dir,
                request.make_fleet,
                request.policies,
                lock_wait_s=every,
                on_event=on_event,
            )
        except ClusterctlError as e:
            on_error(f"autoscaler: round failed: {e}")
            outs = []
        on_round(outs)
        n += 1
        if rounds and n >= rounds:
            break
        while not should_stop() and time.monotonic() - t0 < every:
            time.sleep(min(0.2, every))
    return n


def inventory_reloader(request: AutoscaleRequest, templates: Sequence[str] = ()) -> Reload:
    """A ``reload`` for :func:`run_daemon`: re-reads the request's inventory file when its
    modification time or size changed since the last look (files it names are not watched),
    with the same ``templates`` filter.  A file that cannot be read or loaded, or that no longer
    has an autoscale policy, raises ``ClusterctlError`` once per change."""
    path = str(request.inventory.path)

    def stamp() -> tuple[int, int]:
        try:
            st = os.stat(path)
        except OSError as e:
            raise ClusterctlError(f"{path}: cannot read the inventory: {e.strerror}") from None
        return st.st_mtime_ns, st.st_size

    seen = [stamp()]

    def reload(current: AutoscaleRequest) -> Optional[AutoscaleRequest]:
        now = stamp()
        if now == seen[0]:
            return None
        seen[0] = now
        inv = load_inventory(path)
        policies = autoscaled(inv, list(templates))
        if not policies:
            raise ClusterctlError(f"{path}: no template has an autoscale: policy any more")
        return AutoscaleRequest(inv, current.state_dir, current.make_fleet, policies)

    return reload
