"""The fake libnvidia-ml.so.1 seen through the real nvidia-ml-py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from clusterctl.errors import LabError
from clusterctl.lab.hardware import faults, gpus, nvml
from clusterctl.lab.hardware.host import hw_dir

MIB = 1024 * 1024

READ_ALL = """
N.nvmlInit()
result = {"driver": N.nvmlSystemGetDriverVersion(), "nvml": N.nvmlSystemGetNVMLVersion(),
          "cuda": N.nvmlSystemGetCudaDriverVersion(), "count": N.nvmlDeviceGetCount(), "gpus": []}
h0 = N.nvmlDeviceGetHandleByIndex(0)
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    pci = N.nvmlDeviceGetPciInfo(h)
    m1 = N.nvmlDeviceGetMemoryInfo(h)
    m2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    hist = N.nvmlDeviceGetRowRemapperHistogram(h)
    util = N.nvmlDeviceGetUtilizationRates(h)
    result["gpus"].append({
        "index": N.nvmlDeviceGetIndex(h), "name": N.nvmlDeviceGetName(h),
        "uuid": N.nvmlDeviceGetUUID(h), "serial": N.nvmlDeviceGetSerial(h),
        "bus_id": pci.busId, "bus_legacy": pci.busIdLegacy, "dev_id": pci.pciDeviceId,
        "bus": pci.bus,
        "m1": [m1.total, m1.used, m1.free], "m2": [m2.total, m2.reserved, m2.used, m2.free],
        "procs": [[p.pid, p.usedGpuMemory] for p in N.nvmlDeviceGetComputeRunningProcesses(h)],
        "ecc_mode": N.nvmlDeviceGetEccMode(h),
        "ecc_unc_vol": N.nvmlDeviceGetTotalEccErrors(h, 1, 0),
        "ecc_cor_agg": N.nvmlDeviceGetTotalEccErrors(h, 0, 1),
        "dram_unc_vol": N.nvmlDeviceGetMemoryErrorCounter(h, 1, 0, N.NVML_MEMORY_LOCATION_DRAM),
        "sram_unc_vol": N.nvmlDeviceGetMemoryErrorCounter(h, 1, 0, N.NVML_MEMORY_LOCATION_SRAM),
        "remap": list(N.nvmlDeviceGetRemappedRows(h)),
        "hist": [hist.max, hist.high, hist.partial, hist.low, hist.none],
        "reasons": N.nvmlDeviceGetCurrentClocksEventReasons(h),
        "throttle": N.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        "temp": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
        "power": N.nvmlDeviceGetPowerUsage(h), "limit": N.nvmlDeviceGetEnforcedPowerLimit(h),
        "util": [util.gpu, util.memory], "persist": N.nvmlDeviceGetPersistenceMode(h),
        "vbios": N.nvmlDeviceGetVbiosVersion(h),
        "pcie": [N.nvmlDeviceGetCurrPcieLinkGeneration(h), N.nvmlDeviceGetMaxPcieLinkGeneration(h),
                 N.nvmlDeviceGetCurrPcieLinkWidth(h), N.nvmlDeviceGetMaxPcieLinkWidth(h),
                 N.nvmlDeviceGetPcieReplayCounter(h)],
        "nvlink": [N.nvmlDeviceGetNvLinkState(h, l) for l in range(18)],
        "nvlink_err3": [N.nvmlDeviceGetNvLinkErrorCounter(h, 3, c) for c in range(4)],
        "numa": N.nvmlDeviceGetNumaNodeId(h),
        "affinity": list(N.nvmlDeviceGetCpuAffinity(h, 2)),
        "topo0": N.nvmlDeviceGetTopologyCommonAncestor(h0, h),
        "arch": N.nvmlDeviceGetArchitecture(h), "cc": list(N.nvmlDeviceGetCudaComputeCapability(h)),
    })
