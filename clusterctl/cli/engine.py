"""``clusterctl engine list``: the inventory's vLLM engines on each host (docs/bring-up.md)."""

from __future__ import annotations

from typing import List, Optional

import typer

from clusterctl.cli._common import InventoryOpt, JsonOpt, console, fail, print_json
from clusterctl.cli._hosts import AskBecomePassOpt, ConnectTimeoutOpt, FanoutOpt, HostKeyOpt
from clusterctl.cli._plan_views import DetailedOpt, HostsOpt, MaxFailOpt, PlanOpt, SerialOpt, prepare
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

app = typer.Typer(
    help="vLLM engines: list, install and remove the inventory's engines on the hosts.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)

LIST_HELP = """Show, per host, each engine of the inventory (or the NAMEs given): whether
its executable (engines.NAME.path) is installed, the vLLM version its
virtualenv records (vllm-VERSION.dist-info; '-' when none is recorded, as with
the lab's simulator: never guessed), and the instance units that run it
(clusterctl-*.service, active or not). Read-only.

Exit status: 0 every engine installed where listed, 1 one is missing, not
executable or records another version than the inventory's, 2 a host could
not be read, 3 usage or inventory errors.

Examples:

  clusterctl engine list -i /var/lib/clusterctl-lab/inventory.yaml

  clusterctl engine list vllm-0.11 --hosts 'gpu[01-08]' --json
"""


@app.command("list", help=LIST_HELP)
def list_(
    names: Optional[List[str]] = typer.Argument(None, help="Engine names (default: all)."),
    inventory: Optional[str] = InventoryOpt,
    hosts_pattern: str = HostsOpt,
    as_json: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.ops import bringup

    request = prepare(
        inventory, hosts_pattern, None, 0.0, False, False, host_key_policy, fanout, connect_timeout, ask_become_pass
    )
    try:
        rows = bringup.engine_list(request, names)
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json({"engines": [r.to_dict() for r in rows]})
    else:
        for r in rows:
            ver = r.version or "-"
            if r.version_matches is False:
                ver += f" (inventory: {r.wanted_version})"
            units = ", ".join(f"{u} ({a})" for u, a in r.units) or "-"
            state = r.state + (f": {r.error}" if r.error else "")
            console.print(f"{r.host}  {r.engine}  {state}  version {ver}  units {units}  {r.path}", markup=False)
        missing = sum(r.state in ("missing", "not-executable") for r in rows)
        console.print(
            f"engine list: {len(rows)} rows; {missing} missing or not executable; "
            f"{sum(r.state == 'unread' for r in rows)} unread",
            markup=False,
        )
    if any(r.state == "unread" for r in rows):
        raise typer.Exit(ExitCode.CRIT)
    if any(r.state != "installed" or r.version_matches is False for r in rows):
        raise typer.Exit(ExitCode.WARN)
    raise typer.Exit(ExitCode.OK)


INSTALL_HELP = """Install the inventory's engine NAME on each host as its own virtualenv:
engines.NAME.path is ROOT/bin/vllm, ROOT is created with python3 -m venv in a
temp directory beside it, vllm==engines.NAME.version is installed with pip,
checked (the installed vllm-VERSION.dist-info is the inventory's version,
import vllm works, the executable is there) and only then renamed to ROOT: a
killed install never leaves a half engine where units run it.

Offline sites: --wheels DIR, a wheelhouse on this machine (pip download /
pip wheel of vllm and its dependencies), shipped to each host over SSH and
installed with pip --no-index --find-links. Hosts with network: --index-url
URL (a local mirror; sent on stdin, never on a command line).

A host that already has that version is unchanged; a path holding anything
else (another version, a build without a recorded version) is an error row and
never touched. Hosts go --serial at a time (default 1) and are read again
afterwards; a batch with more failures than --max-fail-percentage stops the run.

Exit status: 0 done or nothing to do (--plan: also with changes pending), 1
with --plan --detailed-exitcode when installs are pending, 2 a host failed or
could not be read, 3 usage or inventory errors.

Examples:

  clusterctl engine install vllm-0.11 --plan --hosts 'gpu[01-08]'

  clusterctl engine install vllm-0.11 --wheels ./wheelhouse-0.11.0 --hosts 'gpu[01-08]' --serial 25%

  clusterctl engine install vllm-0.11 --index-url http://mirror.internal/simple --json
"""

REMOVE_HELP = """Remove the inventory's engine NAME (its virtualenv, ROOT of ROOT/bin/vllm)
from each host. Refused on a host where a clusterctl-*.service unit's
ExecStart= runs that path (the units are named; remove or redeploy those
instances first), and for a ROOT that is not a virtualenv (no pyvenv.cfg).
A host without it is unchanged.

Exit status as engine install.

Examples:

  clusterctl engine remove vllm-0.11 --plan

  clusterctl engine remove vllm-0.11 --hosts 'gpu[01-08]' --json
"""


def _engine_op(
    name: str,
    remove: bool,
    wheels: Optional[str],
    index_url: Optional[str],
    inventory: Optional[str],
    plan_only: bool,
    detailed_exitcode: bool,
    hosts_pattern: str,
    serial: Optional[str],
    max_fail_percentage: float,
    as_json: bool,
    fanout: Optional[int],
    connect_timeout: Optional[float],
    ask_become_pass: bool,
    host_key_policy: Optional[str],
) -> None:
    from clusterctl.cli._plan_views import finish, stderr_events
    from clusterctl.ops import bringup

    request = prepare(
        inventory,
        hosts_pattern,
        serial,
        max_fail_percentage,
        plan_only,
        detailed_exitcode,
        host_key_policy,
        fanout,
        connect_timeout,
        ask_become_pass,
    )
    on_event = stderr_events(not as_json)
    verb = "remove" if remove else "install"

    def start() -> bringup.BringupPlan:
        if remove:
            return bringup.engine_remove(request, name, on_event)
        return bringup.engine_install(request, name, wheels=wheels, index_url=index_url, on_event=on_event)

    finish(
        start,
        plan_only,
        detailed_exitcode,
        as_json,
        f"engine {verb} {name}",
        verb=f"to {verb}",
        plan_json={"engine": name, "action": verb},
    )


@app.command("install", help=INSTALL_HELP)
def install(
    name: str = typer.Argument(..., help="The engine's name in the inventory's engines."),
    wheels: Optional[str] = typer.Option(
        None, "--wheels", help="A wheelhouse directory on this machine, shipped to the hosts (offline install)."
    ),
    index_url: Optional[str] = typer.Option(None, "--index-url", help="A package index (mirror) the hosts reach."),
    inventory: Optional[str] = InventoryOpt,
    plan_only: bool = PlanOpt,
    detailed_exitcode: bool = DetailedOpt,
    hosts_pattern: str = HostsOpt,
    serial: Optional[str] = SerialOpt,
    max_fail_percentage: float = MaxFailOpt,
    as_json: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    if not plan_only and wheels is None and index_url is None:
        fail("engine install needs --wheels DIR or --index-url URL (or --plan)")
    if wheels is not None and index_url is not None:
        fail("give one of --wheels and --index-url")
    _engine_op(
        name,
        False,
        wheels,
        index_url,
        inventory,
        plan_only,
        detailed_exitcode,
        hosts_pattern,
        serial,
        max_fail_percentage,
        as_json,
        fanout,
        connect_timeout,
        ask_become_pass,
        host_key_policy,
    )


@app.command("remove", help=REMOVE_HELP)
def remove(
    name: str = typer.Argument(..., help="The engine's name in the inventory's engines."),
    inventory: Optional[str] = InventoryOpt,
    plan_only: bool = PlanOpt,
    detailed_exitcode: bool = DetailedOpt,
    hosts_pattern: str = HostsOpt,
    serial: Optional[str] = SerialOpt,
    max_fail_percentage: float = MaxFailOpt,
    as_json: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    _engine_op(
        name,
        True,
        None,
        None,
        inventory,
        plan_only,
        detailed_exitcode,
        hosts_pattern,
        serial,
        max_fail_percentage,
        as_json,
        fanout,
        connect_timeout,
        ask_become_pass,
        host_key_policy,
    )
