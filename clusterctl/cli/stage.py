"""``clusterctl stage``: put a model version on nodes, verified, and switch to it.

One command with a few verbs (a model may not be called ``status``,
``warm``, ``evict`` or ``manifest``)::

    clusterctl stage MODEL [--hosts P] [--relay chain|tree|none] [--per-rack] [--warm]
    clusterctl stage status [MODEL] [--hosts P]
    clusterctl stage warm|evict MODEL [--hosts P]
    clusterctl stage pin MODEL --budget 16G | clusterctl stage unpin MODEL
    clusterctl stage manifest DIR --name NAME [--version V]

Tables group hosts with identical rows; ``--json`` prints every host.
"""

from __future__ import annotations

from typing import Any, List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from clusterctl.cli._common import (
    InventoryOpt,
    JsonOpt,
    console,
    err_console,
    fail,
    load_inventory,
    print_json,
    user_config,
)
from clusterctl.cli._progress import ByteProgress
from clusterctl.cli._hosts import (
    ConnectTimeoutOpt,
    HostKeyOpt,
    become_password,
    check_host_key_policy,
    select,
)
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.inventory.nodeset import fold

VERBS = ("status", "warm", "evict", "pin", "unpin", "manifest")

HELP = """Stage a model version onto nodes: fetch, verify every chunk, switch atomically.

Each node gets /models/.versions/NAME/VERSION/ and the model path becomes a
symlink to it only after every chunk's sha256 matched; older versions beyond
--keep are pruned (never the one in use). With --relay chain (default) the
source is read once and nodes pass chunks down a chain over TCP; --relay tree
has each node feed --tree-fanout children; --per-rack reads the source once
per rack; --relay none has every node read the source (--max-readers at a
time). Sources: http(s):// (range requests; needs .clusterctl-manifest.json
there), s3://bucket/prefix/ (AWS_* variables: keys, region, endpoint),
file:///shared/path, or a local directory (pushed over SSH). HTTP
credentials: $CLUSTERCTL_STAGE_AUTH (an Authorization header value).

Verbs: 'stage status [MODEL]', 'stage warm MODEL', 'stage evict MODEL',
'stage pin MODEL --budget 16G' (keep up to that much of the model resident:
mlock in a transient unit clusterctl-pin-MODEL), 'stage unpin MODEL',
'stage manifest DIR --name NAME'. Exit status: 0 every host done, 2 some host
failed (its row says why), 3 usage, inventory or source errors.

Examples:

  clusterctl stage qwen3-8b --hosts 'lab[01-04]' --warm

  clusterctl stage qwen3-8b --version 2025-07 --no-switch --warm-budget 96G   # pre-stage the next release

  clusterctl stage qwen3-8b --relay tree --tree-fanout 3 --per-rack

  clusterctl stage status --json

  clusterctl stage pin qwen3-8b --budget 12G

  clusterctl stage manifest /srv/models/qwen3-8b --name qwen3-8b
"""


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def _pct(res: Optional[dict]) -> str:
    if not res or not res.get("bytes"):
        return "-"
    return f"{100.0 * res['resident'] / res['bytes']:.0f}%"


def _group(rows: List[tuple]) -> List[tuple]:
    groups: dict = {}
    for host, cells in rows:
        groups.setdefault(cells, []).append(host)
    return [(fold(h), c) for c, h in groups.items()]


def _stage_table(report: Any) -> Table:
    table = Table(
        "hosts", "status", "version", "from", "MB/s", "resident", "note", box=None, header_style="bold", pad_edge=False
    )
    rows = []
    for r in report.rows:
        d = r.data
        up = d.get("upstream") or ("-" if d.get("already_present") else "source")
        up = "source" if up == "source" else ("-" if up == "-" else "relay")
        secs = d.get("fetch_seconds") or 0
        rate = _mb(d.get("bytes", 0) / secs) if secs and d.get("bytes") else "-"
        note = r.error or ("; ".join(d.get("events", [])[-1:]) or "")
        if r.ok and d.get("switched_from") not in (None, report.version):
            note = (note + "; " if note else "") + f"switched from {d['switched_from']}"
        rows.append(
            (
                r.host,
                (
                    r.status,
                    str(d.get("version", report.version)) if r.ok else "-",
                    up if r.ok else "-",
                    rate,
                    _pct(d.get("warm")),
                    note,
                ),
            )
        )
    # Throughput differs per host: group on everything else and show the range.
    merged: dict = {}
    for host, cells in rows:
        key = cells[:3] + cells[4:]
        merged.setdefault(key, []).append((host, cells[3]))
    for key, members in merged.items():
        rates = sorted(float(x) for _, x in members if x != "-")
        rate = "-" if not rates else (f"{rates[0]:.1f}" if rates[0] == rates[-1] else f"{rates[0]:.1f}-{rates[-1]:.1f}")
        shown = [escape(c) for c in (fold([h for h, _ in members]), *key[:3], rate, *key[3:])]
        if key[0] not in ("staged", "present"):
            shown[1] = f"[red]{shown[1]}[/red]"
        table.add_row(*shown)
    return table


