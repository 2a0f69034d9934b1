"""Facts documents of healthy 8x H100 hosts (schema of docs/facts.md) for the
GPU/OOM/TP analyzer tests; each test changes the fields its fault touches.

:func:`host_facts` builds one host; :func:`ctx` wraps documents, raw texts and
an inventory in an ``AnalysisContext`` with the checks/ data loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clusterctl.diagnose.registry import AnalysisContext
from clusterctl.diagnose.thresholds import load_thresholds
from clusterctl.inventory.loader import load_inventory_text

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "diagnose"
CHECKS = Path(__file__).resolve().parents[3] / "checks"
GIB = 2**30
BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def fixture(name: str) -> str:
    return (FIX / name).read_text()


def device(index: int, **changes: Any) -> dict[str, Any]:
    bus = BUSES[index]
    d: dict[str, Any] = {
        "index": index,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        "pci_bus_id": f"00000000:{bus:02X}:00.0",
        "pci_address": f"0000:{bus:02x}:00.0",
        "memory_total": 80 * GIB,
        "memory_used": 600 * 2**20,
        "memory_free": 80 * GIB - 600 * 2**20,
        "processes": [],
        "ecc": {
            "volatile": {"corrected": 0, "uncorrected": 0},
            "aggregate": {"corrected": 3, "uncorrected": 0},
            "enabled": True,
            "pending_enabled": True,
        },
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "retired_pages": None,
        "clocks_event_reasons": {"mask": "0x1", "active": ["gpu_idle"]},
        "pcie": {"width": 16, "max_width": 16, "gen": 5, "max_gen": 5, "replay_counter": 0},
        "nvlink": [
            {"link": i, "state": "active", "errors": {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}}
            for i in range(18)
        ],
        "temperature_c": 34,
        "power_w": 71.0,
        "power_limit_w": 700.0,
        "utilization": {"gpu": 0, "memory": 0},
        "persistence_mode": True,
        "vbios_version": "96.00.89.00.01",
        "numa_node": 0 if index < 4 else 1,
        "nearest_nics": None,
        "recovery_action": "none",
        "lost": False,
        "hung": False,
        "field_errors": {"retired_pages": "not supported"},
    }
    d.update(changes)
    return d


def host_facts(
    name: str,
    gpus: int = 8,
    kernel: list[str] | None = None,
    units: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "schema": 1,
        "collected_at": "2026-11-30T10:00:00Z",
        "duration_s": 0.4,
        "host": {"hostname": name},
        "gpus": {
            "available": True,
            "reason": None,
            "driver_version": "570.124.06",
            "nvml_version": "12.570.124.06",
            "cuda_driver_version": 12080,
            "pynvml": {"origin": "carried", "version": "12.570", "reason": None},
            "count": gpus,
            "devices": [device(i) for i in range(gpus)],
            "topology": [],
            "timed_out_calls": [],
        },
        "nics": [],
        "units": units if units is not None else [],
        "kernel_log": {
            "source": "/var/log/kern.log",
            "cursor": "file:/var/log/kern.log:1:0",
            "lines": [{"time": None, "boot_id": None, "priority": None, "text": t} for t in kernel or []],
            "truncated": False,
            "rotated": False,
        },
        "errors": [],
    }


INVENTORY = """\
version: 1
defaults:
  gpus: {count: 8, model: H100-80GB, memory_gib: 80, interconnect: nvlink}
hosts:
  gpu[01-02]:
    address: 10.0.0.[1-2]
engines:
  vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}
models:
  qwen3-32b:
    path: /models/qwen3-32b
    arch: {layers: 64, hidden_size: 5120, attention_heads: 64, kv_heads: 8, head_dim: 128,
           vocab: 151936, params: 32762123264, dtype: bfloat16}
  llama-70b:
    path: /models/llama-70b
    arch: {layers: 80, hidden_size: 8192, attention_heads: 64, kv_heads: 8, head_dim: 128,
           vocab: 128256, params: 70553706496, dtype: bfloat16}
instances:
  qwen-a:
    model: qwen3-32b
    engine: vllm
    placement: gpu01:[0-1]
    port: 8000
    args: {max-model-len: 32768, gpu-memory-utilization: 0.9}
  qwen-b:
    model: qwen3-32b
    engine: vllm
    placement: gpu01:[2-3]
    port: 8001
    args: {max-model-len: 32768, gpu-memory-utilization: 0.9}
  llama:
    model: llama-70b
    engine: vllm
    placement: gpu02:[0-3]
    port: 8000
    args: {max-model-len: 8192, gpu-memory-utilization: 0.9}
"""


def inventory(text: str = INVENTORY):
    return load_inventory_text(text, "site.yaml")


def ctx(
    facts: dict[str, dict[str, Any]] | None = None,
    *,
    raw: dict[str, dict[str, str]] | None = None,
    inv: Any = "default",
    missing: dict[str, str] | None = None,
    samples: dict[str, dict[str, Any]] | None = None,
    interval_s: float = 0.0,
) -> AnalysisContext:
    return AnalysisContext(
        inventory=inventory() if inv == "default" else inv,
        facts=facts or {},
        missing=missing or {},
        samples=samples or {},
        interval_s=interval_s,
        raw=raw or {},
        thresholds=load_thresholds(CHECKS),
    )


def healthy() -> dict[str, dict[str, Any]]:
    return {"gpu01": host_facts("gpu01"), "gpu02": host_facts("gpu02")}
