"""Where analyzers find their data: facts, raw texts and the inventory.

One job: answer "what does this host have" uniformly for a live run (facts
documents) and an offline bundle that may hold only some raw texts.  Raw
names (keys of ``AnalysisContext.raw[host]``) used by the analyzers:

- ``kernel.log``: kernel messages (dmesg, ``journalctl -k`` or kern.log text);
- ``<instance>.log``: the journal text of the instance's unit;
- ``<instance>.metrics``: a ``/metrics`` body, ``<instance>.metrics.2`` a later one.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable

from clusterctl.diagnose.findings import Finding
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.probe.factgroups import GpusFact, KernelLogFact

if TYPE_CHECKING:  # registry imports this module (name_gpus): the type alone, no cycle at run time
    from clusterctl.diagnose.registry import AnalysisContext

KERNEL_LOG = "kernel.log"


def unit_name(instance: str) -> str:
    """The systemd unit clusterctl runs an instance as (``clusterctl-NAME.service``)."""
    return f"clusterctl-{instance}.service"


def all_hosts(ctx: AnalysisContext) -> list[str]:
    """Every host the context knows about: facts, raw texts, missing; in that order."""
    seen: dict[str, None] = {}
    for src in (ctx.facts, ctx.raw, ctx.missing):
        for h in src:
            seen.setdefault(h, None)
    return list(seen)


def kernel_lines(ctx: AnalysisContext, host: str) -> tuple[list[str] | None, str]:
    """The host's kernel-log lines and where they came from; ``None`` and the reason when absent."""
    raw = ctx.raw.get(host, {})
    if KERNEL_LOG in raw:
        return raw[KERNEL_LOG].splitlines(), "kernel.log"
    kl = ctx.fact(host, KernelLogFact)
    if kl is not None:
        if kl.source:
            return kl.texts, kl.source
        return None, "kernel log not readable: " + ("; ".join(kl.reasons) or "no source")
    return None, ctx.missing.get(host) or "no facts and no kernel log for this host"


def pci_to_index(ctx: AnalysisContext, host: str) -> dict[str, int]:
    """Short PCI address (``0000:3b:00``, lower case) -> NVML index, from facts."""
    return {normalize_pci(addr): index for index, addr in bus_ids(ctx, host).items()}


def bus_ids(ctx: AnalysisContext, host: str) -> dict[int, str]:
    """NVML index -> full PCI bus id (``0000:1b:00.0``), from facts."""
    g = ctx.fact(host, GpusFact)
    out: dict[int, str] = {}
    for d in g.devices if g is not None else ():
        addr = d.pci_address or _from_bus_id(d.pci_bus_id)
        if addr and d.index is not None:
            addr = addr.lower()
            out[d.index] = addr if "." in addr.split(":")[-1] else addr + ".0"
    return out


def gpu_label(ctx: AnalysisContext, host: str | None, index: int) -> str:
    """``gpu:3 (0000:1b:00.0)``: the index and, where the facts know it, the PCI bus id."""
    bus = bus_ids(ctx, host).get(index) if host else None
    return f"gpu:{index} ({bus})" if bus else f"gpu:{index}"


_GPU_SUBJECT = re.compile(r"^gpu:(\d+)(?:/|$)")


def name_gpus(ctx: AnalysisContext, findings: list[Finding]) -> list[Finding]:
    """Every finding about one GPU (subject ``gpu:N``, kept as it is for grouping and
    history) names it by index and PCI bus id at the start of its message."""
    out = []
    for f in findings:
        m = _GPU_SUBJECT.match(f.subject or "")
        if m and f.host:
            label = gpu_label(ctx, f.host, int(m.group(1)))
            if "(" in label and not f.message.startswith(label):
                f = replace(f, message=f"{label}: {f.message}")
        out.append(f)
    return out


def _from_bus_id(bus_id: str | None) -> str | None:
    """NVML ``00000000:3B:00.0`` -> ``0000:3b:00.0``."""
    if not bus_id:
        return None
    dom, _, rest = bus_id.partition(":")
    return f"{int(dom, 16):04x}:{rest}".lower() if rest else None


def normalize_pci(text: str) -> str:
    """Any kernel/NVML PCI form -> ``dddd:bb:dd`` lower case."""
    parts = text.lower().split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    dom, bus, dev = parts[0], parts[1], parts[2].split(".")[0]
    return f"{int(dom, 16):04x}:{bus}:{dev}"


def instances(inv: Inventory | None) -> list[Instance]:
    return list(inv.instances.values()) if inv is not None else []


def instances_on_gpu(inv: Inventory | None, host: str, index: int) -> list[Instance]:
    return [i for i in instances(inv) if any(g.host == host and g.index == index for g in i.placement)]


def instance_hosts(ctx: AnalysisContext, instance: Instance) -> list[str]:
    """Hosts where texts of ``instance`` may be: its placement hosts, then any host holding them."""
    hosts = list(instance.hosts)
    for h, texts in ctx.raw.items():
        if h not in hosts and any(k.startswith(instance.name + ".") for k in texts):
            hosts.append(h)
    return hosts


def raw_instances(ctx: AnalysisContext, suffix: str) -> Iterable[tuple[str, str, str]]:
    """``(host, instance, text)`` for every raw text named ``<instance><suffix>``."""
    for host, texts in ctx.raw.items():
        for name, text in texts.items():
            if name.endswith(suffix) and name != KERNEL_LOG:
                yield host, name[: -len(suffix)], text
