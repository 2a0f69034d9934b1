"""``clusterctl logs``: the journal of instances (or the kernel log of hosts) across hosts.

Each TARGET is an instance (a glob over instance names: its unit's journal on every
host of its TP group) or, when it names no instance, a host pattern (the kernel log
of those hosts).  Lines of all hosts are interleaved by time, each with its host
and source; ``-f`` follows over one SSH channel per host until Ctrl-C or ``--for``.
The core is ``clusterctl.fleet.logs``.
"""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any, List, Optional

import typer

from clusterctl.cli import _complete
from clusterctl.cli._common import InventoryOpt, JsonOpt, console, err_console, fail, load_inventory
from clusterctl.cli._hosts import AskBecomePassOpt, ConnectTimeoutOpt, HostKeyOpt, instances_wanted, inventory_fleet
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


def _queries(
    inv: Any, inv_path: Optional[str], targets: List[str], state_dir: Optional[str], kernel: bool
) -> dict[str, Any]:
    """host -> HostQuery for the targets; exits 3 when a target names nothing."""
    from clusterctl.deploy.spec import unit_name
    from clusterctl.deploy.status.instances import match_instances
    from clusterctl.fleet.logs import HostQuery
    from clusterctl.inventory.select import select_hosts

    from clusterctl.cli._common import user_config
    from clusterctl.config import resolve_inventory_path
    from clusterctl.fleet.failed import load_failed

    wanted, _ = instances_wanted(inv, state_dir)
    failed = load_failed(user_config().state_dir, inventory=resolve_inventory_path(inv_path, user_config()))
    units: dict[str, dict[str, str]] = {}
    kern: set[str] = set()
    for t in targets:
        names = match_instances(wanted, t) if t.strip() not in ("all", "*", "") else []
        if names:
            for n in names:
                for h in wanted[n].hosts:
                    units.setdefault(h, {})[unit_name(n)] = n
                    if kernel:
                        kern.add(h)
            continue
        try:
            hosts = select_hosts(inv, t, failed=failed)
        except ClusterctlError as e:
            fail(f"{t!r} names no instance, and as a host pattern: {e}")
        if not hosts:
            fail(f"{t!r} selects neither an instance nor a host of the inventory")
        kern.update(h.name for h in hosts)
    return {h: HostQuery(units=units.get(h, {}), kernel=h in kern) for h in inv.hosts if h in units or h in kern}


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
    from clusterctl.fleet import logs as core

    if duration is not None and not follow:
        fail("--for needs -f (without -f the command ends when the lines are read)")
    try:
        since_arg = core.parse_since(since) if since else None
        pattern = core.compile_grep(grep)
    except ClusterctlError as e:
        fail(str(e))
    inv = load_inventory(inventory)
    queries = _queries(inv, inventory, targets, state_dir, kernel)
    if not queries:
        fail("nothing to read: the instances selected have no placement")
    n = lines if lines is not None else (10 if follow else (None if since else 200))
    width = max(
        len(f"{h}/{s}") for h, q in queries.items() for s in list(q.units.values()) + (["kernel"] if q.kernel else [])
    )
    show = _Printer(json_out, min(width, 40))
    hosts = sorted(queries)
    if follow:
        from clusterctl.fleet.fleet import max_fanout_for_fds, raise_nofile_limit

        most = max_fanout_for_fds(raise_nofile_limit())
        if len(hosts) > most:
            fail(
                f"-f needs one connection per host: {len(hosts)} hosts, but the open-file limit allows {most} "
                "(raise ulimit -n, or follow fewer hosts)"
            )
        fanout = len(hosts)
    fleet = inventory_fleet(
        inv,
        hosts,
        fanout=fanout,
        connect_timeout=connect_timeout,
        host_key_policy=host_key_policy,
        ask_become_pass=ask_become_pass,
    )

    def report(r: Any) -> None:
        if follow and core.follow_ended_normally(r, duration):
            return
        if not r.ok:
            why = r.error or (r.stderr.strip().splitlines() or [f"rc={r.rc}"])[-1]
            err_console.print(f"{r.host}: {r.status.value}: {why}", markup=False)

    def notice(host: str, text: str) -> None:
        err_console.print(f"{host}: note: {text}", markup=False)

    failed = False
    try:
        with fleet:
            if follow:
                res = core.follow(
                    fleet,
                    queries,
                    show,
                    lines=n,
                    since=since_arg,
                    grep=pattern,
                    duration=duration,
                    on_result=report,
                    on_notice=notice,
                )
                failed = any(not core.follow_ended_normally(r, duration) for r in res)
            else:
                out, res = core.read(
                    fleet, queries, lines=n, since=since_arg, grep=pattern, on_result=report, on_notice=notice
                )
                for line in out:
                    show(line)
                failed = any(not r.ok for r in res)
    except KeyboardInterrupt:  # the way a follow ends: connections are closed already
        if not follow:
            raise
    for w in fleet.warnings:
        err_console.print(f"warning: {w}", markup=False)
    raise typer.Exit(int(ExitCode.UNKNOWN) if failed else 0)


def register(app: typer.Typer) -> None:
    app.command("logs", help=LOGS_HELP)(logs)
