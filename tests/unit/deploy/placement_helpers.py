"""Small inventories for placement tests, built as dataclasses (no YAML)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from clusterctl.deploy.state import Cordon, DeployState
from clusterctl.inventory.model import (
    Engine,
    GpuRef,
    GpuSpec,
    Host,
    Instance,
    InstanceTemplate,
    Inventory,
    Model,
)


def inventory(
    hosts: Mapping[str, int],
    templates: Sequence[tuple[str, int, int, str, int]] = (),
    instances: Mapping[str, tuple[str, Sequence[int], int]] | None = None,
) -> Inventory:
    """``hosts``: name -> GPU count; templates: (name, replicas, tp, host pattern, port_base);
    instances: name -> (host, GPU indexes, port)."""
    inv = Inventory(path="test.yaml")
    for name, count in hosts.items():
        inv.hosts[name] = Host(name=name, address=name, gpus=GpuSpec(count=count, interconnect="nvlink"))
    inv.models["m"] = Model(name="m", path="/models/m")
    inv.engines["e"] = Engine(name="e", path="/opt/vllm/bin/vllm", version="0.11.0")
    for name, replicas, tp, pattern, base in templates:
        inv.templates[name] = InstanceTemplate(
            name=name, model="m", engine="e", replicas=replicas, tp=tp, hosts=pattern, port_base=base
        )
    for name, (host, gpus, port) in (instances or {}).items():
        inv.instances[name] = Instance(
            name=name, model="m", engine="e", placement=tuple(GpuRef(host, g) for g in gpus), port=port
        )
    return inv


def cordoned(*keys: str, state: DeployState | None = None) -> DeployState:
    state = state or DeployState()
    for key in keys:
        state.cordons[key] = Cordon(reason="test", who="ops@here", when="2026-11-30T15:00:00Z")
    return state


def where(result: Any) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """instance -> (host, GPU indexes, port) of every instance in a PlacementResult."""
    return {
        name: (inst.placement[0].host, tuple(g.index for g in inst.placement), inst.port)
        for name, inst in result.instances.items()
    }


def topology(switches: Sequence[Sequence[int]], sockets: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
    """Facts ``gpus.topology`` entries: GPUs in one of ``switches`` are SINGLE, on one of
    ``sockets`` NODE, otherwise SYSTEM."""
    gpus = sorted({g for s in sockets for g in s})
    out = []
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            if any(a in s and b in s for s in switches):
                level = "SINGLE"
            elif any(a in s and b in s for s in sockets):
                level = "NODE"
            else:
                level = "SYSTEM"
            out.append({"gpus": [a, b], "level": level})
    return out
