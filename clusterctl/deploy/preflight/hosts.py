"""What pre-flight knows about a host, and reading it through the fleet.

GPU totals, free memory and the processes holding memory come from the probe's
facts; model sizes (config.json and safetensors headers), listening sockets
(``ss -Htlnp``) and the systemd unit of each listening pid from the node
reader (``clusterctl/node/preflight.py``), run once per host.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from clusterctl import node
from clusterctl.deploy.preflight.ports import Listener, parse_ss
from clusterctl.fleet import ship
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.probe.facts import Facts
from clusterctl.probe.factgroups import GpuPair
from clusterctl.fleet.fleet import Fleet
from clusterctl.probe import run as probe_run

NODE_SCRIPT = node.path("preflight")
#: Seconds the node reader may take on one host (headers of every shard, ``ss``).
NODE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class GpuProc:
    pid: int | None
    used: int | None
    unit: str | None
    name: str | None


@dataclass(frozen=True)
class GpuView:
    """One GPU as pre-flight sees it: CUDA's ``total`` and ``free`` (bytes) and who holds memory."""

    index: int
    name: str
    total: int
    free: int
    processes: tuple[GpuProc, ...] = ()
    broken: str | None = None


@dataclass
class HostView:
    """A host's GPUs (from facts), model sizes and listeners (from the node reader).

    ``reason`` set: the host could not be read at all.  ``models`` maps a model
    directory to the reader's document (``config``, ``weights`` or ``error``);
    ``listeners`` is ``None`` when ``ss`` could not be run (``listeners_error``).
    """

    name: str
    reason: str | None = None
    gpus: dict[int, GpuView] = field(default_factory=dict)
    gpu_reason: str | None = None
    #: GPU pairs with their PCIe/CPU level (``gpus.topology`` of the facts)
    topology: tuple[GpuPair, ...] = ()
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    listeners: list[Listener] | None = None
    listeners_error: str | None = None
    pid_units: dict[int, str | None] = field(default_factory=dict)
    mem_available: int | None = None  # host RAM available (bytes, /proc/meminfo), for CPU engines
    #: engine path -> {exists, executable} from the node reader; ``None``: not read
    engines: dict[str, dict[str, Any]] | None = None


def gpus_from_facts(facts: Facts) -> dict[int, GpuView]:
    """GPU views from a facts document.

    NVML's ``memory_total`` includes the driver-reserved memory that CUDA does
    not report as total; it is estimated as ``memory_used`` minus the memory of
    the listed processes (NVML's v1 ``used`` counts the reserved part).
    """
    out: dict[int, GpuView] = {}
    for g in facts.gpus.devices:
        if g.index is None:
            continue
        procs = tuple(
            GpuProc(p.pid, None if p.used_memory is None else int(p.used_memory), p.unit, p.name) for p in g.processes
        )
        broken = "lost" if g.lost else "hung" if g.hung else None
        if g.memory_total is None or g.memory_free is None:
            broken = (
                broken
                or "memory not readable: "
                + ", ".join(f"{k}: {v}" for k, v in g.field_errors.items() if k.startswith("memory"))
                or "unknown"
            )
            out[g.index] = GpuView(g.index, g.name or "", 0, 0, procs, broken)
            continue
        held = sum(p.used or 0 for p in procs)
        used = int(g.memory_used) if g.memory_used is not None else g.memory_total - int(g.memory_free)
        reserved = max(0, used - held)
        out[g.index] = GpuView(g.index, g.name or "", g.memory_total - reserved, int(g.memory_free), procs, broken)
    return out


def host_view(
    name: str, facts: Facts | None, node_doc: Mapping[str, Any] | None, reason: str | None = None
) -> HostView:
    """Combine a host's facts and the node reader's document (either may be missing)."""
    hv = HostView(name=name, reason=reason)
    if facts is not None:
        avail = facts.host.mem_available
        hv.mem_available = None if avail is None else int(avail)
        if facts.gpus.available:
            hv.gpus = gpus_from_facts(facts)
            hv.topology = facts.gpus.pairs
        else:
            hv.gpu_reason = f"NVML unavailable: {facts.gpus.reason or 'no reason given'}"
    else:
        hv.gpu_reason = "no GPU facts"
    if node_doc is not None:
        hv.models = dict(node_doc.get("models") or {})
        li = node_doc.get("listeners")
        if li is not None:
            hv.listeners_error = li.get("error")
            if li.get("ss") or not li.get("error"):
                hv.listeners = parse_ss(li.get("ss") or "")
        hv.pid_units = {int(p): u for p, u in (node_doc.get("pid_units") or {}).items()}
        eng = node_doc.get("engines")
        hv.engines = dict(eng) if isinstance(eng, dict) else None
    return hv


