"""The collector's NVML layer against a fake pynvml module."""

from __future__ import annotations

import time

from clusterctl.node import collector

from probe_fakes import GPU_IS_LOST, LIBRARY_NOT_FOUND, NOT_SUPPORTED, Hang, NVMLError, collector_args, h100

GIB = 1024**3


def test_healthy_gpus_report_every_field(fake_nvml):
    fake = fake_nvml([h100(0), h100(1)])
    errors: list = []
    gpus = collector.collect_gpus(collector_args(), errors)
    assert gpus["available"] is True and gpus["reason"] is None
    assert gpus["driver_version"] == "570.124.06"
    assert gpus["count"] == 2
    d = gpus["devices"][1]
    assert d["name"] == "NVIDIA H100 80GB HBM3"
    assert d["pci_bus_id"] == "00000000:19:00.0"
    assert d["pci_address"] == "0000:19:00.0"
    assert (d["memory_total"], d["memory_used"], d["memory_free"]) == (80 * GIB, 70 * GIB, 10 * GIB)
    assert d["processes"][0]["pid"] == 4242 and d["processes"][0]["used_memory"] == 70 * GIB
    assert d["ecc"]["volatile"] == {"corrected": 3, "uncorrected": 0}
    assert d["ecc"]["aggregate"] == {"corrected": 12, "uncorrected": 1}
    assert d["ecc"]["enabled"] is True
    assert d["remapped_rows"] == {"correctable": 2, "uncorrectable": 0, "pending": False, "failure": False}
    assert d["clocks_event_reasons"] == {"mask": "0x44", "active": ["sw_power_cap", "hw_thermal_slowdown"]}
    assert d["pcie"] == {"width": 16, "max_width": 16, "gen": 5, "max_gen": 5, "replay_counter": 0}
    assert [link["link"] for link in d["nvlink"]] == [0, 1]
    assert d["nvlink"][1]["errors"]["crc_flit"] == 7
    assert d["temperature_c"] == 41 and d["power_w"] == 112.5 and d["power_limit_w"] == 700.0
    assert d["utilization"] == {"gpu": 97, "memory": 60}
    assert d["persistence_mode"] is True and d["numa_node"] == 0
    assert d["lost"] is False and d["hung"] is False
    assert gpus["topology"] == [{"gpus": [0, 1], "level": "SINGLE", "reason": None}]
    assert fake.shutdown_called
    assert errors == []


def test_not_supported_field_is_null_with_reason(fake_nvml):
    gpu = h100(0)
    gpu["nvmlDeviceGetPcieReplayCounter"] = NVMLError(NOT_SUPPORTED)
    gpu["nvmlDeviceGetMemoryInfo"] = NVMLError(NOT_SUPPORTED)
    fake_nvml([gpu])
    d = collector.collect_gpus(collector_args(), [])["devices"][0]
    assert d["memory_used"] is None and d["field_errors"]["memory"] == "not supported"
    assert d["pcie"]["replay_counter"] is None and d["pcie"]["width"] == 16
    assert d["field_errors"]["pcie.replay_counter"] == "not supported"
    # pre-Ampere only: NOT_SUPPORTED on an H100
    assert d["retired_pages"] is None and d["field_errors"]["retired_pages"] == "not supported"
    # the remaining fields are still read
    assert d["temperature_c"] == 41 and d["lost"] is False


def test_lost_gpu_is_marked_and_the_others_still_read(fake_nvml):
    lost = h100(1)
    lost["nvmlDeviceGetMemoryInfo"] = NVMLError(GPU_IS_LOST)
    fake_nvml([h100(0), lost, h100(2)])
    gpus = collector.collect_gpus(collector_args(), [])
    d0, d1, d2 = gpus["devices"]
    assert d1["lost"] is True and d1["name"] == "NVIDIA H100 80GB HBM3"
    assert d1["memory_used"] is None and "GPU is lost" in d1["field_errors"]["device"]
    assert d0["lost"] is False and d2["memory_used"] == 70 * GIB
    # topology only between GPUs that still answer
    assert [t["gpus"] for t in gpus["topology"]] == [[0, 2]]


def test_lost_at_handle_time(fake_nvml):
    gpu = h100(0)
    gpu["handle"] = NVMLError(GPU_IS_LOST)
    fake_nvml([gpu])
    d = collector.collect_gpus(collector_args(), [])["devices"][0]
    assert d["lost"] is True and d["uuid"] is None
    assert set(d) == set(collector.DEVICE_KEYS)


