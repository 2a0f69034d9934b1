"""``clusterctl engine list``: the inventory's vLLM engines on each host (docs/bring-up.md)."""

from __future__ import annotations

from typing import List, Optional

import typer

from clusterctl.cli._common import InventoryOpt, JsonOpt, console, fail, print_json
from clusterctl.cli._hosts import AskBecomePassOpt, ConnectTimeoutOpt, FanoutOpt, HostKeyOpt
from clusterctl.cli._plan_views import HostsOpt, prepare
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

app = typer.Typer(help="vLLM engines: which of the inventory's engines each host has.",
                  no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]},
                  rich_markup_mode=None)

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
def list_(names: Optional[List[str]] = typer.Argument(None, help="Engine names (default: all)."),
          inventory: Optional[str] = InventoryOpt,
          hosts_pattern: str = HostsOpt,
          as_json: bool = JsonOpt,
          fanout: Optional[int] = FanoutOpt,
          connect_timeout: Optional[float] = ConnectTimeoutOpt,
          ask_become_pass: bool = AskBecomePassOpt,
          host_key_policy: Optional[str] = HostKeyOpt) -> None:
    from clusterctl.ops import bringup

    request = prepare(inventory, hosts_pattern, None, 0.0, False, False, host_key_policy, fanout, connect_timeout,
                      ask_become_pass)
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
        console.print(f"engine list: {len(rows)} rows; {missing} missing or not executable; "
                      f"{sum(r.state == 'unread' for r in rows)} unread", markup=False)
    if any(r.state == "unread" for r in rows):
        raise typer.Exit(ExitCode.CRIT)
    if any(r.state != "installed" or r.version_matches is False for r in rows):
        raise typer.Exit(ExitCode.WARN)
    raise typer.Exit(ExitCode.OK)
