"""The failover workflow: a typed request (inventory, state directory, options, how fleets are
built) -> :func:`clusterctl.gateway.failover.run_failover`'s report.  Used by ``clusterctl
failover`` and ``report run --failover`` (:func:`for_report`); progress lines go to ``on_event``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from clusterctl.config import UserConfig
from clusterctl.gateway.failover import FailoverOptions, FailoverReport
from clusterctl.inventory.model import Inventory
from clusterctl.fleet.factory import fleet_factory
from clusterctl.gateway.failover import run_failover


@dataclass(frozen=True)
class FailoverRequest:
    """``inventory`` loaded, ``state_dir`` resolved, ``host_key_policy`` checked (None: each
    host's own), ``become_password`` read or None."""

    inventory: Inventory
    state_dir: Path
    cfg: UserConfig
    options: FailoverOptions = field(default_factory=FailoverOptions)
    fanout: Optional[int] = None
    connect_timeout: Optional[float] = None
    host_key_policy: Optional[str] = None
    become_password: Optional[str] = field(default=None, repr=False)  # never in a repr or log


def run(request: FailoverRequest, on_event: Optional[Callable[[str], None]] = None) -> FailoverReport:
    """One failover run; raises :class:`~clusterctl.errors.ClusterctlError` only before anything changed."""
    make = fleet_factory(
        request.cfg,
        fanout=request.fanout,
        connect_timeout=request.connect_timeout,
        host_key_policy=request.host_key_policy,
        become_password=request.become_password,
    )
    return run_failover(request.inventory, request.state_dir, make, request.options, on_event=on_event)


def for_report(request: FailoverRequest, on_event: Optional[Callable[[str], None]] = None) -> FailoverReport:
    """``report run --failover``: a failover run with the default options (``--max-share 0.25``)."""
    return run(replace(request, options=FailoverOptions()), on_event)
