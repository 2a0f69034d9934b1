"""``clusterctl facts HOSTS``: what every node has, in one round trip per node.

The summary table groups hosts whose summary rows are identical, naming them
as a node set (``gpu[01-04,07]``); ``--json`` prints ``{host: facts}`` with
the full document of ``docs/facts.md`` (or ``{status, reason}`` for a host
that gave none).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterable, Optional

import typer
from rich.markup import escape
from rich.table import Table

from clusterctl.cli._common import console, err_console, print_json, user_config
from clusterctl.cli._hosts import HostProgress, become_password, check_host_key_policy, fleets, select
from clusterctl.cli._options import (
    AskBecomePassOpt,
    ConnectTimeoutOpt,
    DeadlineOpt,
    FanoutOpt,
    HostKeyOpt,
    HostsArg,
    InventoryOpt,
    JsonOpt,
    ProbeSudoOpt,
)
from clusterctl.fleet.results import HostResult, HostStatus
from clusterctl.inventory.nodeset import fold

if TYPE_CHECKING:  # the workflow (and the probe under it) loads when the command runs
    from clusterctl.ops.facts import Facts, FactsResult

GIB = 1024**3

#: ``--timeout``: the probe's default, ``clusterctl.probe.run.DEFAULT_TIMEOUT_S`` (a test keeps them equal).
FactsTimeoutOpt = typer.Option(90.0, "--timeout", "-t", min=1, help="Seconds one host's probe may take.")

HELP = """Collect node facts: OS, CPU, memory, disks, GPUs (NVML), NICs and RDMA ports,
clusterctl's systemd units, recent kernel-log lines.

Runs a read-only probe with each node's python3 (3.8+). The table shows one row
per group of hosts with identical summaries. Exit status: 0 when every host
answered, 2 when some host gave no facts (its row says why), 3 on usage or
inventory errors.

Example: clusterctl facts 'lab[01-04]' -i /var/lib/clusterctl-lab/inventory.yaml --json
"""

COLUMNS = ("hosts", "status", "GPUs", "GPU memory used", "lost/hung GPUs", "RDMA ports", "units", "problems")


def _gpu_summary(f: Facts) -> tuple[str, str, str]:
    g = f.gpus
    if not g.available:
        return "none", "-", "-"
    if not g.devices:
        return "0", "-", "-"
    names = Counter((d.name or "?").removeprefix("NVIDIA ") for d in g.devices)
    gpus = ", ".join(f"{n}x {name}" for name, n in sorted(names.items()))
    used = sum(d.memory_used or 0 for d in g.devices)
    total = sum(d.memory_total or 0 for d in g.devices)
    memory = f"{used / GIB:.0f}/{total / GIB:.0f} GiB" if total else "?"
    bad = [f"{d.index} lost" for d in g.devices if d.lost] + [f"{d.index} hung" for d in g.devices if d.hung]
    return gpus, memory, ", ".join(bad) or "-"


def _rdma_summary(f: Facts) -> str:
    ports: Counter[str] = Counter()
    for n in f.nics:
        if n.rdma is not None:
            rate = f" {n.rdma.rate_gbps:g}G" if n.rdma.rate_gbps and n.rdma.state == "ACTIVE" else ""
            ports[f"{n.rdma.state or '?'}{rate}"] += 1
    return ", ".join(f"{c}x {s}" for s, c in sorted(ports.items())) or "-"


def _units_summary(f: Facts) -> str:
    if f.units is None:
        return "?"
    states = Counter(u.active_state or "?" for u in f.units)
    restarts = sum(u.restarts or 0 for u in f.units)
    text = ", ".join(f"{c} {s}" for s, c in sorted(states.items())) or "none"
    return text + (f" ({restarts} restarts)" if restarts else "")


def summary_row(r: FactsResult) -> tuple[str, ...]:
    """The table cells of one host (without the host name)."""
    if r.facts is None:
        return ("UNKNOWN", "", "", "", "", "", "")
    f = r.facts
    gpus, memory, bad = _gpu_summary(f)
    problems = len(notes(r))
    return ("ok", gpus, memory, bad, _rdma_summary(f), _units_summary(f), str(problems) if problems else "-")


def notes(r: FactsResult) -> list[str]:
    """Why a host gave no facts, or what its probe could not read."""
    if r.facts is None:
        return [r.reason or "no facts"]
    f = r.facts
    out = [f"gpus: {f.gpus.reason}"] if not f.gpus.available and f.gpus.reason else []
    out += [
        f"gpu {d.index}: {k}: {v}"
        for d in f.gpus.devices
        for k, v in sorted(d.field_errors.items())
        if v != "not supported"
    ]
    out += [f"{e.get('source')}: {e.get('reason')}" for e in f.errors]
    return out


def group_rows(results: Iterable[FactsResult]) -> list[tuple[str, tuple[str, ...]]]:
    """Identical summary rows merged: ``[(nodeset, cells)]`` in first-seen order."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for r in results:
        groups.setdefault(summary_row(r), []).append(r.host)
    return [(fold(hosts), row) for row, hosts in groups.items()]


def group_notes(results: Iterable[FactsResult]) -> list[tuple[str, str]]:
    """``[(nodeset, note)]``: each distinct note once, with the hosts it concerns."""
    hosts: dict[str, list[str]] = {}
    for r in results:
        for n in notes(r):
            hosts.setdefault(n, []).append(r.host)
    return [(fold(h), n) for n, h in hosts.items()]


def _table(results: dict[str, FactsResult]) -> Table:
    table = Table(*COLUMNS, box=None, header_style="bold", pad_edge=False)
    for nodes, cells in group_rows(results.values()):
        shown = [escape(c) for c in (nodes, *cells)]
        if cells[0] == "UNKNOWN":
            shown[1] = f"[red]{shown[1]}[/red]"
        table.add_row(*shown)
    return table


def _print(results: dict[str, FactsResult]) -> None:
    console.print(_table(results))
    grouped = group_notes(results.values())
    if grouped:
        console.print()
    for nodes, note in grouped:
        console.print(f"{escape(nodes)}: {escape(note)}")


def facts(
    pattern: str = HostsArg,
    inventory: Optional[str] = InventoryOpt,
    as_json: bool = JsonOpt,
    timeout: float = FactsTimeoutOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    deadline: Optional[float] = DeadlineOpt,
    sudo: bool = ProbeSudoOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.ops import facts as ops

    policy = check_host_key_policy(host_key_policy)
    path, hosts = select(inventory, pattern)
    password = become_password(ask_become_pass, hosts, sudo)
    make = fleets(
        fanout=fanout,
        connect_timeout=connect_timeout,
        become_password=password,
        host_key_policy=policy,
        command_timeout=timeout,
        deadline=deadline,
    )
    request = ops.FactsRequest(hosts, make, user_config().state_dir, path, timeout=timeout, sudo=sudo)
    with HostProgress(len(hosts), "facts", not as_json) as progress:
        run = ops.run(request, on_result=lambda r: progress(as_row(r)))
    for w in run.warnings:
        err_console.print(f"warning: {w}", markup=False)
    results = run.results
    if as_json:
        print_json({h: r.to_dict() for h, r in results.items()})
    else:
        _print(results)
    raise typer.Exit(run.code)


def as_row(r: FactsResult) -> HostResult:
    """A progress line's view of a probe result."""
    status = HostStatus.OK if r.ok else HostStatus(r.fleet_status if r.fleet_status != "ok" else "error")
    return HostResult(r.host, status, duration_s=r.duration_s, error=r.reason)


def register(app: typer.Typer) -> None:
    app.command("facts", help=HELP)(facts)
