"""Trend numbers taken from probe facts and vLLM /metrics samples."""

from __future__ import annotations

from pathlib import Path

from clusterctl.report.history import Metric
from clusterctl.report.metrics import from_snapshot, vllm_metrics

PROM = (Path(__file__).resolve().parents[2] / "fixtures" / "diagnose" / "vllm" / "metrics_v0.11.0.prom").read_text()


def test_gpu_memory_and_utilisation_per_gpu_skipping_unreadable_fields():
    facts = {"gpu01": {"gpus": {"devices": [
        {"index": 0, "memory_used": 40 * 2**30, "utilization": {"gpu": 87, "memory": 40}},
        {"index": 1, "memory_used": None, "utilization": None},
        "garbage"]}}, "gpu02": {"gpus": {"available": False, "devices": None}}}
    assert from_snapshot(facts, {}) == [Metric("gpu01", "gpu_memory_used_bytes", 40 * 2**30, "gpu:0"),
                                        Metric("gpu01", "gpu_utilization_ratio", 0.87, "gpu:0")]


def test_vllm_kv_cache_and_queue_from_a_recorded_metrics_page():
    got = {m.name: m for m in vllm_metrics("gpu01", "qwen-a", PROM)}
    assert got["vllm_requests_waiting"].value == 3.0
    assert 0.0 <= got["vllm_kv_cache_usage_ratio"].value <= 1.0
    assert got["vllm_requests_waiting"].subject == "instance:qwen-a"
    assert from_snapshot({}, {"gpu01": {"qwen-a.metrics": PROM, "kernel.log": "x"}}) == sorted(
        got.values(), key=lambda m: m.name)