N.nvmlShutdown()
"""


def test_every_field_comes_from_the_state_file(make_host, pynvml_run):
    host = make_host(gpus=8)
    faults.gpu_mem(host, gpu=1, gib=70.0, pid=4321)
    faults.ecc(host, gpu=2, corrected=5, uncorrected=2, location="dram")
    faults.ecc(host, gpu=2, uncorrected=1, location="sram", volatile=False)
    faults.remap(host, gpu=3, pending=True, failure=True, correctable=1, uncorrectable=9)
    faults.clocks(host, gpu=4, reasons="hw_slowdown,hw_thermal")
    faults.pcie(host, gpu=5, width=8, replays=12)
    faults.nvlink(host, gpu=6, link=3, down=True, replay=4, recovery=1, crc_flit=7, crc_data=2)
    faults.temp(host, gpu=7, celsius=88, power_w=698.77)
    state = gpus.load(hw_dir(host))

    out = pynvml_run(host, READ_ALL)

    assert out["driver"] == "550.90.07" and out["nvml"] == "12.550.90.07"
    assert out["cuda"] == 12040 and out["count"] == 8
    for g, s in zip(out["gpus"], state["gpus"]):
        assert g["name"] == "NVIDIA H100 80GB HBM3" and g["uuid"] == s["uuid"]
        assert g["bus_id"] == s["bus_id"] and g["bus_legacy"] == s["bus_id"][4:]
        assert g["dev_id"] == 0x233010DE and g["bus"] == s["pci_bus"]
        assert g["m1"][0] == 81559 * MIB == g["m2"][0]
        assert g["m2"][1] == 512 * MIB
        assert g["m1"][1] == g["m2"][2] + g["m2"][1]  # v1 "used" includes reserved
        assert g["m1"][2] == g["m2"][3]
        assert g["ecc_mode"] == [1, 1] and g["persist"] == 1 and g["vbios"] == "96.00.74.00.01"
        assert g["limit"] == 700_000 and g["arch"] == 9 and g["cc"] == [9, 0]
        assert g["throttle"] == g["reasons"]
    gs = out["gpus"]
    assert [x["bus_id"] for x in gs] == [
        f"00000000:{b:02X}:00.0" for b in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
    ]
    assert gs[0]["procs"] == [] and gs[0]["m2"][2] == 4 * MIB
    assert gs[1]["procs"] == [[4321, 70 * 1024 * MIB]]
    assert gs[1]["m2"][2] == (4 + 70 * 1024) * MIB
    assert gs[2]["ecc_unc_vol"] == 2 and gs[2]["dram_unc_vol"] == 2 and gs[2]["sram_unc_vol"] == 0
    assert gs[2]["ecc_cor_agg"] == 5
    assert gs[3]["remap"] == [1, 9, 1, 1] and gs[3]["hist"] == [2559, 0, 0, 0, 1]
    assert gs[0]["remap"] == [0, 0, 0, 0] and gs[0]["hist"] == [2560, 0, 0, 0, 0]
    assert gs[4]["reasons"] == 0x48 and gs[0]["reasons"] == 0x1
    assert gs[5]["pcie"] == [5, 5, 8, 16, 12] and gs[0]["pcie"] == [5, 5, 16, 16, 0]
    assert gs[6]["nvlink"][3] == 0 and sum(gs[6]["nvlink"]) == 17
    assert gs[6]["nvlink_err3"] == [4, 1, 7, 2] and gs[0]["nvlink_err3"] == [0, 0, 0, 0]
    assert gs[7]["temp"] == 88 and gs[7]["power"] == 698_770
    assert [x["numa"] for x in gs] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gs[0]["affinity"] == [(1 << 56) - 1, 0]
    assert gs[4]["affinity"] == [0xFF << 56, (1 << 48) - 1]
    assert [x["topo0"] for x in gs] == [0, 40, 40, 40, 50, 50, 50, 50]


def test_a_lost_gpu_still_counts_but_its_handle_fails_with_gpu_is_lost(make_host, pynvml_run):
    host = make_host(gpus=4)
    faults.gpu_lost(host, gpu=2)
    out = pynvml_run(
        host,
        """
