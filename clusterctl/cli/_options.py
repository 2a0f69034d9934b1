"""The typer options and arguments that several commands share, defined once.

A command names them as defaults (``inventory: Optional[str] = InventoryOpt``); the same
object may serve any number of commands, so a flag's name, default and help text read the
same in every ``--help``.  An option whose help differs between commands (each
``--state-dir`` says what that command keeps there) stays in its command's module.

Inventory and output: ``InventoryOpt`` (``-i``), ``JsonOpt`` (``--json``), ``OutputOpt``
(``-o``, atomically instead of stdout).
Hosts: ``HostsArg`` (a required pattern, ``@failed`` included: facts, exec, ping, ...),
``HostsAllArg`` (a pattern defaulting to ``all``: doctor, report run), ``HostsOpt``
(``--hosts``/``-H``, default ``all``: deploy, net apply, node setup, engine).
SSH and the fan-out: ``FanoutOpt`` (``-f``), ``ConnectTimeoutOpt``, ``HostKeyOpt``
(``--host-key-policy``), ``DeadlineOpt``, ``AskBecomePassOpt`` (``-K``), ``ProbeSudoOpt``
(``--sudo`` for the probe), ``ProbeTimeoutOpt`` (``--timeout``/``-t``, seconds one host's
probe may take, 60).
Deploy state: ``DeployStateDirOpt`` (``--state-dir`` of deploy and failover).
"""

from __future__ import annotations

import typer

from clusterctl.cli import _complete

# --- inventory and output ---------------------------------------------------------------------

InventoryOpt = typer.Option(
    None,
    "--inventory",
    "-i",
    envvar="CLUSTERCTL_INVENTORY",
    help="Inventory file [default: user config, then ./inventory.yaml].",
)
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")
OutputOpt = typer.Option(None, "--output", "-o", help="Write here (atomically) instead of stdout.")

# --- hosts ------------------------------------------------------------------------------------

HostsArg = typer.Argument(
    ..., help="Hosts: names, gpu[01-08], @group, label=value, @failed, all.", autocompletion=_complete.hosts
)
HostsAllArg = typer.Argument(
    "all", help="Hosts: names, gpu[01-08], @group, label=value, all.", autocompletion=_complete.hosts
)
HostsOpt = typer.Option("all", "--hosts", "-H", help="Hosts: names, gpu[01-04], @group, label=value.")

# --- SSH, the fan-out, sudo -------------------------------------------------------------------

FanoutOpt = typer.Option(None, "--fanout", "-f", min=1, help="Hosts worked on at once [default: user config, 64].")
HostKeyOpt = typer.Option(
    None, "--host-key-policy", help="Override the inventory: accept-new, strict or off (off warns)."
)
DeadlineOpt = typer.Option(
    None, "--deadline", min=0.1, help="Seconds the whole run may take; unfinished hosts become timeout rows."
)
ConnectTimeoutOpt = typer.Option(
    None,
    "--connect-timeout",
    min=0.1,
    help="Seconds for TCP connect, SSH handshake and auth [default: inventory, then user config, 10].",
)
AskBecomePassOpt = typer.Option(False, "--ask-become-pass", "-K", help="Prompt once for the sudo password.")
ProbeSudoOpt = typer.Option(False, "--sudo", help="Run the probe as root via sudo (to read a root-only kernel log).")
ProbeTimeoutOpt = typer.Option(60.0, "--timeout", "-t", min=1, help="Seconds one host's probe may take.")

# --- deploy state -----------------------------------------------------------------------------

DeployStateDirOpt = typer.Option(
    None, "--state-dir", help="Deploy state directory [default: $CLUSTERCTL_STATE_DIR, else <state_dir>/deploy]."
)