def test_hung_call_times_out_is_recorded_and_skips_that_gpu(fake_nvml):
    hang = Hang(seconds=30)
    gpu = h100(0)
    gpu["nvmlDeviceGetRemappedRows"] = hang
    fake = fake_nvml([gpu, h100(1)])
    t0 = time.monotonic()
    try:
        gpus = collector.collect_gpus(collector_args(nvml_timeout=0.3), [])
    finally:
        hang.release.set()
    assert time.monotonic() - t0 < 5
    d0, d1 = gpus["devices"]
    assert d0["hung"] is True
    assert d0["field_errors"]["device"] == "NVML call nvmlDeviceGetRemappedRows timed out after 0.3 s"
    assert d0["memory_used"] == 70 * GIB  # read before the hang
    assert d0["temperature_c"] is None  # after it: skipped
    assert gpus["timed_out_calls"] == ["nvmlDeviceGetRemappedRows"]
    assert d1["hung"] is False and d1["temperature_c"] == 41
    assert not fake.shutdown_called  # shutdown would block on the hung call


def test_nvml_budget_bounds_many_hangs(fake_nvml):
    hangs = [Hang(30) for _ in range(4)]
    gpus_in = []
    for i, h in enumerate(hangs):
        g = h100(i)
        g["nvmlDeviceGetName"] = h
        gpus_in.append(g)
    fake_nvml(gpus_in)
    t0 = time.monotonic()
    try:
        gpus = collector.collect_gpus(collector_args(nvml_timeout=0.4, nvml_budget=0.6), [])
    finally:
        for h in hangs:
            h.release.set()
    assert time.monotonic() - t0 < 2.5
    assert all(d["hung"] for d in gpus["devices"])
    assert "budget" in gpus["devices"][-1]["field_errors"]["device"]


def test_no_library_is_a_reason_not_a_crash(fake_nvml):
    fake_nvml([], init=NVMLError(LIBRARY_NOT_FOUND))
    gpus = collector.collect_gpus(collector_args(), [])
    assert gpus["available"] is False
    assert gpus["reason"].startswith("NVML library (libnvidia-ml.so.1) not found")
    assert gpus["devices"] == []


def test_hung_init(fake_nvml):
    hang = Hang(30)
    fake_nvml([], init=hang)
    try:
        gpus = collector.collect_gpus(collector_args(nvml_timeout=0.2), [])
    finally:
        hang.release.set()
    assert gpus["available"] is False
    assert gpus["reason"] == "NVML call nvmlInit timed out after 0.2 s"


def test_old_driver_without_event_reasons_uses_throttle_reasons(fake_nvml):
    gpu = h100(0)
    gpu["nvmlDeviceGetCurrentClocksEventReasons"] = NVMLError(13)  # FUNCTION_NOT_FOUND
    gpu["nvmlDeviceGetCurrentClocksThrottleReasons"] = 0x1
    fake_nvml([gpu])
    d = collector.collect_gpus(collector_args(), [])["devices"][0]
    assert d["clocks_event_reasons"]["active"] == ["gpu_idle"]


def test_pcie_gpu_without_nvlink_has_empty_list(fake_nvml):
    gpu = h100(0)
    gpu["nvmlDeviceGetNvLinkState"] = NVMLError(NOT_SUPPORTED)
    fake_nvml([gpu])
    d = collector.collect_gpus(collector_args(), [])["devices"][0]
    assert d["nvlink"] == [] and "nvlink" not in d["field_errors"]


def test_decode_clock_reasons_keeps_unknown_bits():
    assert collector.decode_clock_reasons(0) == []
    assert collector.decode_clock_reasons(0x8 | 0x1000) == ["hw_slowdown", "0x1000"]


def test_normalize_pci():
    assert collector.normalize_pci("00000000:3B:00.0") == "0000:3b:00.0"
    assert collector.normalize_pci("0000:d8:00.0") == "0000:d8:00.0"


def test_no_pynvml_anywhere(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    monkeypatch.delitem(collector.__dict__, "CARRIED_PYNVML", raising=False)
    gpus = collector.collect_gpus(collector_args(), [])
    assert gpus["available"] is False and gpus["reason"].startswith("no pynvml on the node")
