"""The facts workflow: ``facts HOSTS``, what every node has, in one round trip per node.

A :class:`FactsRequest` (the hosts selected, how their fleet is built, the probe's timeout and
sudo) goes in; :func:`run` probes every host (``clusterctl.probe.run.collect_facts``), reports
each host's result to ``on_result`` as it comes, records the hosts that gave no facts for
``@failed`` and returns a :class:`FactsRun`: one result per host (a document of docs/facts.md,
or why there is none), the warnings to show, and the exit code (0 every host answered, 2 some
host gave no facts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from clusterctl.exitcodes import ExitCode
from clusterctl.fleet.factory import FleetFactory
from clusterctl.inventory.model import Host
from clusterctl.ops.adhoc import record_failed
from clusterctl.probe.facts import Facts as Facts  # re-exported: the CLI's summaries read it
from clusterctl.probe.run import DEFAULT_TIMEOUT_S, collect_facts
from clusterctl.probe.run import FactsResult as FactsResult  # re-exported: the CLI renders it


@dataclass(frozen=True)
class FactsRequest:
    """``hosts`` probed over a fleet from ``fleets`` (its command timeout ``timeout``);
    ``timeout``: seconds one host's probe may take; ``sudo``: the probe as root where the login
    user is not (a root-only kernel log); ``state_dir`` and ``inventory_path``: where the hosts
    without facts are recorded for ``@failed``."""

    hosts: Sequence[Host]
    fleets: FleetFactory
    state_dir: Path
    inventory_path: str
    timeout: float = DEFAULT_TIMEOUT_S
    sudo: bool = False


@dataclass(frozen=True)
class FactsRun:
    """Host -> its probe result (fleet order), the hosts without facts, the warnings to show."""

    results: dict[str, FactsResult]
    failed: list[str]
    warnings: list[str]

    @property
    def code(self) -> ExitCode:
        return ExitCode.CRIT if self.failed else ExitCode.OK


def run(request: FactsRequest, on_result: Optional[Callable[[FactsResult], None]] = None) -> FactsRun:
    """Probe every host of the request (at most the fleet's fan-out at once)."""
    fleet = request.fleets(request.hosts)
    with fleet:
        results = collect_facts(fleet, timeout=request.timeout, sudo=request.sudo, on_result=on_result)
    failed = [h for h, r in results.items() if not r.ok]
    recorded = record_failed(request.state_dir, failed, inventory=request.inventory_path, command="facts")
    return FactsRun(results, failed, list(fleet.warnings) + ([recorded] if recorded else []))
