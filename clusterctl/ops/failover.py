"""The failover workflow: a typed request (inventory, state directory, options, how fleets are
built) -> :func:`clusterctl.gateway.failover.run_failover`'s report.  Used by ``clusterctl
failover`` and ``report run --failover`` (:func:`for_report`); progress lines go to ``on_event``.
:func:`failover_request` builds the request from the command line's values: the CLI loads the
inventory and hands over how to read the sudo password, nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from clusterctl.config import UserConfig
from clusterctl.deploy.state import resolve_state_dir
from clusterctl.errors import ClusterctlError
from clusterctl.gateway.failover import FailoverOptions

# FailoverReport re-exported: the CLI renders it and never imports gateway.failover
from clusterctl.gateway.failover import FailoverReport as FailoverReport
from clusterctl.inventory.fields import suggest
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


def _no_password() -> Optional[str]:
    return None


def failover_request(
    inventory: Inventory,
    cfg: UserConfig,
    *,
    state_dir: Optional[str] = None,
    max_share: float = 0.25,
    plan_only: bool = False,
    drain_timeout_s: float = 120.0,
    gate_timeout_s: float = 600.0,
    avoid_hosts: Sequence[str] = (),
    fanout: Optional[int] = None,
    connect_timeout: Optional[float] = None,
    host_key_policy: Optional[str] = None,
    become_password: Callable[[], Optional[str]] = _no_password,
) -> FailoverRequest:
    """The request for ``inventory`` (loaded) with the command line's options (``--max-share`` a
    share in [0, 1], timeouts in seconds; ``host_key_policy`` already checked).  Every
    ``--avoid-host`` must be a host of the inventory and the deploy state directory is resolved
    (``--state-dir`` > ``$CLUSTERCTL_STATE_DIR`` > ``<state_dir>/deploy``); only then is
    ``become_password()`` called (so a bad option is reported before any prompt).  Raises
    :class:`~clusterctl.errors.ClusterctlError` naming the bad value."""
    for h in avoid_hosts:
        if h not in inventory.hosts:
            raise ClusterctlError(
                f"--avoid-host {h}: not a host of {inventory.path}" + suggest(h, list(inventory.hosts))
            )
    directory = Path(resolve_state_dir(state_dir, cfg))
    options = FailoverOptions(
        max_share=max_share,
        plan_only=plan_only,
        drain_timeout_s=drain_timeout_s,
        gate_timeout_s=gate_timeout_s,
        avoid_hosts=tuple(avoid_hosts),
    )
    return FailoverRequest(
        inventory,
        directory,
        cfg,
        options,
        fanout=fanout,
        connect_timeout=connect_timeout,
        host_key_policy=host_key_policy,
        become_password=become_password(),
    )


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