N.nvmlInit()
result = {"count": N.nvmlDeviceGetCount(), "ok": []}
for i in range(N.nvmlDeviceGetCount()):
    try:
        N.nvmlDeviceGetHandleByIndex(i)
        result["ok"].append(i)
    except N.NVMLError as e:
        result["err"] = [i, e.value, type(e).__name__, str(e)]
try:
    N.nvmlDeviceGetHandleByPciBusId(b"00000000:3A:00.0")
except N.NVMLError_GpuIsLost:
    result["by_bus"] = "lost"
""",
    )
    assert out["count"] == 4 and out["ok"] == [0, 1, 3]
    assert out["err"] == [2, 15, "NVMLError_GpuIsLost", "GPU is lost"]
    assert out["by_bus"] == "lost"


def test_state_changes_apply_to_a_running_process(make_host, pynvml_run):
    """A fault injected after nvmlInit shows on the next call, as on a live host."""
    host = make_host(gpus=2)
    state_file = hw_dir(host) / "nvml.json"
    out = pynvml_run(
        host,
        f"""
import json, os
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(1)
before = N.nvmlDeviceGetCurrPcieLinkWidth(h)
from clusterctl.lab.hardware import faults
from pathlib import Path
faults.pcie(Path({str(host)!r}), gpu=1, width=4)
faults.gpu_lost(Path({str(host)!r}), gpu=0, log=False)
after = N.nvmlDeviceGetCurrPcieLinkWidth(h)
try:
    N.nvmlDeviceGetName(N.nvmlDeviceGetHandleByIndex(0))
    lost = False
except N.NVMLError_GpuIsLost:
    lost = True
result = [before, after, lost]
""",
    )
    assert out == [16, 4, True]
    assert json.loads(state_file.read_text())["gpus"][0]["lost"] is True


def test_pcie_card_has_no_nvlink_and_hopper_no_retired_pages(make_host, pynvml_run):
    host = make_host(gpus=1, model="L40S")
    out = pynvml_run(
        host,
        """
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
result = {"name": N.nvmlDeviceGetName(h)}
for key, call in (("nvlink", lambda: N.nvmlDeviceGetNvLinkState(h, 0)),
                  ("nvlink_err", lambda: N.nvmlDeviceGetNvLinkErrorCounter(h, 0, 0)),
                  ("retired", lambda: N.nvmlDeviceGetRetiredPages(h, 1)),
                  ("retired_pending", lambda: N.nvmlDeviceGetRetiredPagesPendingStatus(h))):
    try:
        call()
        result[key] = "ok"
    except N.NVMLError_NotSupported:
        result[key] = "not supported"
""",
    )
    assert out == {
        "name": "NVIDIA L40S",
        "nvlink": "not supported",
        "nvlink_err": "not supported",
        "retired": "not supported",
        "retired_pending": "not supported",
    }
    with pytest.raises(LabError, match="no NVLink"):
        faults.nvlink(host, gpu=0)
    with pytest.raises(LabError, match="does not retire pages"):
        faults.retired_pages(host, gpu=0)


def test_volta_retires_pages_and_has_no_row_remapper(make_host, pynvml_run):
    host = make_host(gpus=1, model="V100-SXM2-32GB")
    faults.retired_pages(host, gpu=0, sbe=3, dbe=2, pending=True)
    out = pynvml_run(
        host,
        """
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
result = {"sbe": len(N.nvmlDeviceGetRetiredPages(h, 0)), "dbe": N.nvmlDeviceGetRetiredPages(h, 1),
          "pending": N.nvmlDeviceGetRetiredPagesPendingStatus(h),
          "l1": N.nvmlDeviceGetMemoryErrorCounter(h, 0, 0, N.NVML_MEMORY_LOCATION_L1_CACHE)}
