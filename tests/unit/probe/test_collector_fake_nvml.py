"""The whole probe against the lab's fake ``libnvidia-ml.so.1``, loaded by the
real pynvml through ctypes (as on a node), with faults injected by the lab's
fault functions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.lab.hardware import faults, nvml, provision_host
from clusterctl.lab.hardware.host import hw_dir
from clusterctl.node import collector
from clusterctl.probe.payload import payload, probe_command
from clusterctl.deploy.placement.topology import host_topology
from clusterctl.probe.factgroups import GpusFact, HostFact

GIB = 1024**3


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("nvml")
    return {v: nvml.build(out, v).parent for v in nvml.VARIANTS}


@pytest.fixture
def host(tmp_path: Path) -> Path:
    d = tmp_path / "lab01"
    provision_host(d, "lab01", 0, 4, "H100-SXM5-80GB", "mlnx")
    (d / "upper").mkdir(exist_ok=True)
    return d


def probe(host: Path, lib: Path, python: str = sys.executable) -> dict:
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib), FAKE_NVML_STATE=str(hw_dir(host) / "nvml.json"))
    r = subprocess.run(
        ["/bin/sh", "-c", probe_command(python=python)], input=payload().data, capture_output=True, env=env, timeout=60
    )
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    return json.loads(r.stdout)


def test_faults_show_in_the_facts(host, libs):
    faults.inject(host, "gpu-mem", gpu=0, gib=10.0, pid=4242)
    faults.inject(host, "gpu-lost", gpu=1)
    faults.inject(host, "remap", gpu=2, pending=True, uncorrectable=1)
    faults.inject(host, "ecc", gpu=3, uncorrected=2)
    faults.inject(host, "pcie", gpu=0, width=8)
    faults.inject(host, "nvlink", gpu=0, link=3, down=True)
    faults.inject(host, "clocks", gpu=2, reasons="hw_slowdown,hw_thermal")
    g = probe(host, libs["current"])["gpus"]
    assert g["available"] is True and g["count"] == 4
    state = json.loads((hw_dir(host) / "nvml.json").read_text())
    assert g["driver_version"] == state["driver_version"]
    d0, d1, d2, d3 = g["devices"]
    assert d0["uuid"] == state["gpus"][0]["uuid"] and d0["name"] == state["gpus"][0]["name"]
    assert d0["processes"][0]["pid"] == 4242 and d0["processes"][0]["used_memory"] == 10 * GIB
    assert d0["memory_used"] >= 10 * GIB and d0["memory_total"] == state["gpus"][0]["memory_total_mib"] * 2**20
    assert d0["pcie"]["width"] == 8 and d0["pcie"]["max_width"] == 16
    assert [link["state"] for link in d0["nvlink"] if link["link"] == 3] == ["inactive"]
    assert d1["lost"] is True and d1["memory_used"] is None
    assert d2["remapped_rows"]["pending"] is True and d2["remapped_rows"]["uncorrectable"] >= 1
    assert set(d2["clocks_event_reasons"]["active"]) == {"hw_slowdown", "hw_thermal_slowdown"}
    assert d3["ecc"]["volatile"]["uncorrected"] == 2
    assert d3["retired_pages"] is None and d3["field_errors"]["retired_pages"] == "not supported"
    assert all(t["level"] for t in g["topology"] if 1 not in t["gpus"])


def test_lost_gpu_leaves_an_xid_line_in_the_kernel_log(host, libs):
    faults.inject(host, "gpu-lost", gpu=1)
    args = collector.parse_args([])
    got = collector.read_kern_log(None, args.kernel_log_max, [], root=str(host / "upper"))
    assert any("NVRM: Xid" in x["text"] and ": 79," in x["text"] for x in got["lines"])


def test_driver_not_loaded(host, libs):
    faults.inject(host, "driver", loaded=False)
    g = probe(host, libs["current"])["gpus"]
    assert g["available"] is False and g["reason"].startswith("NVIDIA driver not loaded")


def test_old_driver_falls_back(host, libs):
    """R470-like library: no _v3 process list, no clocks-event or NUMA entry points."""
    faults.inject(host, "gpu-mem", gpu=0, gib=2.0, pid=777)
    faults.inject(host, "clocks", gpu=0, reasons="sw_power_cap")
    d0 = probe(host, libs["old"])["gpus"]["devices"][0]
    assert [p["pid"] for p in d0["processes"]] == [777]
    assert d0["clocks_event_reasons"]["active"] == ["sw_power_cap"]
    assert d0["numa_node"] is None
    assert d0["field_errors"]["numa_node"] == "not supported by this driver (function not found)"


def test_the_probe_reads_nvmls_recovery_action_not_the_kernel_log(host, libs):
    # the XID 154 line is written too, but the facts carry what NVML answers now
    faults.inject(host, "recovery", gpu=2, action="drain-and-reset")
    faults.inject(host, "recovery", gpu=3, action="reboot", log_xid=0)
    g = probe(host, libs["current"])["gpus"]
    assert [d["recovery_action"] for d in g["devices"]] == ["none", "none", "drain_and_reset", "reboot"]


def test_the_probe_reads_the_gpus_nvlink_fabric_state(host, libs):
    g = probe(host, libs["current"])["gpus"]
    assert all(d["fabric"] is None and d["field_errors"]["fabric"] == "not supported" for d in g["devices"])
    assert g["fabric_manager"] is None  # no fabric: not asked
    for i in range(4):
        faults.inject(host, "fabric", gpu=i, state="completed")
    faults.inject(host, "fabric", gpu=1, state="not-started")
    g = probe(host, libs["current"])["gpus"]
    assert [d["fabric"]["state"] for d in g["devices"]] == ["completed", "not_started", "completed", "completed"]
    assert g["devices"][0]["fabric"]["status"] == 0


def test_the_typed_groups_read_what_node_setup_pre_flight_and_placement_take(host, libs):
    """On the collector's own output: the GPU count (node setup), memory free and the host's
    available memory (pre-flight), every GPU pair with its level (placement, tp.topology)."""
    doc = probe(host, libs["current"])
    g = GpusFact.parse(doc)
    assert g.count == len(g.devices) == 4 and all(d.memory_free is not None for d in g.devices)
    assert {p.gpus for p in g.pairs} == {(a, b) for a in range(4) for b in range(4) if a < b}
    assert all(p.level for p in g.pairs)
    assert host_topology(g)[0] == {"gpus": list(g.pairs[0].gpus), "level": g.pairs[0].level}
    assert HostFact.parse(doc).mem_available == doc["host"]["memory"]["available"] > 0
