"""``clusterctl exec`` and ``clusterctl ping``: run a command on many hosts.

Output is gathered: each distinct result is printed once with its hosts as a
node set (``gpu[01-04,07]``).  Exit codes: ``exec`` exits with the worst
host's remote rc (124 for a timeout, 127 for no python3), 255 when any host
could not be reached, authenticated or verified, 3 for usage errors;
``ping`` exits 0 when every host answered, 2 when some did not, 3 for usage
errors.  The hosts that failed are remembered for ``@failed``.
"""

from __future__ import annotations

import statistics
import sys
from typing import List, Optional

import typer

from clusterctl.cli._common import console, err_console, fail, print_json, user_config
from clusterctl.cli._hosts import (
    BECOME_PASSWORD_ENV,
    HostProgress,
    become_password,
    check_host_key_policy,
    fleets,
    select,
)
from clusterctl.cli._options import (
    ConnectTimeoutOpt,
    DeadlineOpt,
    FanoutOpt,
    HostKeyOpt,
    HostsArg,
    InventoryOpt,
    JsonOpt,
)
from clusterctl.exitcodes import ExitCode
from clusterctl.fleet.results import HostStatus, RunResults, fold
from clusterctl.inventory.model import Host


def _run(
    path: str,
    hosts: list[Host],
    command: str,
    *,
    fanout: Optional[int],
    connect_timeout: Optional[float],
    timeout: Optional[float],
    deadline: Optional[float],
    sudo: bool,
    policy: Optional[str],
    become_password: Optional[str],
    progress: bool,
    label: str,
    record_as: Optional[str] = None,
) -> RunResults:
    """Run ``command`` through :mod:`clusterctl.ops.adhoc` with per-host progress; the warnings printed."""
    from clusterctl.ops import adhoc

    make = fleets(
        fanout=fanout,
        connect_timeout=connect_timeout,
        become_password=become_password,
        host_key_policy=policy,
        command_timeout=timeout or None,
        deadline=deadline,
    )
    request = adhoc.CommandRequest(hosts, make, command, user_config().state_dir, path, sudo=sudo, record_as=record_as)
    with HostProgress(len(hosts), label, progress) as on_result:
        run = adhoc.run(request, on_result)
    for w in run.warnings:
        err_console.print(f"warning: {w}", markup=False)
    return run.results


def _print_gathered(res: RunResults) -> None:
    for g in res.gather():
        if g.status is HostStatus.OK or g.status is HostStatus.FAILED:
            head = f"{g.nodeset} ({len(g.hosts)})" + (f" rc={g.rc}" if g.rc else "")
            console.print("-" * min(60, max(15, len(head))), markup=False)
            console.print(head, markup=False, style="bold" if g.rc == 0 else "bold red")
            console.print("-" * min(60, max(15, len(head))), markup=False)
            console.file.flush()
            if g.stdout:  # the command's bytes as they were: no wrapping, no markup
                sys.stdout.write(g.stdout if g.stdout.endswith("\n") else g.stdout + "\n")
                sys.stdout.flush()
            if g.stderr:
                sys.stderr.write(f"[{g.nodeset}] stderr:\n")
                sys.stderr.write(g.stderr if g.stderr.endswith("\n") else g.stderr + "\n")
                sys.stderr.flush()
    problems = [g for g in res.gather() if g.status not in (HostStatus.OK, HostStatus.FAILED)]
    for g in problems:
        err_console.print(
            f"{g.status.value}: {g.nodeset} ({len(g.hosts)}): {g.error}", markup=False, highlight=False, soft_wrap=True
        )
    counts = res.by_status()
    summary = ", ".join(f"{len(h)} {s.value}" for s, h in counts.items())
    err_console.print(f"{len(res)} hosts: {summary} in {res.duration_s:.1f}s", markup=False)


