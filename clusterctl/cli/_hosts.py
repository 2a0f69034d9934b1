"""What every command that works on hosts shares: selection, options, progress, sudo.

* :func:`select` resolves a host pattern (``@failed`` included) against the
  inventory, exiting 3 when the pattern is bad or selects nothing;
* :func:`check_host_key_policy` checks ``--host-key-policy``;
* :func:`become_password` asks for (``-K``) or reads the sudo password;
* :class:`HostProgress` (from :mod:`clusterctl.cli._progress`) renders per-host progress;
* the typer option objects ``FanoutOpt``, ``HostKeyOpt``, ``DeadlineOpt``,
  ``ConnectTimeoutOpt``, ``ProbeSudoOpt`` and ``AskBecomePassOpt`` (defined in
  :mod:`clusterctl.cli._options`, re-exported here).
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from typing import Any, Optional


from clusterctl.cli._common import fail, load_inventory, user_config
from clusterctl.cli._options import (  # re-exported: the commands import them from here too
    AskBecomePassOpt as AskBecomePassOpt,
    ConnectTimeoutOpt as ConnectTimeoutOpt,
    DeadlineOpt as DeadlineOpt,
    FanoutOpt as FanoutOpt,
    HostKeyOpt as HostKeyOpt,
    ProbeSudoOpt as ProbeSudoOpt,
)
from clusterctl.cli._progress import HostProgress as HostProgress  # re-exported: the commands import it from here
from clusterctl.config import resolve_inventory_path
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.factory import BECOME_PASSWORD_ENV as BECOME_PASSWORD_ENV  # re-exported for the commands
from clusterctl.fleet.factory import FleetFactory, fleet_factory
from clusterctl.fleet.failed import load_failed
from clusterctl.fleet.hostkeys import HOST_KEY_POLICIES
from clusterctl.inventory.model import Host, Inventory


def select(inventory: Optional[str], pattern: str) -> tuple[str, list[Host]]:
    """``(inventory path, hosts)`` selected by ``pattern``; exits 3 on a bad or empty selection."""
    from clusterctl.inventory.select import select_hosts

    cfg = user_config()
    path = resolve_inventory_path(inventory, cfg)
    inv = load_inventory(inventory)
    try:
        # the state dir after load_inventory: the inventory's cluster's (clusterctl.clusterstate)
        hosts = select_hosts(inv, pattern, failed=load_failed(user_config().state_dir, inventory=path))
    except ClusterctlError as e:
        fail(str(e))
    if not hosts:
        fail(f"pattern {pattern!r} selects no host")
    return path, hosts


def failed_hosts(inventory: Optional[str]) -> Optional[list[str]]:
    """The hosts ``@failed`` names for the inventory ``-i`` gives (None: no run recorded with it)."""
    return load_failed(user_config().state_dir, inventory=resolve_inventory_path(inventory, user_config()))


def check_host_key_policy(value: Optional[str]) -> Optional[str]:
    """``--host-key-policy`` checked (None: each host's own policy); exits 3 when unknown."""
    if value is not None and value not in HOST_KEY_POLICIES:
        fail(f"--host-key-policy must be one of {', '.join(HOST_KEY_POLICIES)} (got {value!r})")
    return value


def become_password(ask: bool, hosts: list[Host], sudo: bool) -> Optional[str]:
    """The sudo password: None unless ``sudo`` and some host logs in as non-root;
    then prompted once when ``ask`` (``-K``), else ``$CLUSTERCTL_BECOME_PASSWORD`` (may be None)."""
    if not sudo or all((h.ssh.user or "root") == "root" for h in hosts):
        return None
    if ask:
        return getpass.getpass("become (sudo) password: ")
    return os.environ.get(BECOME_PASSWORD_ENV)


def gateway_password(command_password: Optional[str]) -> Optional[str]:
    """The sudo password for the gateway hosts the drain hook reaches: the one the command read
    (``-K`` or the environment, for its own hosts), else ``$CLUSTERCTL_BECOME_PASSWORD``.  Read
    here, at the CLI's edge, and passed down: the core never reads that variable."""
    return command_password if command_password is not None else os.environ.get(BECOME_PASSWORD_ENV)


def deploy_state_dir(state_dir: Optional[str]) -> Path:
    """The deploy state directory: ``--state-dir``, else ``$CLUSTERCTL_STATE_DIR``, else the user
    config's (the cluster's once the inventory is loaded)."""
    from clusterctl.deploy.state import resolve_state_dir

    return resolve_state_dir(state_dir, user_config())


def instances_wanted(inv: Any, state_dir: Optional[str]) -> tuple[dict[str, Any], Path]:
    """``(instances wanted, deploy state dir)``: the inventory's plus placed template replicas
    (``--state-dir``, else ``$CLUSTERCTL_STATE_DIR``, else the user config's); exits 3 on an
    unreadable state."""
    from clusterctl.deploy.placement.deployed import wanted_instances

    directory = deploy_state_dir(state_dir)
    try:
        return wanted_instances(inv, directory), directory
    except ClusterctlError as e:
        fail(str(e))


def host_fleets(
    inv: Inventory,
    host_names: list[str],
    *,
    fanout: Optional[int],
    connect_timeout: Optional[float],
    host_key_policy: Optional[str],
    ask_become_pass: bool,
) -> FleetFactory:
    """How a workflow builds its fleets with the usual SSH options: ``--host-key-policy`` checked
    and the sudo password read (``-K``: prompted) once, for the inventory hosts named ``host_names``."""
    return host_fleets_and_password(
        [inv.hosts[h] for h in host_names if h in inv.hosts],
        fanout=fanout,
        connect_timeout=connect_timeout,
        host_key_policy=host_key_policy,
        ask_become_pass=ask_become_pass,
    )[0]


def host_fleets_and_password(
    hosts: list[Host],
    *,
    fanout: Optional[int],
    connect_timeout: Optional[float],
    host_key_policy: Optional[str],
    ask_become_pass: bool,
) -> tuple[FleetFactory, Optional[str]]:
    """:func:`host_fleets` over ``hosts``, and the sudo password for the gateway's drain hook
    (:func:`gateway_password`)."""
    policy = check_host_key_policy(host_key_policy)
    password = become_password(ask_become_pass, hosts, True)
    make = fleets(fanout=fanout, connect_timeout=connect_timeout, become_password=password, host_key_policy=policy)
    return make, gateway_password(password)


def fleets(
    *,
    fanout: Optional[int],
    connect_timeout: Optional[float],
    become_password: Optional[str],
    host_key_policy: Optional[str],
    command_timeout: Optional[float] = None,
    deadline: Optional[float] = None,
) -> FleetFactory:
    """The command's fleet factory (``clusterctl.fleet.factory``): its options over the user
    config; ``host_key_policy`` checked by the caller (:func:`check_host_key_policy`)."""
    return fleet_factory(
        user_config(),
        fanout=fanout,
        connect_timeout=connect_timeout,
        command_timeout=command_timeout,
        deadline=deadline,
        become_password=become_password,
        host_key_policy=host_key_policy,
    )


def inventory_fleet(
    inv: Inventory, host_names: list[str], *, fleets: Optional[FleetFactory] = None, **fleet_opts: Any
) -> Any:
    """A Fleet of the inventory hosts named ``host_names``: built by ``fleets`` when given, else with
    the usual SSH options (:func:`host_fleets`' keyword arguments)."""
    make = fleets or host_fleets(inv, host_names, **fleet_opts)
    return make([inv.hosts[h] for h in host_names if h in inv.hosts])
