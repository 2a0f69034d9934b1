"""Shared pieces of the pre-flight tests: a small inventory, sparse models, host views."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from clusterctl.node import preflight as preflight_node
from clusterctl.deploy.preflight.memory import MiB
from clusterctl.deploy.preflight.checks import GpuProc, GpuView, HostView
from clusterctl.deploy.preflight.ports import parse_ss
from clusterctl.inventory.model import Engine, GpuRef, GpuSpec, Host, Instance, Inventory, Model, ModelArch

#: The lab's H100: NVML total 81559 MiB, 512 MiB reserved by the driver, 4 MiB driver use.
H100_TOTAL = (81559 - 512) * MiB
H100_FREE = H100_TOTAL - 4 * MiB
H100 = "NVIDIA H100 80GB HBM3"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "deploy"

QWEN8_ARCH = ModelArch(
    layers=36,
    hidden_size=4096,
    attention_heads=32,
    kv_heads=8,
    head_dim=128,
    vocab=151936,
    params=8190735360,
    dtype="bfloat16",
)


def make_sparse(name: str, dest: Path) -> dict[str, Any]:
    """A sparse synthetic checkpoint (the lab's make-model), sized by the node reader."""
    if not (dest / "config.json").exists():
        subprocess.run(
            [sys.executable, "-m", "clusterctl.lab.vllm_sim", "make-model", name, str(dest), "--sparse"],
            check=True,
            capture_output=True,
            timeout=120,
        )
    return preflight_node.model_sizes(str(dest))


def inventory(pcie: bool = False) -> Inventory:
    inv = Inventory(path="inv.yaml")
    inv.hosts["gpu01"] = Host("gpu01", "10.0.0.1", gpus=GpuSpec(8, "H100-SXM5-80GB", 80, "pcie" if pcie else "nvlink"))
    inv.engines["vllm-0.11"] = Engine("vllm-0.11", "/opt/vllm-0.11/bin/vllm", "0.11.0")
    inv.engines["vllm-0.33"] = Engine("vllm-0.33", "/opt/vllm-0.33/bin/vllm", "0.33.0")
    inv.models["qwen3-8b"] = Model("qwen3-8b", "/models/qwen3-8b", arch=QWEN8_ARCH)
    inv.models["qwen3-32b"] = Model("qwen3-32b", "/models/qwen3-32b")
    return inv


def instance(
    name: str,
    model: str = "qwen3-8b",
    gpus: tuple[int, ...] = (0,),
    port: int = 8000,
    engine: str = "vllm-0.11",
    **args: Any,
) -> Instance:
    return Instance(
        name=name,
        model=model,
        engine=engine,
        placement=tuple(GpuRef("gpu01", i) for i in gpus),
        port=port,
        args={k.replace("_", "-"): v for k, v in args.items()},
    )


def host(
    models: dict[str, dict[str, Any]],
    ss: str = "",
    procs: dict[int, list[GpuProc]] | None = None,
    pid_units: dict[int, str | None] | None = None,
    gpus: int = 8,
) -> HostView:
    procs = procs or {}
    views = {}
    for i in range(gpus):
        held = sum(p.used or 0 for p in procs.get(i, []))
        views[i] = GpuView(i, H100, H100_TOTAL, H100_FREE - held, tuple(procs.get(i, [])))
    return HostView(name="gpu01", gpus=views, models=models, listeners=parse_ss(ss), pid_units=dict(pid_units or {}))
