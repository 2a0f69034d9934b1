"""``clusterctl inventory discover`` and ``inventory diff``: an inventory from the hosts' facts,
and where an inventory and the hosts disagree (core: ``clusterctl.inventory.discover``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

from clusterctl.cli import _complete
from clusterctl.cli._common import console, err_console, fail, load_inventory, print_json, user_config
from clusterctl.cli._hosts import check_host_key_policy, select
from clusterctl.cli._options import ConnectTimeoutOpt, FanoutOpt, HostKeyOpt, InventoryOpt, JsonOpt, OutputOpt
from clusterctl.errors import ClusterctlError

FactsOpt = typer.Option(
    None,
    "--facts",
    help="Read the facts from this file (what `clusterctl facts PATTERN "
    "--json` printed) instead of reaching the hosts.",
)


def _reach(
    fanout: Optional[int], connect_timeout: Optional[float], host_key_policy: Optional[str], facts_file: Optional[str]
) -> Any:
    """How the hosts are reached (``ops.discover.Reach``); the host-key policy is checked only when
    the hosts are reached (not with --facts)."""
    from clusterctl.ops.discover import Reach

    policy = None if facts_file else check_host_key_policy(host_key_policy)
    return Reach(user_config(), fanout=fanout, connect_timeout=connect_timeout, host_key_policy=policy)


def _view(progress: bool) -> Any:
    """The per-host progress of the probe (as ``clusterctl facts`` shows it)."""
    from clusterctl.cli.doctor import ProbeView

    return ProbeView(progress, label="facts")


DISCOVER_HELP = """Write an inventory from what the hosts are: GPUs by model and count, NICs
with their role guessed (an RDMA port is a data NIC, the first other physical
NIC that is up the management NIC), racks and leaves from a naming rule, the
vLLM installations found (/opt/*/bin/vllm, /usr/local/bin, PATH). Review it:
what was guessed is listed in comments at the top.

HOSTS are names or addresses (node sets such as 10.0.0.[1-16] or gpu[01-16]);
or --ansible reads hosts, groups and SSH settings from an Ansible inventory.
--rack-rule is a regular expression with named groups rack and/or leaf,
matched against each host name.

Examples:

  clusterctl inventory discover 'gpu[01-16]' --user ops --rack-rule 'r(?P<rack>\\d+)' -o site.yaml

  clusterctl inventory discover --ansible hosts.ini -o site.yaml

  clusterctl inventory discover --facts facts.json 'gpu[01-02]'     # offline, from saved facts
"""


def discover(
    hosts: List[str] = typer.Argument(None, help="Host names or addresses (node sets)."),
    ansible: Optional[Path] = typer.Option(
        None, "--ansible", help="Take the hosts from this Ansible inventory (INI or YAML)."
    ),
    user: Optional[str] = typer.Option(None, "--user", help="SSH login user [default: root]."),
    port: int = typer.Option(22, "--port", min=1, max=65535, help="SSH port."),
    identity: Optional[str] = typer.Option(None, "--identity", help="SSH private key file."),
    rack_rule: Optional[str] = typer.Option(
        None, "--rack-rule", help="Regex with (?P<rack>...) and/or (?P<leaf>...) groups, matched on host names."
    ),
    output: Optional[Path] = OutputOpt,
    force: bool = typer.Option(False, "--force", help="Overwrite --output if it exists."),
    facts_file: Optional[str] = FactsOpt,
    json_out: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.ops import discover as ops

    if output is not None and output.exists() and not force:
        fail(f"{output} exists: give --force to overwrite it, or another --output")
    request = ops.DiscoverRequest(
        _reach(fanout, connect_timeout, host_key_policy, facts_file),
        hosts=tuple(hosts or ()),
        ansible=ansible,
        user=user,
        port=port,
        identity=identity,
        rack_rule=rack_rule,
        facts_file=facts_file,
    )
    try:
        done = ops.discover(
            request,
            on_event=_view(not json_out),
            on_warning=lambda w: err_console.print(f"warning: {w}", markup=False),
            output=output,
        )
        if output is not None:
            ops.save(done, output)
    except ClusterctlError as e:
        fail(str(e))
    if json_out:
        print_json({"inventory": done.data, "notes": done.notes, "unreached": done.missing})
    elif output is None:
        typer.echo(done.text, nl=False)
    if output is not None and not json_out:
        err_console.print(
            f"wrote {output}: {len(done.data.get('hosts') or {})} hosts, {len(done.notes)} notes", markup=False
        )
    raise typer.Exit(done.exit_code)


DIFF_HELP = """Show where the inventory and the hosts disagree: GPU count, model and memory
(a host with 7 GPUs where the inventory says 8), NICs declared but absent or
without their RDMA port, link speeds, RDMA ports the inventory does not list,
and engines an instance on the host needs that are not installed.

Exit status: 0 they agree, 1 some difference, 3 some host could not be read
(and nothing else differs).

Examples:

  clusterctl inventory diff -i site.yaml

  clusterctl inventory diff '@rack1' -i site.yaml --json

  clusterctl inventory diff -i site.yaml --facts facts.json     # offline
"""


def diff(
    pattern: str = typer.Argument("all", help="Hosts to compare.", autocompletion=_complete.hosts),
    inventory: Optional[str] = InventoryOpt,
    facts_file: Optional[str] = FactsOpt,
    json_out: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.ops import discover as ops

    _, hosts = select(inventory, pattern)
    inv = load_inventory(inventory)
    try:
        done = ops.diff(
            inv,
            hosts,
            _reach(fanout, connect_timeout, host_key_policy, facts_file),
            facts_file=facts_file,
            on_event=_view(not json_out),
        )
    except ClusterctlError as e:
        fail(str(e))
    diffs, code = done.differences, done.exit_code
    if json_out:
        print_json({"differences": [d.to_json() for d in diffs], "hosts": len(hosts), "exit_code": code})
    elif not diffs:
        console.print(f"{len(hosts)} hosts: the inventory and the facts agree", markup=False)
    else:
        from rich.table import Table

        t = Table("host", "what", "inventory", "facts")
        for d in diffs:
            t.add_row(d.host, d.what, d.inventory, d.facts, style="magenta" if d.severity == "UNKNOWN" else None)
        console.print(t)
        console.print(f"{len(diffs)} differences on {len({d.host for d in diffs})} of {len(hosts)} hosts", markup=False)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``discover`` and ``diff`` to the ``inventory`` group."""
    app.command("discover", help=DISCOVER_HELP)(discover)
    app.command("diff", help=DIFF_HELP)(diff)
