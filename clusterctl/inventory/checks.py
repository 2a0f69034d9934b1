"""Cross-checks of instances and templates against hosts and models.

These run after every section is read, on the resolved objects, and add
``file:line`` problems to the loader's :class:`~clusterctl.inventory.fields.Ctx`.
"""

from __future__ import annotations

from clusterctl.inventory.fields import Ctx
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.inventory.multinode import template_problems
from clusterctl.inventory.select import select_hosts
from clusterctl.inventory.nodeset import fold

#: Without NVLink, keep tensor parallelism at 2 or below (the field report's rule).
PCIE_MAX_TP = 2


def _line(obj: object) -> int:
    loc = getattr(obj, "location", None)
    return loc.line if loc else 0


def check_instances(ctx: Ctx, inv: Inventory) -> None:
    """GPU and port collisions, head divisibility, and TP on PCIe-only hosts."""
    owner: dict[object, Instance] = {}  # GpuRef or (host, port) -> first instance using it

    def claim(key: object, inst: Instance, what: str) -> None:
        other = owner.setdefault(key, inst)
        if other is not inst:
            ctx.error(
                _line(inst),
                f"instances.{inst.name}: {what} is also used by instance {other.name} (line {_line(other)})",
            )

    for inst in inv.instances.values():
        line = _line(inst)
        for ref in inst.placement:
            if not ref.is_cpu:  # instances share a host's CPU slot (each on its own port)
                claim(ref, inst, f"GPU {ref}")
        for host in inst.hosts:
            claim((host, inst.port), inst, f"port {inst.port} on {host}")
        _check_heads(ctx, inv, inst.model, inst.tp_size, line, f"instances.{inst.name}")
        if inst.tp_size > PCIE_MAX_TP:
            pcie = [h for h in inst.hosts if inv.hosts[h].gpus.interconnect == "pcie"]
            if pcie:
                ctx.warning(
                    line,
                    f"instances.{inst.name}: TP {inst.tp_size} on PCIe-only host "
                    f"{', '.join(pcie)}; without NVLink keep TP <= {PCIE_MAX_TP}",
                )


def check_templates(ctx: Ctx, inv: Inventory) -> None:
    """Head divisibility, TP on PCIe-only hosts and whether the replicas fit.

    Capacity counts, per host, the GPUs that explicit instances leave free,
    divided into whole TP groups; templates are checked one at a time.
    """
    used: dict[str, int] = {}
    for inst in inv.instances.values():
        for ref in inst.placement:
            if not ref.is_cpu:
                used[ref.host] = used.get(ref.host, 0) + 1
    for tpl in inv.templates.values():
        line = _line(tpl)
        w = f"templates.{tpl.name}"
        _check_heads(ctx, inv, tpl.model, tpl.tp, line, w)
        hosts = select_hosts(inv, tpl.hosts)
        if tpl.tp > PCIE_MAX_TP:
            pcie = [h.name for h in hosts if h.gpus.interconnect == "pcie"]
            if pcie:
                ctx.warning(
                    line, f"{w}: TP {tpl.tp} on PCIe-only host(s) {fold(pcie)}; without NVLink keep TP <= {PCIE_MAX_TP}"
                )
        if tpl.nodes > 1:  # one stage per host on N hosts of one GPU model (inventory/multinode.py)
            for why in template_problems(inv, tpl, hosts, used):
                ctx.error(line, f"{w}: nodes {tpl.nodes}: {why}")
            continue
        engine = inv.engines.get(tpl.engine)
        if engine is not None and engine.device == "cpu":
            continue  # its replicas take the hosts' CPU slots: no GPUs to count
        slots = sum(max(h.gpus.count - used.get(h.name, 0), 0) // tpl.tp for h in hosts)
        if slots < tpl.replicas:
            ctx.error(
                line, f"{w}: {tpl.replicas} replicas of TP {tpl.tp} do not fit: {tpl.hosts!r} has room for {slots}"
            )


def _check_heads(ctx: Ctx, inv: Inventory, model_name: str, tp: int, line: int, what: str) -> None:
    model = inv.models.get(model_name)
    heads = model.arch.attention_heads if model else 0
    if heads and heads % tp:
        ctx.error(
            line,
            f"{what}: model {model_name} has {heads} attention heads, not divisible by TP {tp} (vLLM refuses to start)",
        )