def _status_rows(rows: list) -> List[tuple]:
    out = []
    for r in rows:
        if not r.ok:
            out.append((r.host, ("-", "-", "-", "-", "-", f"{r.status}: {r.error or ''}")))
            continue
        for m in r.data.get("models", []):
            versions = (
                ", ".join(
                    ("*" if v["in_use"] else "") + v["version"] + ("" if v["verified"] else " (unverified)")
                    for v in m.get("versions", [])
                )
                or "-"
            )
            note = ""
            if m.get("path_kind") == "directory":
                note = f"{m['path']} is a plain directory (not staged)"
            if m.get("partial"):
                note = "partial: " + ", ".join(m["partial"])
            if not r.data.get("verify_model_installed"):
                note = (note + "; " if note else "") + "verify-model not installed"
            out.append(
                (
                    r.host,
                    (
                        m["name"],
                        m.get("current") or "-",
                        versions,
                        "yes" if m.get("current") else "no",
                        _pct(m.get("residency")),
                        note,
                    ),
                )
            )
    return out


def stage(
    args: List[str] = typer.Argument(
        ...,
        metavar="MODEL | status [MODEL] | warm|evict|pin|unpin MODEL | manifest DIR",
        help="A model of the inventory, or a verb and its argument.",
    ),
    hosts_pattern: str = typer.Option("all", "--hosts", "-H", help="Hosts: names, lab[01-04], @group, label=value."),
    inventory: Optional[str] = InventoryOpt,
    relay: str = typer.Option(
        "chain",
        "--relay",
        help="chain: source read once, nodes relay down a chain; tree: each node feeds --tree-fanout children; none: every node reads the source.",
    ),
    chains: int = typer.Option(
        1, "--chains", min=1, help="Parallel chains or trees (= hosts reading the source) with --relay chain|tree."
    ),
    tree_fanout: int = typer.Option(2, "--tree-fanout", min=1, help="Children per node with --relay tree."),
    per_rack: bool = typer.Option(
        False, "--per-rack", help="One chain or tree per 'rack' label: the source is read once per rack."
    ),
    relay_network: str = typer.Option(
        "auto",
        "--relay-network",
        help="Network the nodes relay over: auto (storage NIC, else data NIC, else the host address), storage, data, management.",
    ),
    max_readers: int = typer.Option(
        8, "--max-readers", min=1, help="Hosts reading the source at once with --relay none."
    ),
    source: Optional[str] = typer.Option(
        None, "--source", help="Override the model's source (URL, file:///path or a local directory)."
    ),
    version: Optional[str] = typer.Option(
        None, "--version", help="Version name [default: the model's, else the content's hash]."
    ),
    warm: bool = typer.Option(
        False, "--warm", help="Read the staged files into the page cache afterwards (and report residency)."
    ),
    warm_budget: Optional[str] = typer.Option(
        None,
        "--warm-budget",
        help="With --warm (implied): page-cache budget per host; read at most this much of the version (16G, 512M, bytes), its first files first.",
    ),
    switch: bool = typer.Option(
        True, "--switch/--no-switch", help="Point the model path at the new version once verified."
    ),
    keep: int = typer.Option(2, "--keep", min=1, help="Versions kept per node (the one in use is never removed)."),
    workers: int = typer.Option(
        8, "--workers", min=1, help="Parallel reads per node (ranged requests, warm-up readers)."
    ),
    port: int = typer.Option(7707, "--port", min=1, max=65535, help="TCP port of the node-side relay servers."),
    timeout: float = typer.Option(3600, "--timeout", "-t", min=1, help="Seconds one host's staging may take."),
    name: Optional[str] = typer.Option(None, "--name", help="'manifest': the model name to record."),
    chunk_size: int = typer.Option(8 * 1024 * 1024, "--chunk-size", min=4096, help="'manifest': bytes per chunk."),
    budget: Optional[str] = typer.Option(
        None, "--budget", help="'pin': bytes to keep resident per host (16G, 512M, bytes)."
    ),
    as_json: bool = JsonOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    ask_become_pass: bool = typer.Option(False, "--ask-become-pass", "-K", help="Prompt once for the sudo password."),
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.ops import stage as ops

    verb = args[0] if args[0] in VERBS else None
    rest = args[1:] if verb else args
    if verb == "manifest":
        if len(rest) != 1 or not name:
            fail("usage: clusterctl stage manifest DIR --name NAME [--version V] [--chunk-size BYTES]")
        try:
            written = ops.manifest(rest[0], name, version, chunk_size)
        except ClusterctlError as e:
            fail(str(e))
        path, man = written.path, written.manifest
        if as_json:
            print_json(
                {
                    "path": path,
                    "name": man.name,
                    "version": man.version,
                    "bytes": man.total_bytes,
                    "files": len(man.files),
                    "manifest_sha256": man.digest(),
                }
            )
        else:
            console.print(
                f"{path}: {man.name} {man.version}, {len(man.files)} files, {man.total_bytes} bytes", markup=False
            )
        raise typer.Exit(ExitCode.OK)
    if len(rest) > 1 or (verb != "status" and len(rest) != 1):
        fail(f"expected one model name, got {' '.join(rest) or 'none'}")
    policy = check_host_key_policy(host_key_policy)
    inv = load_inventory(inventory)
    if rest and rest[0] not in inv.models:
        fail(f"model {rest[0]!r} is not in {inv.path} (models: {', '.join(sorted(inv.models)) or 'none'})")
    models = [inv.models[rest[0]]] if rest else list(inv.models.values())
    if not models:
        fail(f"{inv.path} defines no models")
    _, hosts = select(inventory, hosts_pattern)
    request = ops.StageRequest(
        inv,
        hosts,
        models,
        user_config(),
        timeout=timeout,
        connect_timeout=connect_timeout,
        host_key_policy=policy,
        become_password=become_password(ask_become_pass, hosts, True),
    )

    if verb in ("pin", "unpin"):
        if verb == "pin" and not budget:
            fail("stage pin: --budget is required (e.g. --budget 16G)")
        try:
            rows = ops.pin(request, budget if verb == "pin" else None)
        except ClusterctlError as e:
            fail(str(e))
        if as_json:
            print_json({"hosts": [r.to_dict() for r in rows]})
        else:
            pins = []
            for r in rows:
                for m in r.data.get("models") or [{}]:
                    pin = m.get("pin") or {}
                    held = f"{pin['mode']} {pin['bytes'] / 2**30:.2f} GiB" if pin else "-"
                    pins.append(
                        (
                            r.host,
                            (
                                r.status,
                                m.get("name", "-"),
                                m.get("version", "-"),
                                held,
                                _pct(m.get("residency")),
                                r.error or m.get("error", ""),
                            ),
                        )
                    )
            table = Table(
                "hosts",
                "status",
                "model",
                "version",
                "pinned",
                "resident",
                "note",
                box=None,
                header_style="bold",
                pad_edge=False,
            )
            for nodes, cells in _group(pins):
                table.add_row(*(escape(c) for c in (nodes, *cells)))
            console.print(table)
        raise typer.Exit(ExitCode.CRIT if ops.failed(rows) else ExitCode.OK)

    if verb in ("status", "warm", "evict"):
        rows = ops.node_verb(request, verb, workers)
        if as_json:
            print_json({"hosts": [r.to_dict() for r in rows]})
        elif verb == "status":
            table = Table(
                "hosts",
                "model",
                "in use",
                "versions (* in use)",
                "verified",
                "resident",
                "note",
                box=None,
                header_style="bold",
                pad_edge=False,
            )
            table.columns[0].no_wrap = True
            for nodes, cells in _group(_status_rows(rows)):
                table.add_row(*(escape(c) for c in (nodes, *cells)))
            console.print(table)
        else:
            table = Table(
                "hosts", "status", "model", "version", "resident", "note", box=None, header_style="bold", pad_edge=False
            )
            flat = []
            for r in rows:
                for m in r.data.get("models") or [{}]:
                    flat.append(
                        (
                            r.host,
                            (
                                r.status,
                                m.get("name", "-"),
                                m.get("version", "-"),
                                _pct(m.get("residency")),
                                r.error or m.get("error", ""),
                            ),
                        )
                    )
            for nodes, cells in _group(flat):
                table.add_row(*(escape(c) for c in (nodes, *cells)))
            console.print(table)
        raise typer.Exit(ExitCode.CRIT if ops.failed(rows) else ExitCode.OK)

    options = ops.StageOptions(
        source=source,
        version=version,
        relay=relay,
        chains=chains,
        tree_fanout=tree_fanout,
        per_rack=per_rack,
        relay_network=relay_network,
        max_readers=max_readers,
        port=port,
        workers=workers,
        keep=keep,
        warm=warm,
        warm_budget=warm_budget,
        switch=switch,
    )
    try:
        plan = ops.prepare(request, options)
    except ClusterctlError as e:
        fail(str(e))
    man = plan.manifest
    if not as_json:
        err_console.print(
            f"staging {plan.model.name} {man.version} ({man.total_bytes / 1e6:.1f} MB, {len(man.files)} files) "
            f"from {plan.source.label} to {len(hosts)} hosts, relay {relay}",
            markup=False,
        )
    with ByteProgress("stage", [h.name for h in hosts], man.total_bytes, not as_json) as progress:
        try:
            report = ops.run(plan, progress.on_result, progress.on_progress if progress.live else None)
        except ClusterctlError as e:
            fail(str(e))
    if as_json:
        print_json(report.to_dict())
    else:
        console.print(_stage_table(report))
        console.print(
            f"{len(report.rows)} hosts, {report.bytes_total / 1e6:.1f} MB each, {report.seconds:.1f} s", markup=False
        )
    raise typer.Exit(ExitCode.OK if report.ok else ExitCode.CRIT)


def register(app: typer.Typer) -> None:
    app.command("stage", help=HELP, no_args_is_help=True)(stage)
