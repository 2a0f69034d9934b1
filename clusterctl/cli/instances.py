"""``clusterctl status`` and ``clusterctl start | stop | restart``: instances, one by one.

``status`` prints one row per instance (the inventory's instances and the
template replicas placement gives them), grouped by host or template: unit
state, restarts, age, health, engine and model versions, GPUs, KV usage,
running/waiting, throughput over ``--window`` and the load score.  Exit code
by monitoring convention: 0 all serving, 1 some degraded or under high load,
2 some down/failed/absent, 3 could not check (also usage errors).

``stop`` and ``restart`` drain first (gateway mark-down when one is
configured, then wait for in-flight requests, bounded by
``--drain-timeout``); ``start`` and ``restart`` wait for ``/health``.
Exit 0 when every instance did what was asked, 2 when some did not, 3 for
usage errors.  docs/status.md has the columns, the formula and the details.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import typer

from clusterctl.cli import _complete
from clusterctl.cli._common import cluster_line, cluster_meta, console, err_console, fail, load_inventory, print_json
from clusterctl.cli._hosts import deploy_state_dir, host_fleets_and_password, inventory_fleet
from clusterctl.cli._options import AskBecomePassOpt, ConnectTimeoutOpt, FanoutOpt, HostKeyOpt, InventoryOpt, JsonOpt
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.table import Table

    from clusterctl.ops.status import InstanceStatus

STATUS_HELP = """Show every instance: unit state, restarts, health, engine and model
version, TP group and GPUs, KV-cache usage, running/waiting requests,
generation throughput over --window seconds and the load score (0 = idle,
1 = do not send; formula in docs/status.md).

PATTERN selects instances by name (comma-separated globs, !glob excludes;
default all). Instances the inventory wants but no host runs are 'absent';
clusterctl units the inventory does not want are 'extra'. An unreachable host
is a row, never a stall. Exit status: 0 all serving, 1 some degraded or under
high load, 2 some down, failed or absent, 3 could not check.

With --watch (-w) it refreshes in place every --interval seconds, like top:
worst health first, then --sort (load, kv, queue, tps, ttft, restarts, name);
past --top instances (default: what fits the terminal) a table per template
sums them up first. TTFT p90 is over the requests whose first token came in
the last window (n/a: none). Piped, each refresh is printed; with --json, one
line each.

Examples:

  clusterctl status -i /var/lib/clusterctl-lab/inventory.yaml

  clusterctl status 'qwen-*' --window 5 --json

  clusterctl status --watch --sort kv --interval 2
"""

ACTION_HELP = {
    "start": """Start instances (systemctl start clusterctl-NAME.service) and wait until
/health answers; then mark them up at the gateway when one is configured.
Exit 0 when all are healthy, 2 when some are not, 3 for usage errors.

Example:

  clusterctl start 'qwen-*' -i /var/lib/clusterctl-lab/inventory.yaml
""",
    "stop": """Drain, then stop instances: mark each down at the gateway when one is
configured, wait until its running and waiting requests are 0 (at most
--drain-timeout seconds, then stop anyway), then systemctl stop. Streams in
flight finish. Exit 0 when all stopped, 2 when some did not, 3 for usage errors.

Example:

  clusterctl stop qwen-1 --drain-timeout 300
""",
    "restart": """Drain, restart and wait for /health on each instance (see stop, start).
Exit 0 when all are healthy again, 2 when some are not, 3 for usage errors.

Example:

  clusterctl restart 'qwen-*' --drain-timeout 120 --health-timeout 600
