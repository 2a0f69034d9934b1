"""Trend numbers taken from probe facts and vLLM /metrics samples."""

from __future__ import annotations

from pathlib import Path

from clusterctl.report.history import Metric
from clusterctl.report.metrics import from_snapshot, vllm_metrics

PROM = (Path(__file__).resolve().parents[2] / "fixtures" / "diagnose" / "vllm" / "metrics_v0.11.0.prom").read_text()


def test_gpu_memory_and_utilisation_per_gpu_skipping_unreadable_fields():
    facts = {
        "gpu01": {
            "gpus": {
                "devices": [
                    {"index": 0, "memory_used": 40 * 2**30, "utilization": {"gpu": 87, "memory": 40}},
                    {"index": 1, "memory_used": None, "utilization": None},
                    "garbage",
                ]
            }
        },
        "gpu02": {"gpus": {"available": False, "devices": None}},
    }
    assert from_snapshot(facts, {}) == [
        Metric("gpu01", "gpu_memory_used_bytes", 40 * 2**30, "gpu:0"),
        Metric("gpu01", "gpu_utilization_ratio", 0.87, "gpu:0"),
    ]


def test_vllm_kv_cache_and_queue_from_a_recorded_metrics_page():
    got = {m.name: m for m in vllm_metrics("gpu01", "qwen-a", PROM)}
    assert got["vllm_requests_waiting"].value == 3.0
    assert 0.0 <= got["vllm_kv_cache_usage_ratio"].value <= 1.0
    assert got["vllm_requests_waiting"].subject == "instance:qwen-a"
    assert from_snapshot({}, {"gpu01": {"qwen-a.metrics": PROM, "kernel.log": "x"}}) == sorted(
        got.values(), key=lambda m: m.name
    )


def _nic(
    netdev: str,
    first: dict[str, int],
    last: dict[str, int],
    hw_first: dict[str, int] | None = None,
    hw_last: dict[str, int] | None = None,
) -> dict:
    return {
        "netdev": netdev,
        "rdma": {"device": "mlx5_0", "link_layer": "Ethernet"},
        "samples": [
            {"t": 100.0, "ethtool_stats": first, "hw_counters": hw_first or {}},
            {"t": 102.0, "ethtool_stats": last, "hw_counters": hw_last or {}},
        ],
    }


def test_roce_paused_fraction_and_cnp_rate_per_nic_from_node_timed_samples():
    facts = {
        "gpu01": {
            "nics": [
                # paused 1.2 s of 2 s on priority 3 (0.6), 0.2 s on priority 0; 4000 CNPs sent, 1000 handled
                _nic(
                    "eth2",
                    {"rx_prio3_pause_duration": 0, "rx_prio0_pause_duration": 0},
                    {"rx_prio3_pause_duration": 1_200_000, "rx_prio0_pause_duration": 200_000},
                    {"np_cnp_sent": 10, "rp_cnp_handled": 0},
                    {"np_cnp_sent": 4010, "rp_cnp_handled": 1000},
                ),
                # a storm longer than the interval still reads as at most 1
                _nic("eth3", {"rx_prio3_pause_duration": 0}, {"rx_prio3_pause_duration": 9_000_000}),
                {"netdev": "eth0"},  # not RDMA: no metrics
                {"netdev": "eth4", "rdma": {"device": "mlx5_2"}, "samples": [{"t": 1.0}]},  # one sample: no rate
            ]
        }
    }
    got = {(m.subject, m.name): m.value for m in from_snapshot(facts, {})}
    assert got == {
        ("nic:eth2", "roce_paused_ratio"): 0.6,
        ("nic:eth2", "roce_cnp_per_second"): 2000.0,
        ("nic:eth3", "roce_paused_ratio"): 1.0,
    }