def _node_requests(instances: Mapping[str, Instance], inv: Inventory, what: str = "models") -> dict[str, list[str]]:
    """Host → what its instances need read: the model directories (``models``) or engine executables."""
    out: dict[str, list[str]] = {}
    for inst in instances.values():
        item = inv.models.get(inst.model) if what == "models" else inv.engines.get(inst.engine)
        for h in inst.hosts:
            paths = out.setdefault(h, [])
            if item is not None and item.path not in paths:
                paths.append(item.path)
    return out


def read_hosts(
    fleet: Fleet,
    inv: Inventory,
    instances: Mapping[str, Instance],
    facts: Mapping[str, Facts] | None = None,
    *,
    timeout: float = NODE_TIMEOUT_S,
    on_event: Callable[[str], None] | None = None,
) -> dict[str, HostView]:
    """Read what pre-flight needs from each instance's host through ``fleet``.

    ``facts`` given for a host are used as they are; the others are probed
    (``clusterctl.probe.run.collect_facts``), in a thread of its own while the node reader runs:
    the reader's request (model directories, ports, engines) does not depend on the facts, so the
    two fan-out rounds overlap instead of running one after the other.  The node reader
    (``clusterctl/node/preflight.py``, stdlib python3, as root through the fleet's sudo)
    reads each model's config.json and safetensors headers, ``ss -Htlnp`` and
    the systemd unit of every listening pid.  Hosts not in the fleet or not
    reachable become views with a ``reason``.
    """
    emit = on_event or (lambda _m: None)
    wanted = _node_requests(instances, inv)
    in_fleet = {h.name for h in fleet.hosts}
    facts = dict(facts or {})
    reasons: dict[str, str] = {}  # why the node reader gave nothing
    fact_reasons: dict[str, str] = {}  # why there are no facts
    missing = [h for h in wanted if h in in_fleet and h not in facts]
    probing = None
    pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight-facts") if missing else None
    if pool is not None:
        emit(f"pre-flight: reading GPU facts on {len(missing)} host(s)")
        probing = pool.submit(probe_run.collect_facts, fleet, sudo=True)
    emit(f"pre-flight: reading model sizes and listening ports on {len(wanted)} host(s)")
    engines = _node_requests(instances, inv, "engines")
    commands = {
        h: [json.dumps({"models": paths, "ports": True, "engines": engines.get(h, [])})]
        for h, paths in wanted.items()
        if h in in_fleet
    }
    docs: dict[str, dict[str, Any]] = {}
    try:
        if commands:
            results = ship.run(
                fleet, ship.build("preflight", NODE_SCRIPT.read_bytes()), commands, sudo=True, timeout=timeout
            )
            for r in results:
                if str(r.status) == "ok":
                    try:
                        docs[r.host] = json.loads(r.stdout)
                    except ValueError as e:
                        reasons.setdefault(r.host, f"pre-flight reader: bad output ({e})")
                else:
                    reasons[r.host] = f"{r.status}: {r.error or r.stderr.strip()[-300:] or 'rc ' + str(r.rc)}"
        for name, fr in (probing.result() if probing is not None else {}).items():
            if name not in wanted or name in facts:
                continue
            if fr.facts is not None:
                facts[name] = fr.facts
            else:
                fact_reasons[name] = f"GPU facts: {fr.reason or fr.status}"
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    views = {}
    for h in wanted:
        if h not in in_fleet:
            views[h] = host_view(h, None, None, "not in this fleet")
            continue
        hv = host_view(h, facts.get(h), docs.get(h), None if h in docs else reasons.get(h, "not read"))
        if h in fact_reasons:
            hv.gpu_reason = fact_reasons[h]
        views[h] = hv
    return views