""",
}

STYLE = {"OK": "green", "WARN": "yellow", "CRIT": "bold red", "UNKNOWN": "magenta"}
StateDirOpt = typer.Option(
    None,
    "--state-dir",
    help="Deploy state directory (placements) [default: $CLUSTERCTL_STATE_DIR, then the user state dir]/deploy.",
)


def _age(s: Optional[float]) -> str:
    if s is None:
        return "-"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.0f}{unit}"
    return f"{s:.0f}s"


def _num(v: Optional[float], fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def render_table(rows: list[InstanceStatus], group_by: str) -> Table:
    """The rich table of status rows, one section per host or template."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False)
    for col in (
        "host" if group_by == "host" else "template",
        "instance",
        "state",
        "rst",
        "up",
        "engine",
        "model",
        "gpus",
        "kv",
        "run/wait",
        "tok/s",
        "load",
    ):
        table.add_column(col, no_wrap=True)
    table.add_column("note", overflow="fold", min_width=12)

    def key(r: InstanceStatus) -> str:
        return (r.host if group_by == "host" else r.template) or "-"

    prev = None
    for r in sorted(rows, key=lambda r: (key(r), r.name)):
        group = key(r)
        if prev is not None and group != prev:
            table.add_section()
        note = r.message
        if r.active and r.state != "serving" and r.active not in note:
            note = f"unit {r.active}/{r.sub}" + (f"; {note}" if note else "")
        table.add_row(
            escape(group) if group != prev else "",
            escape(r.name),
            f"[{STYLE[r.severity.name]}]{escape(r.state)}[/]",
            _num(r.restarts),
            _age(r.up_s),
            escape(r.running_version or r.engine_version or r.engine or "-"),
            escape(r.model_version or r.model or "-"),
            escape(_gpu_list(r.gpus)),
            _num(None if r.kv_usage is None else r.kv_usage * 100, "{:.0f}%"),
            "-" if r.running is None else f"{r.running:.0f}/{r.waiting or 0:.0f}",
            _num(r.tokens_per_s, "{:.0f}"),
            _num(r.load, "{:.2f}"),
            escape(note),
        )
        prev = group
    return table


def _gpu_list(gpus: tuple[str, ...]) -> str:
    """``st01:0,st01:1`` → ``st01:0,1`` (one host per TP group)."""
    if not gpus:
        return "-"
    hosts = {g.rpartition(":")[0] for g in gpus}
    if len(hosts) == 1:
        return f"{hosts.pop()}:" + ",".join(g.rpartition(":")[2] for g in gpus)
    return ",".join(gpus)


def status(
    pattern: Optional[str] = typer.Argument(
        None, help="Instance names: globs, comma-separated [all].", autocompletion=_complete.instances
    ),
    inventory: Optional[str] = InventoryOpt,
    json_out: bool = JsonOpt,
    window: float = typer.Option(
        10.0, "--window", min=0.0, help="Seconds between the two /metrics samples (throughput); 0: one."
    ),
    group_by: str = typer.Option("host", "--group-by", help="Group rows by host or template."),
    state_dir: Optional[str] = StateDirOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    watch: bool = typer.Option(
        False,
        "--watch",
        "-w",
        help="Refresh in place until Ctrl-C: worst first, grouped by template past --top instances.",
    ),
    interval: float = typer.Option(5.0, "--interval", min=0.0, help="With --watch: seconds between refreshes."),
    sort: str = typer.Option(
        "load", "--sort", help="With --watch: load, kv, queue, tps, ttft, restarts or name (after health)."
    ),
    top: Optional[int] = typer.Option(None, "--top", min=1, help="With --watch: instances shown [default: what fits]."),
    count: Optional[int] = typer.Option(None, "--count", min=1, help="With --watch: stop after N refreshes."),
) -> None:
    from clusterctl.ops import status as ops

    if group_by not in ("host", "template"):
        fail(f"--group-by must be host or template (got {group_by!r})")
    inv = load_inventory(inventory)
    request = ops.StatusRequest(inv, deploy_state_dir(state_dir), pattern, window)
    try:
        selection = ops.select(request)
    except ClusterctlError as e:
        fail(str(e))
    fleet = inventory_fleet(
        inv,
        selection.hosts,
        fanout=fanout,
        connect_timeout=connect_timeout,
        host_key_policy=host_key_policy,
        ask_become_pass=ask_become_pass,
    )
    from clusterctl.cli._progress import Lines

    notes = Lines(not json_out)  # a line on stderr per step, nothing with --json
    if watch:
        from clusterctl.cli.watch import SORTS, run_watch

        if sort not in SORTS:
            fail(f"--sort must be one of {', '.join(SORTS)} (got {sort!r})")
        refresh_window = min(window, max(interval - 0.5, 0.0))
        try:
            with fleet:
                code = run_watch(
                    lambda: ops.collect(request, selection, fleet, window=refresh_window).rows,
                    interval=interval,
                    sort=sort,
                    top=top,
                    count=count,
                    json_out=json_out,
                    console=console,
                )
        except ClusterctlError as e:
            fail(str(e))
        raise typer.Exit(code)
    try:
        with fleet:
            run = ops.collect(request, selection, fleet, on_event=notes.note)
    except ClusterctlError as e:
        fail(str(e))
    rows = run.rows
    for w in fleet.warnings:
        err_console.print(f"warning: {w}", markup=False)
    code = run.code
    if json_out:
        print_json({"instances": [r.to_json() for r in rows], "window_s": window, "exit_code": code, **cluster_meta()})
    elif rows:
        # Piped output is not cut to 80 columns: one full row per instance for grep.
        from rich.console import Console

        out = console if console.is_terminal else Console(width=240, highlight=False)
        if cluster_line():  # on stderr: stdout stays one row per line for grep
            err_console.print(cluster_line(), markup=False)
        out.print(render_table(rows, group_by))
    else:
        console.print("no instances in the inventory and no clusterctl units on its hosts")
    raise typer.Exit(code)


