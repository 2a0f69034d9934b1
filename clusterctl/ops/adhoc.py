"""The ad-hoc workflows: ``exec`` (a command on many hosts) and ``ping`` (``true`` on each).

A :class:`CommandRequest` (the hosts selected, how their fleet is built, the command) goes in;
:func:`run` runs it over one fleet, reports each host's row to ``on_result`` as it ends, records
the hosts that failed for ``@failed`` (:func:`record_failed`) and returns a :class:`CommandRun`:
the per-host results (``RunResults``: the gathered outputs, the worst rc) and the warnings to
show (the fleet's, and a record that could not be written).  A host that fails is a row, never an
exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from clusterctl.fleet.factory import FleetFactory
from clusterctl.fleet.failed import save_failed
from clusterctl.fleet.results import HostResult, RunResults
from clusterctl.inventory.model import Host


def record_failed(state_dir: Path, failed: Iterable[str], *, inventory: str, command: str) -> Optional[str]:
    """Remember ``failed`` as ``@failed`` (in ``state_dir``, for ``inventory``); the warning to show
    when the record cannot be written, else None."""
    try:
        save_failed(state_dir, failed, inventory=inventory, command=command)
    except OSError as e:
        return f"could not record failed hosts for @failed: {e}"
    return None


@dataclass(frozen=True)
class CommandRequest:
    """``command`` on ``hosts`` over a fleet from ``fleets`` (its timeouts and sudo password set);
    ``sudo``: as root where the login user is not; ``state_dir`` and ``inventory_path``: where the
    failed hosts are recorded for ``@failed``, under ``record_as`` (default: the command)."""

    hosts: Sequence[Host]
    fleets: FleetFactory
    command: str
    state_dir: Path
    inventory_path: str
    sudo: bool = False
    record_as: Optional[str] = None


@dataclass(frozen=True)
class CommandRun:
    """The per-host results and the warnings to show, in order."""

    results: RunResults
    warnings: list[str]


def run(request: CommandRequest, on_result: Optional[Callable[[HostResult], None]] = None) -> CommandRun:
    """Run ``request.command`` on every host (at most the fleet's fan-out at once)."""
    fleet = request.fleets(request.hosts)
    with fleet:
        res = fleet.run(request.command, sudo=request.sudo, on_result=on_result)
    warnings = list(fleet.warnings)
    recorded = record_failed(
        request.state_dir,
        res.failed_hosts(),
        inventory=request.inventory_path,
        command=request.record_as or request.command,
    )
    return CommandRun(res, warnings + ([recorded] if recorded else []))