def exec_cmd(
    pattern: str = HostsArg,
    command: List[str] = typer.Argument(..., help="The command (words are joined by spaces, as ssh does)."),
    inventory: Optional[str] = InventoryOpt,
    fanout: Optional[int] = FanoutOpt,
    timeout: Optional[float] = typer.Option(
        None, "--timeout", "-t", min=0.1, help="Seconds per command [default: user config, 60]."
    ),
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    deadline: Optional[float] = DeadlineOpt,
    sudo: bool = typer.Option(False, "--sudo", help="Run as root via sudo on hosts that log in as another user."),
    ask_become_pass: bool = typer.Option(
        False,
        "--ask-become-pass",
        "-K",
        help=f"Prompt once for the sudo password (else ${BECOME_PASSWORD_ENV}; "
        "without either, sudo must not need one).",
    ),
    host_key_policy: Optional[str] = HostKeyOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Run COMMAND on every selected host; print each distinct output once.

    Exit code: the worst host's rc (124 timeout, 127 no python3), 255 when a
    host was unreachable, refused our key or showed a changed host key.

    Example: clusterctl exec 'gpu[01-16]' --timeout 20 -- nvidia-smi -L
    """
    policy = check_host_key_policy(host_key_policy)
    text = " ".join(command)
    if not text.strip():
        fail("no command given (put it after --)")
    path, hosts = select(inventory, pattern)
    password = become_password(ask_become_pass, hosts, sudo)
    res = _run(
        path,
        hosts,
        text,
        fanout=fanout,
        connect_timeout=connect_timeout,
        timeout=timeout,
        deadline=deadline,
        sudo=sudo,
        policy=policy,
        become_password=password,
        progress=not as_json,
        label="exec",
    )
    if as_json:
        print_json({"command": text, **res.to_dict()})
    else:
        _print_gathered(res)
    raise typer.Exit(res.worst_rc())


def ping(
    pattern: str = HostsArg,
    inventory: Optional[str] = InventoryOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    deadline: Optional[float] = DeadlineOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Connect to every selected host and run `true`; a table per status.

    Exit 0 when every host answered, 2 when some did not, 3 on usage errors.

    Example: clusterctl ping all --fanout 128
    """
    policy = check_host_key_policy(host_key_policy)
    path, hosts = select(inventory, pattern)
    res = _run(
        path,
        hosts,
        "true",
        fanout=fanout,
        connect_timeout=connect_timeout,
        timeout=None,
        deadline=deadline,
        sudo=False,
        policy=policy,
        become_password=None,
        progress=not as_json,
        label="ping",
        record_as="ping",
    )
    code = ExitCode.OK if res.all_ok() else ExitCode.CRIT
    if as_json:
        print_json({"ok": res.all_ok(), **res.to_dict()})
        raise typer.Exit(code)
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title=None, show_lines=False, box=box.SIMPLE_HEAD)
    table.add_column("status", no_wrap=True)
    table.add_column("hosts", overflow="fold", min_width=10)  # a node set is never cut short
    for col in ("count", "min s", "median s", "max s"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("detail", overflow="ellipsis", no_wrap=True, max_width=40)
    long: list[tuple[str, str]] = []
    for g in res.gather():
        times = [res[h].duration_s for h in g.hosts]
        detail = g.error or (f"rc={g.rc}" if g.rc else "")
        if len(detail) > 40:
            long.append((fold(g.hosts), detail))
        table.add_row(
            g.status.value,
            fold(g.hosts),
            str(len(g.hosts)),
            f"{min(times):.2f}",
            f"{statistics.median(times):.2f}",
            f"{max(times):.2f}",
            detail,
        )
    # Not a terminal: no width to fit, so keep rows on one line for grep and logs.
    out = console if console.is_terminal else Console(width=200, highlight=False)
    out.print(table)
    for nodes, detail in long:  # the full message, once per group
        out.print(f"{nodes}: {detail}", markup=False, highlight=False, soft_wrap=True)
    ok = len(res.by_status().get(HostStatus.OK, []))
    console.print(f"{ok}/{len(res)} hosts answered in {res.duration_s:.1f}s", markup=False)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``exec`` and ``ping`` to the top-level app."""
    app.command("exec")(exec_cmd)
    app.command("ping")(ping)