try:
    N.nvmlDeviceGetRemappedRows(h)
except N.NVMLError_NotSupported:
    result["remap"] = "not supported"
try:
    N.nvmlDeviceGetMemoryErrorCounter(h, 0, 0, N.NVML_MEMORY_LOCATION_SRAM)
except N.NVMLError_NotSupported:
    result["sram"] = "not supported"
""",
    )
    assert out["sbe"] == 3 and len(out["dbe"]) == 2 and len(set(out["dbe"])) == 2
    assert out["pending"] == 1 and out["l1"] == 0
    assert out["remap"] == "not supported" and out["sram"] == "not supported"


def test_old_driver_lacks_newer_symbols_so_fallbacks_run(make_host, pynvml_run):
    host = make_host(gpus=2, model="old-driver")
    faults.gpu_mem(host, gpu=0, gib=1.0, pid=77)
    out = pynvml_run(
        host,
        """
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
result = {"driver": N.nvmlSystemGetDriverVersion()}
try:
    N.nvmlDeviceGetComputeRunningProcesses(h)
    result["procs_v3"] = "ok"
except N.NVMLLibraryMismatchError:  # pynvml's own reaction to a missing _v3 symbol
    result["procs_v3"] = "missing"
for key, call in (("events", lambda: N.nvmlDeviceGetCurrentClocksEventReasons(h)),
                  ("mem_v2", lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)),
                  ("numa", lambda: N.nvmlDeviceGetNumaNodeId(h))):
    try:
        call()
        result[key] = "ok"
    except N.NVMLError_FunctionNotFound:
        result[key] = "missing"
result["procs_v2"] = [[p.pid, p.usedGpuMemory] for p in N.nvmlDeviceGetComputeRunningProcesses_v2(h)]
result["throttle"] = N.nvmlDeviceGetCurrentClocksThrottleReasons(h)
result["mem_v1"] = N.nvmlDeviceGetMemoryInfo(h).total
""",
        variant="old",
    )
    assert out["driver"] == "470.239.06"
    assert out["procs_v3"] == out["events"] == out["mem_v2"] == out["numa"] == "missing"
    assert out["procs_v2"] == [[77, 1024 * MIB]]
    assert out["throttle"] == 1 and out["mem_v1"] == 81920 * MIB


def test_no_state_file_or_unloaded_driver_fails_init_like_a_node_without_driver(make_host, pynvml_run, tmp_path):
    host = make_host(gpus=1)
    faults.driver(host, loaded=False)
    code = """
try:
    N.nvmlInit()
    result = "ok"
except N.NVMLError as e:
    result = [e.value, str(e)]
"""
    assert pynvml_run(host, code) == [9, "Driver Not Loaded"]
    (hw_dir(host) / "nvml.json").unlink()
    assert pynvml_run(host, code) == [9, "Driver Not Loaded"]


def test_memory_v2_rejects_a_wrong_struct_version(make_host, pynvml_run):
    host = make_host(gpus=1)
    out = pynvml_run(
        host,
        """
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
try:
    N.nvmlDeviceGetMemoryInfo(h, version=0x01000028)
    result = "ok"
except N.NVMLError as e:
    result = e.value
