"""GPU checks on facts documents: each fault gives its finding, a healthy host only OK."""

from __future__ import annotations

from typing import Any

import pytest

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import run_analyzers

import gpu_facts as G


def run(facts: dict[str, dict[str, Any]], checks=("gpu",), **kw):
    return run_analyzers(G.ctx(facts, **kw), only=list(checks))


def bad(findings):
    return [f for f in findings if f.severity != Severity.OK]


def test_healthy_hosts_report_only_ok_for_every_gpu_check():
    found = run(G.healthy())
    assert found and not bad(found)
    assert {f.check for f in found} >= {
        "gpu.nvml",
        "gpu.inventory",
        "gpu.lost",
        "gpu.ecc",
        "gpu.remap",
        "gpu.pcie",
        "gpu.nvlink",
        "gpu.thermal",
        "gpu.persistence",
        "gpu.clocks",
        "gpu.xid",
        "gpu.foreign",
        "gpu.retired",
    }


def with_device(index: int, **changes: Any) -> dict[str, dict[str, Any]]:
    facts = G.healthy()
    facts["gpu01"]["gpus"]["devices"][index].update(changes)
    return facts


@pytest.mark.parametrize(
    "index, changes, check, severity, words",
    [
        (
            1,
            {"ecc": {"volatile": {"corrected": 0, "uncorrected": 2}, "aggregate": {"corrected": 0, "uncorrected": 2}}},
            "gpu.ecc",
            Severity.CRIT,
            "reset the GPU",
        ),
        (
            2,
            {"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}},
            "gpu.remap",
            Severity.WARN,
            "reset the GPU at the next maintenance window",
        ),
        (
            2,
            {"remapped_rows": {"correctable": 0, "uncorrectable": 9, "pending": False, "failure": True}},
            "gpu.remap",
            Severity.CRIT,
            "replace",
        ),
        (
            3,
            {"retired_pages": {"single_bit_ecc": 40, "double_bit_ecc": 30, "pending": True}},
            "gpu.retired",
            Severity.CRIT,
            "replace",
        ),
        (
            3,
            {"retired_pages": {"single_bit_ecc": 0, "double_bit_ecc": 1, "pending": True}},
            "gpu.retired",
            Severity.WARN,
            "reboot",
        ),
        (
            4,
            {"clocks_event_reasons": {"mask": "0x48", "active": ["hw_slowdown", "hw_thermal_slowdown"]}},
            "gpu.clocks",
            Severity.WARN,
            "cooling",
        ),
        (
            5,
            {"pcie": {"width": 8, "max_width": 16, "gen": 5, "max_gen": 5, "replay_counter": 0}},
            "gpu.pcie",
            Severity.WARN,
            "reseat",
        ),
        (
            6,
            {"nvlink": [{"link": 0, "state": "inactive", "errors": {}}, {"link": 1, "state": "active", "errors": {}}]},
            "gpu.nvlink",
            Severity.CRIT,
            "nvlink -s",
        ),
        (7, {"temperature_c": 95}, "gpu.thermal", Severity.CRIT, "airflow"),
        (7, {"temperature_c": 87}, "gpu.thermal", Severity.WARN, "airflow"),
        (0, {"persistence_mode": False}, "gpu.persistence", Severity.WARN, "`clusterctl node setup --hosts 'gpu01'`"),
        # ECC off: the counters read 0 whatever happens, so no "no uncorrected errors" OK either
        (
            1,
            {
                "ecc": {
                    "volatile": {"corrected": 0, "uncorrected": 0},
                    "aggregate": {"corrected": 0, "uncorrected": 0},
                    "enabled": False,
                    "pending_enabled": False,
                }
            },
            "gpu.ecc",
            Severity.WARN,
            "enable ECC",
        ),
        (0, {"lost": True, "field_errors": {"device": "GPU is lost"}}, "gpu.lost", Severity.CRIT, "power-cycle"),
        (0, {"hung": True}, "gpu.lost", Severity.CRIT, "reset the GPU"),
    ],
)
def test_each_fault_is_found_on_its_gpu_with_the_action(index, changes, check, severity, words):
    found = bad(run(with_device(index, **changes)))
    assert [(f.check, f.severity, f.host, f.subject) for f in found] == [(check, severity, "gpu01", f"gpu:{index}")]
    assert words in found[0].action


def test_ecc_off_is_reported_not_passed_as_no_errors_and_no_ecc_support_is_not():
    [f] = bad(
        run(
            with_device(
                1, ecc={"volatile": {"corrected": 0, "uncorrected": 0}, "enabled": False, "pending_enabled": True}
            )
        )
    )
    assert "ECC is disabled (enabled after the next reboot" in f.message and "read 0" in f.message
    # a GPU without ECC (NVML: not supported) is neither a problem nor "no errors" on data never seen
    assert not bad(run(with_device(1, ecc={"volatile": {}, "enabled": None, "pending_enabled": None})))


@pytest.mark.parametrize(
    "action, words",
    [
        ("reset", "nvidia-smi -r"),
        ("reboot", "reboot the node"),
        ("drain_p2p", "drain the multi-GPU instances"),
        ("drain_and_reset", "and reset it"),
    ],
)
def test_nvml_recovery_action_is_critical_with_nvidias_action(action, words):
    [f] = bad(run(with_device(2, recovery_action=action)))
    assert (f.check, f.severity, f.subject) == ("gpu.recovery", Severity.CRIT, "gpu:2")
    assert words in f.action and f"recovery action {action}" in f.message


def test_a_gpu_not_registered_with_the_nvlink_fabric_is_critical_naming_the_fabric_manager():
    facts = with_device(3, fabric={"state": "not_started", "status": 0, "clique_id": 0})
    facts["gpu01"]["gpus"]["fabric_manager"] = {"load_state": "loaded", "active_state": "failed", "sub_state": "failed"}
    [f] = bad(run(facts))
    assert (f.check, f.severity, f.subject) == ("gpu.fabric", Severity.CRIT, "gpu:3")
    assert "not registered with the NVLink fabric (state not_started)" in f.message
    assert "nvidia-fabricmanager is failed" in f.message and "restart nvidia-fabricmanager" in f.action
    [f] = bad(run(with_device(3, fabric={"state": "completed", "status": 5, "clique_id": 1})))
    assert "registration with the NVLink fabric failed (NVML status 5)" in f.message
    assert not bad(run(with_device(3, fabric={"state": "completed", "status": 0, "clique_id": 1})))


def test_xid_63_says_reset_at_the_next_maintenance_window():
    facts = G.healthy()
    facts["gpu01"]["kernel_log"]["lines"] = [
        {
            "text": "NVRM: Xid (PCI:0000:2a:00): 63, pid='<unknown>', name=<unknown>, "
            "Row Remapper: New row (0x0000000000000123) marked for remapping, "
            "reset gpu to activate."
        }
    ]
    [f] = [f for f in bad(run(facts)) if f.check == "gpu.xid"]
    assert f.severity == Severity.WARN and "next maintenance window" in f.action and "reset" in f.action


def test_idle_gpu_at_a_lower_pcie_gen_is_fine_but_not_while_busy():
    idle = {"pcie": {"width": 16, "max_width": 16, "gen": 1, "max_gen": 5, "replay_counter": 0}}
    assert not bad(run(with_device(0, **idle)))
    busy = bad(run(with_device(0, utilization={"gpu": 90, "memory": 40}, **idle)))
    assert [(f.check, f.subject) for f in busy] == [("gpu.pcie", "gpu:0")]


def test_rising_pcie_replays_and_nvlink_errors_between_two_samples():
    facts = G.healthy()
    later = G.healthy()
    later["gpu01"]["gpus"]["devices"][2]["pcie"]["replay_counter"] = 40
    later["gpu01"]["gpus"]["devices"][3]["nvlink"][4]["errors"]["crc_flit"] = 12
    found = bad(run(facts, samples=later, interval_s=2.0))
    assert sorted((f.check, f.subject) for f in found) == [("gpu.nvlink", "gpu:3"), ("gpu.pcie", "gpu:2")]
    assert "+40 in 2 s" in next(f.message for f in found if f.check == "gpu.pcie")


def test_fewer_gpus_than_the_inventory_is_critical():
    facts = G.healthy()
    del facts["gpu02"]["gpus"]["devices"][7]
    found = bad(run(facts))
    assert [(f.check, f.severity, f.host) for f in found] == [("gpu.inventory", Severity.CRIT, "gpu02")]
    assert "7 GPUs visible, the inventory says 8" in found[0].message


def test_driver_not_loaded_is_critical_and_missing_pynvml_unknown():
    facts = G.healthy()
    facts["gpu01"]["gpus"] = {"available": False, "reason": "NVIDIA driver not loaded", "devices": []}
    facts["gpu02"]["gpus"] = {"available": False, "reason": "no pynvml: import failed", "devices": []}
    found = {(f.check, f.host): f for f in run(facts, checks=["gpu.nvml"])}
    assert found[("gpu.nvml", "gpu01")].severity == Severity.CRIT
    assert found[("gpu.nvml", "gpu02")].severity == Severity.UNKNOWN


def test_hung_nvml_calls_are_critical():
    facts = G.healthy()
    facts["gpu01"]["gpus"]["timed_out_calls"] = ["nvmlDeviceGetPowerUsage"]
    (f,) = bad(run(facts, checks=["gpu.nvml"]))
    assert f.severity == Severity.CRIT and "nvmlDeviceGetPowerUsage" in f.message


def test_driver_that_differs_from_the_other_hosts_is_a_warning():
    facts = {f"gpu0{i}": G.host_facts(f"gpu0{i}") for i in range(1, 4)}
    facts["gpu03"]["gpus"]["driver_version"] = "535.54.03"
    (f,) = bad(run(facts, checks=["gpu.inventory"], inv=None))
    assert (f.host, f.severity) == ("gpu03", Severity.WARN) and "570.124.06" in f.message


def test_a_host_without_facts_is_unknown_never_ok():
    found = run({}, raw={"gpu01": {"kernel.log": ""}}, checks=["gpu.ecc", "gpu.lost"])
    assert {(f.check, f.severity) for f in found} == {("gpu.ecc", Severity.UNKNOWN), ("gpu.lost", Severity.UNKNOWN)}
    unreachable = run_analyzers(G.ctx({}, missing={"gpu02": "unreachable: timed out"}), only=["gpu", "host"])
    assert [(f.check, f.severity) for f in unreachable if f.host == "gpu02"] == [("host.reachable", Severity.UNKNOWN)]
