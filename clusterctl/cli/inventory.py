"""``clusterctl inventory``: validate, show and select from the inventory; import Ansible's.

Exit codes: 0 on success, 3 (UNKNOWN: could not run) for a bad inventory,
a bad pattern or a pattern that selects no host.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from clusterctl.cli import _complete
from clusterctl.cli._common import console, err_console, fail, load_inventory, print_json, user_config
from clusterctl.cli._options import InventoryOpt, JsonOpt, OutputOpt
from clusterctl.config import resolve_inventory_path
from clusterctl.errors import ClusterctlError, InventoryError
from clusterctl.exitcodes import USAGE_ERROR
from clusterctl.inventory.model import Host, Inventory
from clusterctl.inventory.nodeset import fold
from clusterctl.inventory.pdpools import ratio as pd_ratio

app = typer.Typer(
    help="Check, show and select from the inventory; import an Ansible inventory.\n\n"
    "\b\nExample: clusterctl inventory validate -i inventories/example-16xh100-roce.yaml",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@app.command()
def validate(
    inventory: Optional[str] = InventoryOpt,
    force: bool = typer.Option(False, "--force", help="Accept warnings (TP > 2 on PCIe-only hosts)."),
    as_json: bool = JsonOpt,
) -> None:
    """Check the inventory and list every problem as file:line: message.

    Prints "OK: N hosts, M groups, K instances" and exits 0, or lists every
    problem and exits 3.

    \b
    Example: clusterctl inventory validate -i inventories/example-pcie-small.yaml
    """
    from clusterctl.ops import inventory as ops

    path = resolve_inventory_path(inventory, user_config())
    try:
        inv = ops.validate(path, force=force)
    except InventoryError as e:
        if as_json:
            print_json({"ok": False, "inventory": path, "problems": [dataclasses.asdict(p) for p in e.problems]})
        else:
            for p in e.problems:
                console.print(str(p), markup=False)
            n_err = len(e.errors)
            n_warn = len(e.problems) - n_err
            err_console.print(f"FAILED: {n_err} error(s), {n_warn} warning(s) in {path}", markup=False)
        raise typer.Exit(USAGE_ERROR)
    summary = (
        f"OK: {len(inv.hosts)} hosts, {len(inv.groups)} groups, "
        f"{len(inv.instances)} instances, {len(inv.templates)} templates"
    )
    if as_json:
        print_json(
            {
                "ok": True,
                "inventory": path,
                "hosts": len(inv.hosts),
                "groups": len(inv.groups),
                "instances": len(inv.instances),
                "templates": len(inv.templates),
                "warnings": inv.warnings,
            }
        )
        return
    for w in inv.warnings:
        err_console.print(f"warning: {w}", markup=False)
    console.print(summary, markup=False)


@app.command()
def show(inventory: Optional[str] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """Show hosts (grouped when identical), instances and templates.

    Hosts whose groups, labels, GPUs and NICs are all the same share one row,
    their names and addresses folded (gpu[01-08]).

    \b
    Example: clusterctl inventory show -i inventories/example-16xh100-roce.yaml --json
    """
    inv = load_inventory(inventory)
    if as_json:
        print_json(inventory_json(inv))
        return
    for w in inv.warnings:
        err_console.print(f"warning: {w}", markup=False)
    console.print(_hosts_table(list(inv.hosts.values())))
    f = inv.fabric
    console.print(
        f"fabric: {f.kind}, trust {f.trust}, PFC priority {f.pfc_priority}, "
        f"RoCE DSCP {f.roce_dscp}, CNP DSCP {f.cnp_dscp}, MTU {f.mtu}",
        markup=False,
    )
    if inv.instances:
        t = Table(title="instances", title_justify="left")
        for col in ("instance", "model", "engine", "placement", "tp", "port", "role"):
            t.add_column(col)
        for i in inv.instances.values():
            t.add_row(i.name, i.model, i.engine, fold(str(g) for g in i.placement), str(i.tp_size), str(i.port), i.role)
        console.print(t)
    if inv.templates:
        t = Table(title="templates", title_justify="left")
        for col in ("template", "model", "engine", "replicas x tp", "hosts", "port base", "role"):
            t.add_column(col)
        for tp in inv.templates.values():
            t.add_row(tp.name, tp.model, tp.engine, f"{tp.replicas} x {tp.tp}", tp.hosts, str(tp.port_base), tp.role)
        console.print(t)
    if inv.pd_pools:
        t = Table(title="prefill/decode pools", title_justify="left")
        for col in ("pool", "model", "connector", "P:D", "prefill", "decode", "router"):
            t.add_column(col)
        for p in inv.pd_pools.values():
            pre, dec = pd_ratio(inv, p)
            t.add_row(
                p.name,
                p.model,
                p.connector,
                f"{pre}:{dec}",
                ", ".join(p.prefill),
                ", ".join(p.decode),
                f"{p.router.host}:{p.router.port} ({p.router.policy})",
            )
        console.print(t)


@app.command()
def hosts(
    pattern: str = typer.Argument(
        ...,
        help="Host pattern: names, ranges, @group, label=value, !exclusion, & intersection, @failed.",
        autocompletion=_complete.hosts,
    ),
    inventory: Optional[str] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """List the hosts a pattern selects, then the folded node set.

    Exits 3 when the pattern is malformed, names unknown hosts or groups, or
    selects nothing.

    \b
    Example: clusterctl inventory hosts -i inventories/example-16xh100-roce.yaml '@rack1&!gpu03,rack=r2'
    """
    from clusterctl.ops import inventory as ops

    inv = load_inventory(inventory)
    try:
        selected = ops.hosts(inv, pattern, user_config().state_dir)
    except ClusterctlError as e:
        fail(str(e))
    nodeset = fold(h.name for h in selected)
    if as_json:
        print_json(
            {
                "pattern": pattern,
                "nodeset": nodeset,
                "count": len(selected),
                "hosts": [
                    {"name": h.name, "address": h.address, "groups": list(h.groups), "labels": h.labels}
                    for h in selected
                ],
            }
        )
    else:
        for h in selected:
            typer.echo(f"{h.name}\t{h.address}")
        if selected:
            typer.echo(f"{nodeset} ({len(selected)} hosts)")
    if not selected:
        fail(f"{pattern!r} selects no host")


@app.command("import-ansible")
def import_ansible(
    source: Path = typer.Argument(
        ..., help="Ansible inventory file (INI or YAML); group_vars/ and host_vars/ next to it are read too."
    ),
    output: Optional[Path] = OutputOpt,
) -> None:
    """Convert an Ansible inventory into a clusterctl inventory (schema 1).

    Maps ansible_host, ansible_port, ansible_user, ansible_ssh_private_key_file
    and ansible_become to address and ssh settings; other variables are kept
    under vars.  Passwords are dropped with a warning, never written.

    \b
    Example: clusterctl inventory import-ansible hosts.ini -o inventory.yaml
    """
    from clusterctl.ops import inventory as ops

    try:
        done = ops.import_ansible(source, output, on_warning=lambda w: err_console.print(f"warning: {w}", markup=False))
        if output is not None:
            ops.save(done, output)
    except ClusterctlError as e:
        fail(str(e))
    if output is None:
        typer.echo(done.text, nl=False)
        return
    err_console.print(
        f"wrote {output}: {len(done.data.get('hosts', {}))} host entries, {len(done.data.get('groups', {}))} groups",
        markup=False,
    )


# --------------------------------------------------------------- rendering


def _gpu_text(h: Host) -> str:
    g = h.gpus
    if not g.count:
        return "-"
    mem = f" {g.memory_gib:g}GiB" if g.memory_gib and str(int(g.memory_gib)) not in g.model else ""
    return f"{g.count}x {g.model or 'GPU'}{mem} {g.interconnect}"


_ROLE_ABBREV = {"management": "mgmt"}


def _nic_text(h: Host) -> str:
    parts = []
    by_role: dict[tuple[str, float | None], list[str]] = defaultdict(list)
    for n in h.nics:
        by_role[(n.role, n.speed_gbps)].append(n.rdma_device or n.netdev)
    for (role, speed), devs in by_role.items():
        sp = f"x{speed:g}G" if speed else ""
        parts.append(f"{_ROLE_ABBREV.get(role, role)} {len(devs)}{sp} {fold(devs)}")
    return "; ".join(parts) or "-"


def _hosts_table(hosts: list[Host]) -> Table:
    rows: dict[tuple[str, ...], list[Host]] = {}
    for h in hosts:
        labels = ",".join(f"{k}={v}" for k, v in sorted(h.labels.items()))
        key = (",".join(h.groups), labels, _gpu_text(h), _nic_text(h))
        rows.setdefault(key, []).append(h)
    t = Table(title=f"hosts ({len(hosts)})", title_justify="left")
    t.add_column("hosts", no_wrap=True)
    t.add_column("address", no_wrap=True)
    for col in ("groups", "labels", "GPUs", "NICs"):
        t.add_column(col, overflow="fold")
    for (groups, labels, gpus, nics), members in rows.items():
        names = [m.name for m in members]
        addrs = [m.address for m in members]
        t.add_row(fold(names), _fold_or_list(addrs), groups or "-", labels or "-", gpus, nics)
    return t


def _fold_or_list(values: list[str]) -> str:
    try:
        return fold(values)
    except ClusterctlError:
        return ",".join(values)


def inventory_json(inv: Inventory) -> dict[str, Any]:
    """The resolved inventory as JSON-ready data (field names as in model.py).

    Environment values whose names look secret are shown as ``***``.
    """
    from clusterctl.ops.inventory import redacted

    def conv(obj: Any) -> Any:
        return dataclasses.asdict(obj)

    return {
        "path": inv.path,
        "hosts": [conv(h) for h in inv.hosts.values()],
        "groups": inv.groups,
        "fabric": conv(inv.fabric),
        "engines": [conv(e) for e in inv.engines.values()],
        "models": [conv(m) for m in inv.models.values()],
        "instances": [
            dict(conv(i), placement=[str(g) for g in i.placement], tp=i.tp_size, env=redacted(i.env))
            for i in inv.instances.values()
        ],
        "templates": [dict(conv(t), env=redacted(t.env)) for t in inv.templates.values()],
        "pd_pools": [dict(conv(p), ratio=list(pd_ratio(inv, p))) for p in inv.pd_pools.values()],
        "warnings": inv.warnings,
    }


from clusterctl.cli import discover as _discover  # noqa: E402 (inventory discover / diff live there)

_discover.register(app)
