"""The simulator's ``cpu-1core`` profile stays within a stated tolerance of the real CPU engine's figures.

The real figures are the newest result of ``benchmarks/real_vllm/calibrate.py`` (clusterctl's bench against
real vLLM 0.32's CPU build serving the tiny real model at 1, 4 and 16 streams; docs/real-vllm.md).  The
simulator is not re-measured here: the profile is run on the virtual clock over the same workload (the
bench's closed loop, ``latency.bench_point``), which is what its 1x serving waits out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clusterctl.lab.vllm_sim import latency as L
from clusterctl.lab.vllm_sim.profiles import PROFILES

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
#: How far (relative) the simulator may be from the real engine at each point (docs/real-vllm.md).
TOLERANCE = 0.25
KEYS = ("ttft_ms", "tpot_ms", "output_tps")


def _calibration() -> dict[str, Any]:
    files = sorted(RESULTS.glob("real-vllm-calibration-*.json"))
    assert files, "no benchmarks/results/real-vllm-calibration-*.json: run benchmarks/real_vllm/calibrate.py"
    return json.loads(files[-1].read_text())


def _virtual(doc: dict[str, Any], lv: dict[str, Any]) -> dict[str, float]:
    w = doc["workload"]
    b = L.bench_point(PROFILES["cpu-1core"], L.MODEL_TINY_LLAMA, concurrency=lv["concurrency"],
                      requests=lv["requests"], prompt_len=round(lv["prompt_tokens_mean"]),
                      output_len=w["output_len"], num_blocks=w["kv_cache_memory_bytes"] // (128 * 1024),
                      max_num_seqs=w["budget"]["max_num_seqs"],
                      max_num_batched_tokens=w["budget"]["max_num_batched_tokens"], block_size=128)
    return {"ttft_ms": b.ttft_mean * 1e3, "tpot_ms": b.tpot_mean * 1e3, "output_tps": b.output_tps,
            "preemptions": b.preemptions}


def _off(sim: float, real: float) -> float:
    return abs(sim - real) / real


def test_the_recorded_real_run_covers_1_4_and_16_streams() -> None:
    doc = _calibration()
    levels = doc["real"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 4, 16]
    for lv in levels:
        assert lv["completed"] == lv["requests"] and lv["failed"] == 0, lv
        assert lv["trusted"], lv  # the bench did not flag its own generator as starved
        assert len(lv["loadavg_1m"]) == 2  # the load is recorded beside every figure


@pytest.mark.parametrize("concurrency", [1, 4, 16])
def test_cpu_profile_within_tolerance_of_the_real_engine(concurrency: int) -> None:
    doc = _calibration()
    real = next(lv for lv in doc["real"]["levels"] if lv["concurrency"] == concurrency)
    sim = _virtual(doc, real)
    for k in KEYS:
        assert _off(sim[k], real[k]) <= TOLERANCE, (k, sim[k], real[k])
    # Same preemption behaviour: neither preempts with the recorded KV size.
    assert sim["preemptions"] == real["preemptions"] == 0


def test_the_simulator_at_1x_through_bench_matched_the_real_engine() -> None:
    """The recorded stand-in run: the simulator serving at 1x with ``--sim-profile cpu-1core``, measured by
    the same bench: TPOT and output throughput within the tolerance of the real engine at every level, TTFT
    at one stream.  (TTFT under concurrency depends on how closely a burst of the bench's requests arrives;
    the recorded run's load and the gap are in docs/real-vllm.md.)"""
    doc = _calibration()
    assert doc["profile"]["name"] == "cpu-1core"
    p = PROFILES["cpu-1core"]
    assert (doc["profile"]["t_step"], doc["profile"]["t_seq"], doc["profile"]["flops_eff"]) == \
        (p.t_step, p.t_seq, p.flops_eff), "the profile changed since the recorded run: rerun calibrate.py"
    for real, sim in zip(doc["real"]["levels"], doc["sim_1x"]["levels"], strict=True):
        assert sim["concurrency"] == real["concurrency"] and sim["completed"] == sim["requests"]
        for k in ("tpot_ms", "output_tps") + (("ttft_ms",) if real["concurrency"] == 1 else ()):
            assert _off(sim[k], real[k]) <= TOLERANCE, (real["concurrency"], k, sim[k], real[k])
        assert sim["preemptions"] == real["preemptions"] == 0
