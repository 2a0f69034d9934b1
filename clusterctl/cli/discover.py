"""``clusterctl inventory discover`` and ``inventory diff``: an inventory from the hosts' facts,
and where an inventory and the hosts disagree (core: ``clusterctl.inventory.discover``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, List, Optional

import typer
import yaml

from clusterctl.cli import _complete
from clusterctl.cli._common import InventoryOpt, JsonOpt, console, err_console, fail, load_inventory, print_json
from clusterctl.cli._hosts import ConnectTimeoutOpt, FanoutOpt, HostKeyOpt, HostProgress, select
from clusterctl.errors import ClusterctlError

FactsOpt = typer.Option(
    None,
    "--facts",
    help="Read the facts from this file (what `clusterctl facts PATTERN "
    "--json` printed) instead of reaching the hosts.",
)


def _gather(
    hosts: list[Any],
    *,
    fanout: Optional[int],
    connect_timeout: Optional[float],
    host_key_policy: Optional[str],
    progress: bool,
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """``(facts, missing, engines)`` of ``hosts`` over SSH: the probe, then the engine search."""

    from clusterctl.cli._common import user_config
    from clusterctl.cli._hosts import check_host_key_policy
    from clusterctl.cli.facts import as_row  # the same progress rows as `facts`
    from clusterctl.fleet.factory import make_fleet
    from clusterctl.inventory.discover import ENGINE_PROBE, parse_engines
    from clusterctl.probe.run import collect_facts

    fleet = make_fleet(
        hosts,
        user_config(),
        fanout=fanout,
        connect_timeout=connect_timeout,
        host_key_policy=check_host_key_policy(host_key_policy),
    )
    with fleet:
        with HostProgress(len(hosts), "facts", progress) as on_result:
            results = collect_facts(fleet, on_result=lambda r: on_result(as_row(r)))
        found = fleet.run(ENGINE_PROBE, sudo=False)
    facts = {h: r.facts.raw for h, r in results.items() if r.ok and r.facts is not None}
    missing = {h: str(r.reason) for h, r in results.items() if not (r.ok and r.facts is not None)}
    engines = {r.host: parse_engines(r.stdout) for r in found if r.ok}
    return facts, missing, engines


def _read_facts(path: str) -> tuple[dict[str, Any], dict[str, str]]:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror}")
    except ValueError as e:
        fail(f"{path}: not JSON: {e}")
    if not isinstance(doc, dict):
        fail(f"{path}: expected an object of host -> facts (clusterctl facts PATTERN --json)")
    facts = {h: d for h, d in doc.items() if isinstance(d, dict) and "status" not in d}
    missing = {h: str(d.get("reason")) for h, d in doc.items() if isinstance(d, dict) and "status" in d}
    return facts, missing


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
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here (atomically) instead of stdout."),
    force: bool = typer.Option(False, "--force", help="Overwrite --output if it exists."),
    facts_file: Optional[str] = FactsOpt,
    json_out: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.inventory.discover import discover as _discover
    from clusterctl.inventory.loader import load_inventory_text
    from clusterctl.inventory.nodeset import expand

    if output is not None and output.exists() and not force:
        fail(f"{output} exists: give --force to overwrite it, or another --output")
    try:
        rule = re.compile(rack_rule) if rack_rule else None
    except re.error as e:
        fail(f"--rack-rule {rack_rule!r} is not a regular expression: {e}")
    if rule is not None and not set(rule.groupindex) & {"rack", "leaf"}:
        fail("--rack-rule needs a named group rack or leaf, e.g. 'r(?P<rack>\\d+)n'")
    if ansible is not None:
        from clusterctl.inventory.ansible import import_ansible

        try:
            imported = import_ansible(ansible)
        except ClusterctlError as e:
            fail(str(e))
        for w in imported.warnings:
            err_console.print(f"warning: {w}", markup=False)
        base = imported.data
    elif hosts:
        try:
            names = [n for h in hosts for n in expand(h)]
        except ClusterctlError as e:
            fail(str(e))
        ssh = {
            k: v
            for k, v in (("user", user), ("port", port if port != 22 else None), ("identity_file", identity))
            if v is not None
        }
        base = {
            "version": 1,
            **({"defaults": {"ssh": ssh}} if ssh else {}),
            "hosts": {n: {"address": n} for n in names},
        }
    else:
        fail("give HOSTS or --ansible FILE")
    try:
        inv = load_inventory_text(yaml.safe_dump(base, sort_keys=False), str(ansible or "<hosts>"), force=True)
    except ClusterctlError as e:
        fail(str(e))
    engines: dict[str, Any] | None = None
    if facts_file:
        facts, missing = _read_facts(facts_file)
        facts = {h: d for h, d in facts.items() if h in inv.hosts}
        missing = {h: why for h, why in missing.items() if h in inv.hosts}
        missing.update({h: "not in the facts file" for h in inv.hosts if h not in facts and h not in missing})
    else:
        facts, missing, engines = _gather(
            list(inv.hosts.values()),
            fanout=fanout,
            connect_timeout=connect_timeout,
            host_key_policy=host_key_policy,
            progress=not json_out,
        )
    result = _discover(facts, base, engines=engines, rack_rule=rule, missing=missing)
    text = (
        "# Written by `clusterctl inventory discover`: review it before use.\n"
        + "".join(f"# - {n}\n" for n in result.notes)
        + yaml.safe_dump(result.data, sort_keys=False, width=110)
    )
    try:
        load_inventory_text(text, str(output or "<output>"), force=True)
    except ClusterctlError as e:
        fail(f"the discovered inventory does not validate (a bug; please report it):\n{e}")
    if json_out:
        print_json({"inventory": result.data, "notes": result.notes, "unreached": missing})
    elif output is None:
        typer.echo(text, nl=False)
    if output is not None:
        from clusterctl.files import write_atomic

        try:
            write_atomic(output, text)
        except OSError as e:
            fail(f"{output}: cannot write: {e.strerror}")
        if not json_out:
            err_console.print(
                f"wrote {output}: {len(result.data.get('hosts') or {})} hosts, {len(result.notes)} notes", markup=False
            )
    raise typer.Exit(3 if missing and not facts else 0)


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
    from clusterctl.inventory.discover import diff as _diff

    _, hosts = select(inventory, pattern)
    inv = load_inventory(inventory)
    engines = None
    if facts_file:
        facts, missing = _read_facts(facts_file)
        names = {h.name for h in hosts}
        facts = {h: d for h, d in facts.items() if h in names}
        missing = {h: why for h, why in missing.items() if h in names}
        missing.update({h: "not in the facts file" for h in names if h not in facts and h not in missing})
    else:
        facts, missing, engines = _gather(
            hosts,
            fanout=fanout,
            connect_timeout=connect_timeout,
            host_key_policy=host_key_policy,
            progress=not json_out,
        )
    diffs = _diff(inv, facts, missing=missing, engines=engines)
    code = 1 if any(d.severity == "WARN" for d in diffs) else 3 if diffs else 0
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
