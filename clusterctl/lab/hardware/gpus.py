"""The per-host GPU state file read by the fake NVML library (``<hw>/nvml.json``).

Layout (one object per GPU under ``"gpus"``; a JSON ``null`` or a missing key
makes the matching NVML call return NOT_SUPPORTED)::

    {"driver_loaded": true, "driver_version": "550.90.07", "nvml_version": ...,
     "cuda_driver_version": 12040, "model": "H100-SXM5-80GB",
     "gpus": [{"index": 0, "name": ..., "uuid": "GPU-...", "bus_id": "00000000:18:00.0",
               "pci_domain": 0, "pci_bus": 24, "pci_device": 0, "pci_device_id": ...,
               "memory_total_mib": 81559, "memory_reserved_mib": 512,
               "memory_driver_used_mib": 4, "processes": [{"pid": 1, "used_mib": 100}],
               "ecc_mode": 1, "ecc": {"volatile"|"aggregate": {"corrected"|"uncorrected":
                   {"dram": 0, "sram": 0}}},
               "remapped_rows": {"correctable", "uncorrectable", "pending", "failure",
                                 "hist_max", "hist_high", "hist_partial", "hist_low", "hist_none"},
               "retired_pages": null | {"sbe": [addr], "dbe": [addr], "pending": 0},
               "clocks_event_reasons": 1, "temperature_c": 33, "power_mw": 71000,
               "power_limit_mw": 700000, "util_gpu": 0, "util_memory": 0,
               "pcie_gen_cur"/"pcie_gen_max"/"pcie_width_cur"/"pcie_width_max": ..., "pcie_replay": 0,
               "nvlink_state": [1, ...] | null, "nvlink_errors": [[replay, recovery, crc_flit,
               crc_data, ecc_data], ...] | null, "numa_node": 0, "cpu_first": 0, "cpu_count": 56,
               "lost": false, ...}]}

Memory: ``used`` in ``nvmlMemory_v2`` is the driver's overhead plus every
process; ``nvmlMemory_t`` (v1) also counts the reserved memory as used.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from clusterctl.lab.hardware.profiles import GPU_BUSES, GpuProfile
from clusterctl.lab.hardware.tools.nicmodel import atomic_write

STATE_FILE = "nvml.json"
_UUID_NS = uuid.UUID("6c1a3a52-2f0e-4a8e-9d55-6b1d0c0a7e11")
#: Cores per NUMA node of the pretend host (GPUs 0..n/2-1 on node 0, the rest on node 1).
CORES_PER_NODE = 56


def gpu_uuid(host: str, index: int) -> str:
    """A stable UUID for GPU ``index`` of ``host``, in NVML's ``GPU-...`` form."""
    return "GPU-" + str(uuid.uuid5(_UUID_NS, f"{host}/{index}"))


def bus_number(index: int) -> int:
    return GPU_BUSES[index] if index < len(GPU_BUSES) else 0xE0 + index


def new_gpu(profile: GpuProfile, host: str, host_index: int, index: int, count: int) -> dict[str, Any]:
    """A healthy, idle GPU of ``profile``: no processes, no errors, links at full width."""
    bus = bus_number(index)
    numa = 0 if index < max(1, count // 2) else 1
    ecc_zero = {loc: 0 for loc in profile.ecc_locations}
    return {
        "index": index,
        "minor": index,
        "name": profile.name,
        "uuid": gpu_uuid(host, index),
        "serial": f"{1654922000000 + host_index * 100 + index}",
        "vbios": profile.vbios,
        "brand": profile.brand,
        "arch": profile.arch,
        "cuda_cc": profile.cuda_cc,
        "bus_id": f"00000000:{bus:02X}:00.0",
        "pci_domain": 0,
        "pci_bus": bus,
        "pci_device": 0,
        "pci_device_id": profile.pci_device_id,
        "pci_subsystem_id": profile.pci_subsystem_id,
        "memory_total_mib": profile.memory_total_mib,
        "memory_reserved_mib": profile.memory_reserved_mib,
        "memory_driver_used_mib": 4,
        "processes": [],
        "graphics_processes": [],
        "ecc_mode": 1,
        "ecc": {c: {e: dict(ecc_zero) for e in ("corrected", "uncorrected")} for c in ("volatile", "aggregate")},
        "remapped_rows": (
            {
                "correctable": 0,
                "uncorrectable": 0,
                "pending": 0,
                "failure": 0,
                "hist_max": profile.remap_banks,
                "hist_high": 0,
                "hist_partial": 0,
                "hist_low": 0,
                "hist_none": 0,
            }
            if profile.row_remapping
            else None
        ),
        "retired_pages": {"sbe": [], "dbe": [], "pending": 0} if profile.retired_pages else None,
        "clocks_event_reasons": 0x1,  # GpuIdle, as a real idle GPU reports
        "temperature_c": 30 + (index * 3 + host_index) % 7,
        "power_mw": profile.idle_power_mw + 450 * index,
        "power_limit_mw": profile.power_limit_mw,
        "util_gpu": 0,
        "util_memory": 0,
        "persistence_mode": 1,
        "pcie_gen_cur": profile.pcie_gen,
        "pcie_gen_max": profile.pcie_gen,
        "pcie_width_cur": profile.pcie_width,
        "pcie_width_max": profile.pcie_width,
        "pcie_replay": 0,
        "nvlink_state": [1] * profile.nvlinks if profile.nvlinks else None,
        "nvlink_errors": [[0, 0, 0, 0, 0] for _ in range(profile.nvlinks)] if profile.nvlinks else None,
        "numa_node": numa,
        "cpu_first": numa * CORES_PER_NODE,
        "cpu_count": CORES_PER_NODE,
        "clock_graphics_mhz": 345,
        "clock_sm_mhz": 345,
        "clock_mem_mhz": profile.max_mem_mhz,
        "clock_video_mhz": 765,
        "max_clock_graphics_mhz": profile.max_sm_mhz,
        "max_clock_sm_mhz": profile.max_sm_mhz,
        "max_clock_mem_mhz": profile.max_mem_mhz,
        "max_clock_video_mhz": 1755,
        "recovery_action": 0,  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: none
        "lost": False,
    }


def new_state(profile: GpuProfile, host: str, host_index: int, count: int) -> dict[str, Any]:
    """The whole ``nvml.json`` document for a host with ``count`` GPUs of ``profile``."""
    return {
        "driver_loaded": True,
        "driver_version": profile.driver_version,
        "nvml_version": profile.nvml_version,
        "cuda_driver_version": profile.cuda_driver_version,
        "model": profile.key,
        "gpus": [new_gpu(profile, host, host_index, i, count) for i in range(count)],
    }


def load(hw: Path) -> dict[str, Any]:
    """Read ``hw/nvml.json`` (raises OSError or ValueError when missing or broken)."""
    return json.loads((hw / STATE_FILE).read_text(encoding="utf-8"))


def save(hw: Path, state: dict[str, Any]) -> None:
    """Write ``hw/nvml.json`` atomically; the library picks it up on its next call."""
    atomic_write(str(hw / STATE_FILE), json.dumps(state, indent=1) + "\n")
