"""``clusterctl logs``: the journal of instances (or the kernel log of hosts) across hosts.

Each TARGET is an instance (a glob over instance names: its unit's journal on every
host of its TP group) or, when it names no instance, a host pattern (the kernel log
of those hosts).  Lines of all hosts are interleaved by time, each with its host
and source; ``-f`` follows over one SSH channel per host until Ctrl-C or ``--for``.
The workflow is ``clusterctl.ops.logs``, the reading ``clusterctl.fleet.logs``.
"""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any, List, Optional

import typer

from clusterctl.cli import _complete
from clusterctl.cli._common import console, err_console, fail, load_inventory
from clusterctl.cli._hosts import deploy_state_dir, failed_hosts, inventory_fleet
from clusterctl.cli._options import AskBecomePassOpt, ConnectTimeoutOpt, HostKeyOpt, InventoryOpt, JsonOpt
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

LOGS_HELP = """Show the journal of instances, or the kernel log of hosts, across hosts,
interleaved by time with the host and the source on every line.

TARGET is an instance name or glob (its unit clusterctl-NAME.service on each host
of its TP group, with systemd's own lines about the unit) or, when it names no
instance, a host pattern as everywhere else (the kernel log of those hosts). Give
several; --kernel adds the kernel log of the instances' hosts too.

Without -f: the last --lines lines per host (with --grep: of the matching lines),
merged by time. With -f: the last --lines (default 10) then every new line as it
is written, over one SSH channel per host, until Ctrl-C or --for SECONDS. A host
that cannot be read is reported on stderr and the others go on. Exit status: 0,
3 when some host could not be read (or a usage error).

Examples:

  clusterctl logs qwen-a --since 10m

  clusterctl logs 'qwen-*' -f --grep 'ERROR|Traceback'

  clusterctl logs 'gpu[01-16]' --grep Xid        # kernel log of 16 hosts

  clusterctl logs qwen-a --kernel -f --for 60 --json
"""

_COLOURS = ("cyan", "green", "magenta", "blue", "yellow", "bright_cyan", "bright_green", "bright_magenta")


def _stamp(t: Optional[float]) -> str:
    if t is None:
        return "-" * 23
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class _Printer:
    """One line per entry: JSON lines, plain text when piped, colours on a terminal."""

    def __init__(self, json_out: bool, width: int):
        self.json_out = json_out
        self.width = width
        self.tty = console.is_terminal and not json_out
        self.colour: dict[str, str] = {}

    def __call__(self, line: Any) -> None:
        if self.json_out:
            sys.stdout.write(json.dumps(line.to_json()) + "\n")
        elif not self.tty:
            sys.stdout.write(
                f"{_stamp(line.time)} {line.host}/{line.source}".ljust(self.width + 25) + f" {line.text}\n"
            )
        else:
            from rich.text import Text

            c = self.colour.setdefault(line.host, _COLOURS[len(self.colour) % len(_COLOURS)])
            t = Text(_stamp(line.time) + " ", style="dim")
            t.append(f"{line.host}/{line.source}".ljust(self.width), style=c)
            p = line.priority
            t.append(" " + line.text, style="bold red" if p is not None and p <= 3 else "yellow" if p == 4 else "")
            console.print(t, soft_wrap=True)
        sys.stdout.flush()


def logs(
    targets: List[str] = typer.Argument(
        ..., help="Instance names/globs, or host patterns (kernel log).", autocompletion=_complete.targets
    ),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines as they are written."),
    since: Optional[str] = typer.Option(
        None, "--since", help="Only lines newer than this: 90s, 10m, 2h, 1d ago, or a date '2026-12-01 14:30'."
    ),
    grep: Optional[str] = typer.Option(
        None, "--grep", "-g", help="Only lines whose message matches this regular expression (Python syntax)."
    ),
    lines: Optional[int] = typer.Option(
        None, "--lines", "-n", min=0, help="Lines per host [default: 200; 10 with -f; all with --since]."
    ),
    kernel: bool = typer.Option(False, "--kernel", help="Also the kernel log of the instances' hosts."),
    duration: Optional[float] = typer.Option(None, "--for", min=0.1, help="With -f: stop after this many seconds."),
    inventory: Optional[str] = InventoryOpt,
    json_out: bool = JsonOpt,
    state_dir: Optional[str] = typer.Option(
        None, "--state-dir", help="Deploy state directory (placed template replicas) [default: user config]."
    ),
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    fanout: Optional[int] = typer.Option(
        None, "--fanout", min=1, help="Hosts read at once without -f [default: user config, 64]."
    ),
) -> None:
    from clusterctl.ops import logs as ops

    if duration is not None and not follow:
        fail("--for needs -f (without -f the command ends when the lines are read)")
    try:
        opts = ops.options(follow=follow, since=since, grep=grep, lines=lines, duration=duration, kernel=kernel)
    except ClusterctlError as e:
        fail(str(e))
    inv = load_inventory(inventory)
    request = ops.LogsRequest(inv, deploy_state_dir(state_dir), targets, opts, failed_hosts(inventory))
    try:
        plan = ops.plan(request)
    except ClusterctlError as e:
        fail(str(e))
    show = _Printer(json_out, min(plan.label_width, 40))
    fleet = inventory_fleet(
        inv,
        plan.hosts,
        fanout=plan.fanout or fanout,
        connect_timeout=connect_timeout,
        host_key_policy=host_key_policy,
        ask_become_pass=ask_become_pass,
    )

    def report(host: str, status: str, why: str) -> None:
        err_console.print(f"{host}: {status}: {why}", markup=False)

    def notice(host: str, text: str) -> None:
        err_console.print(f"{host}: note: {text}", markup=False)

    failed = ops.run(plan, fleet, show, on_error=report, on_notice=notice)
    for w in fleet.warnings:
        err_console.print(f"warning: {w}", markup=False)
    raise typer.Exit(int(ExitCode.UNKNOWN) if failed else 0)


def register(app: typer.Typer) -> None:
    app.command("logs", help=LOGS_HELP)(logs)
