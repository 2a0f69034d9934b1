"""The autoscaler's workflow: a typed request (inventory, state directory, the templates'
policies, how fleets are built) -> one round (:func:`run_once`, ``autoscale plan|run``) or
rounds every interval until stopped (:func:`run_daemon`, ``autoscale daemon``).  Progress
lines go to ``on_event``; each round's outcomes to ``on_round``; the CLI renders them and
owns the signals (``should_stop``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from clusterctl.autoscale.run import Outcome, run_round
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.factory import FleetFactory
from clusterctl.inventory.model import AutoscalePolicy, Inventory


@dataclass(frozen=True)
class AutoscaleRequest:
    """``policies``: template -> policy (``autoscale.run.autoscaled``), ``make_fleet`` built
    from the user config and the command line (``fleet.factory.fleet_factory``)."""

    inventory: Inventory
    state_dir: Path
    make_fleet: FleetFactory
    policies: Mapping[str, AutoscalePolicy]


def run_once(request: AutoscaleRequest, *, plan_only: bool,
             on_event: Optional[Callable[[str], None]] = None) -> list[Outcome]:
    """One decision per template, acted on unless ``plan_only``."""
    return run_round(request.inventory, request.state_dir, request.make_fleet, request.policies,
                     plan_only=plan_only, on_event=on_event)


def daemon_interval(request: AutoscaleRequest, interval: Optional[float]) -> float:
    """Seconds between rounds: ``interval``, else the smallest ``interval_s`` of the policies."""
    return interval or min(p.interval_s for p in request.policies.values())


def run_daemon(request: AutoscaleRequest, *, interval: Optional[float], rounds: int,
               should_stop: Callable[[], bool], on_round: Callable[[list[Outcome]], None],
               on_error: Callable[[str], None], on_event: Optional[Callable[[str], None]] = None) -> int:
    """A round every interval until ``should_stop()`` (the round in progress finishes first) or
    after ``rounds`` rounds (0: no limit); a round that fails (an unreadable state, a busy lock) is
    reported to ``on_error`` and never ends the daemon.  Returns the number of rounds run."""
    every = daemon_interval(request, interval)
    n = 0
    while not should_stop():
        t0 = time.monotonic()
        try:
            outs = run_round(request.inventory, request.state_dir, request.make_fleet, request.policies,
                             lock_wait_s=every, on_event=on_event)
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