def _action(action: str) -> Any:
    def command(
        pattern: str = typer.Argument(
            ..., help="Instance names: globs, comma-separated.", autocompletion=_complete.instances
        ),
        inventory: Optional[str] = InventoryOpt,
        json_out: bool = JsonOpt,
        drain_timeout: float = typer.Option(
            120.0, "--drain-timeout", min=0.0, help="Seconds to wait for in-flight requests (stop, restart)."
        ),
        no_drain: bool = typer.Option(False, "--no-drain", help="Stop or restart without draining."),
        health_timeout: float = typer.Option(
            900.0, "--health-timeout", min=1.0, help="Seconds to wait for /health (start, restart)."
        ),
        poll: float = typer.Option(1.0, "--poll", min=0.1, help="Seconds between drain/health polls."),
        state_dir: Optional[str] = StateDirOpt,
        fanout: Optional[int] = FanoutOpt,
        connect_timeout: Optional[float] = ConnectTimeoutOpt,
        host_key_policy: Optional[str] = HostKeyOpt,
        ask_become_pass: bool = AskBecomePassOpt,
    ) -> None:
        from rich.markup import escape

        from clusterctl.ops.deploy import ActionRequest, run_instance_action
        from clusterctl.ops.status import StatusRequest, select_for_action

        inv = load_inventory(inventory)
        directory = deploy_state_dir(state_dir)
        try:
            selection = select_for_action(StatusRequest(inv, directory, pattern))
        except ClusterctlError as e:
            fail(str(e))
        hosts = selection.hosts
        make, password = host_fleets_and_password(
            [inv.hosts[h] for h in hosts if h in inv.hosts],
            fanout=fanout,
            connect_timeout=connect_timeout,
            host_key_policy=host_key_policy,
            ask_become_pass=ask_become_pass,
        )
        from clusterctl.cli._progress import Lines

        request = ActionRequest(
            inv,
            selection.instances,
            selection.wanted,
            directory,
            inventory_fleet(inv, hosts, fleets=make),
            action,  # type: ignore[arg-type]
            drain_first=not no_drain,
            drain_timeout=drain_timeout,
            poll=poll,
            health_timeout=health_timeout,
            gateway_password=password,
        )
        try:
            results = run_instance_action(request, Lines(not json_out).note)
        except ClusterctlError as e:
            fail(str(e))
        code = ExitCode.OK if all(r.ok for r in results) else ExitCode.CRIT
        if json_out:
            print_json({"action": action, "results": [r.to_json() for r in results], "exit_code": int(code)})
        else:
            for r in results:
                d = r.drain
                drained = (
                    ""
                    if d is None
                    else f", drained in {d.waited_s:.1f} s"
                    if d.drained
                    else f", drain timed out after {d.waited_s:.1f} s with {d.remaining} in flight"
                )
                health = f", healthy after {r.healthy_after_s:.1f} s" if r.healthy_after_s is not None else ""
                if r.units:  # a multi-node replica: every member, in the order acted on
                    health += f" (units: {', '.join(r.units)})"
                verdict = "[green]ok[/]" if r.ok else "[bold red]FAILED[/]"
                console.print(
                    f"{verdict} {action} "
                    + escape(f"{r.instance} on {r.host}{drained}{health}" + (f": {r.error}" if r.error else ""))
                )
        raise typer.Exit(int(code))

    command.__doc__ = ACTION_HELP[action]
    return command


def register(app: typer.Typer) -> None:
    """Add ``status``, ``start``, ``stop`` and ``restart`` to the top-level app."""
    app.command("status", help=STATUS_HELP)(status)
    for action in ("start", "stop", "restart"):
        app.command(action, help=ACTION_HELP[action])(_action(action))