""",
    )
    assert out == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_calls_before_init_are_uninitialized(make_host, nvml_libs):
    """The library, not pynvml, enforces nvmlInit (ctypes straight into the .so)."""
    import ctypes

    host = make_host(gpus=1)
    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); c = ctypes.c_uint();"
        "print(lib.nvmlDeviceGetCount_v2(ctypes.byref(c)), lib.nvmlShutdown())"
    )
    env = {"FAKE_NVML_STATE": str(hw_dir(host) / "nvml.json"), "PATH": "/usr/bin:/bin"}
    cp = subprocess.run(
        ["python3", "-c", code, str(nvml_libs["current"] / nvml.SONAME)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert cp.stdout.split() == ["1", "1"], cp.stderr
    assert ctypes  # imported for the reader: the child uses ctypes the same way


def test_compiler_failure_is_a_clear_error(tmp_path):
    with pytest.raises(LabError, match="C compiler not found"):
        nvml.build(tmp_path, "current", cc="no-such-cc")
    with pytest.raises(LabError, match="unknown fake NVML variant"):
        nvml.build(tmp_path, "future")
    assert not list(Path(tmp_path).rglob("*.so*"))


def test_a_hung_gpu_blocks_its_calls_then_times_out_while_others_answer(make_host, pynvml_run):
    host = make_host(gpus=2)
    faults.gpu_hang(host, gpu=1, seconds=1.5)
    out = pynvml_run(
        host,
        """
import time
N.nvmlInit()
h0, h1 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
t = time.monotonic()
try:
    N.nvmlDeviceGetName(h1)
    err = None
except N.NVMLError as e:
    err = [e.value, str(e)]
hung = time.monotonic() - t
t = time.monotonic()
name0 = N.nvmlDeviceGetName(h0)
result = {"err": err, "hung": hung, "other": time.monotonic() - t, "name0": name0}
""",
    )
    assert out["err"] == [10, "Timeout"] and out["hung"] >= 1.4
    assert out["other"] < 0.5 and out["name0"] == "NVIDIA H100 80GB HBM3"
    faults.gpu_hang(host, gpu=1, seconds=0)
    assert "hang_s" not in gpus.load(hw_dir(host))["gpus"][1]


READ_RECOVERY = """
N.nvmlInit()
result = []
for i in range(2):
    h = N.nvmlDeviceGetHandleByIndex(i)
    fv = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, N.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS])
    result.append([fv[0].nvmlReturn, fv[0].valueType, fv[0].value.uiVal, fv[1].nvmlReturn])
N.nvmlShutdown()
"""


def test_the_recovery_action_field_reads_what_the_fault_set(make_host, pynvml_run):
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230): 0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain and reset
    host = make_host(gpus=2)
    assert pynvml_run(host, READ_RECOVERY) == [[0, 1, 0, 3], [0, 1, 0, 3]]  # field 230 OK; others NOT_SUPPORTED
    faults.inject(host, "recovery", gpu=1, action="drain-and-reset", log_xid=0)
    assert pynvml_run(host, READ_RECOVERY)[1][:3] == [0, 1, 4]
    with pytest.raises(LabError, match="one of none, reset"):
        faults.inject(host, "recovery", gpu=1, action="explode")


def test_check_gpus_refuses_a_placed_gpu_that_is_not_present(make_host, nvml_libs):
    import os
    import sys
    from clusterctl.node import check_gpus

    host = make_host(gpus=4)
    env = dict(os.environ, LD_LIBRARY_PATH=str(nvml_libs["current"]), FAKE_NVML_STATE=str(hw_dir(host) / "nvml.json"))

    def run(*args):
        return subprocess.run(
            [sys.executable, check_gpus.__file__, *args], env=env, capture_output=True, text=True, timeout=60
        )

    listed = run("--list")
    assert listed.returncode == 0
    uuids = [line.split()[1] for line in listed.stdout.splitlines()]
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["0", "1", "2", "3"]
    state = json.loads((hw_dir(host) / "nvml.json").read_text())
    assert uuids == [g["uuid"] for g in state["gpus"]]
    assert run(uuids[1], uuids[2]).returncode == 0
    faults.inject(host, "gpu-lost", gpu=2, log=False)  # fallen off the bus: its UUID is gone
    r = run(uuids[1], uuids[2])
    assert r.returncode == 1 and f"placed GPU(s) {uuids[2]} not present" in r.stderr
    assert f"1={uuids[1]}" in r.stderr and "refusing to start" in r.stderr
