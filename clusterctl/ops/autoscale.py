"""The autoscaler's workflow: a typed request (inventory, state directory, the templates'
policies, how fleets are built) -> one round (:func:`run_once`, ``autoscale plan|run``) or
rounds every interval until stopped (:func:`run_daemon`, ``autoscale daemon``).  Progress
lines go to ``on_event``; each round's outcomes to ``on_round``; the CLI renders them and
owns the signals (``should_stop``).  :func:`policies`, :func:`fleets`, :func:`history`,
:func:`service` and :func:`enable_service` are the rest of ``autoscale``: the request's parts,
the audited decisions, the systemd service of ``autoscale install``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from clusterctl.autoscale.record import read_history

# Outcome re-exported: the CLI renders it and never imports autoscale.run
from clusterctl.autoscale.run import Outcome as Outcome
from clusterctl.autoscale.run import autoscaled, run_round
from clusterctl.config import UserConfig
from clusterctl.deploy.units.sdquote import systemd_quote
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.factory import FleetFactory, fleet_factory
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


# --------------------------------------------------------------- what the CLI asks besides rounds

UNIT = "clusterctl-autoscale.service"


def policies(inventory: Inventory, templates: Sequence[str] = ()) -> Mapping[str, AutoscalePolicy]:
    """template -> policy of the templates with an ``autoscale:`` policy (only ``templates`` when
    given); an unknown template raises."""
    return autoscaled(inventory, list(templates))


def fleets(
    cfg: UserConfig,
    *,
    fanout: Optional[int] = None,
    connect_timeout: Optional[float] = None,
    host_key_policy: Optional[str] = None,
) -> FleetFactory:
    """How the autoscaler's rounds build their fleets: the user config and the command line's SSH
    options (the host-key policy already checked)."""
    return fleet_factory(cfg, fanout=fanout, connect_timeout=connect_timeout, host_key_policy=host_key_policy)


def history(state_dir: Path, templates: Sequence[str] = (), last: int = 20) -> list[dict[str, Any]]:
    """The newest ``last`` audited decisions (of ``templates`` only, when given), oldest first."""
    return [r for r in read_history(state_dir) if not templates or r.get("template") in templates][-last:]


def unit_text(argv: list[str]) -> str:
    """The systemd service that runs ``argv`` (``autoscale daemon ...``) on this host."""
    return (
        "[Unit]\nDescription=clusterctl autoscaler (docs/autoscale.md)\nAfter=network-online.target\n"
        "Wants=network-online.target\n\n[Service]\nType=simple\n"
        f"ExecStart={' '.join(systemd_quote(a) for a in argv)}\n"
        # SIGTERM: the decision in progress finishes (a scale-out's gates can take gate_timeout_s)
        "KillSignal=SIGTERM\nTimeoutStopSec=15min\nRestart=on-failure\nRestartSec=30\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


def service(inventory_path: str, state_dir: Path, templates: Sequence[str], unit_dir: str) -> tuple[Path, str]:
    """``autoscale install``: where the service goes and its text (the daemon reads the inventory
    at ``inventory_path`` and the deploy state at ``state_dir``, both made absolute)."""
    argv = [sys.executable, "-m", "clusterctl.cli.main", "autoscale", "daemon"]
    argv += ["-i", str(Path(inventory_path).resolve()), "--state-dir", str(Path(state_dir).resolve())]
    for t in templates:
        argv += ["--template", t]
    return Path(unit_dir) / UNIT, unit_text(argv)


def enable_service(timeout_s: float = 60.0) -> None:
    """``systemctl daemon-reload`` then ``enable --now`` the service (each within ``timeout_s``);
    a failure raises ``ClusterctlError`` with the command and its output."""
    for cmd in (["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", UNIT]):
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ClusterctlError(f"{' '.join(cmd)}: {e}") from None
        if res.returncode != 0:
            raise ClusterctlError(f"{' '.join(cmd)}: {res.stderr.strip() or res.stdout.strip()}")
