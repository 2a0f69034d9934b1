"""Latency profiles: the step-time physics and the operating points they produce (virtual clock)."""

from __future__ import annotations

import dataclasses

import pytest

from clusterctl.lab.vllm_sim import latency as L
from clusterctl.lab.vllm_sim import profiles as P


def test_small_batch_decode_is_memory_bound_and_prefill_compute_bound() -> None:
    prof, m = P.PROFILES["l40s-48g"], L.MODEL_8B_INT8
    one = P.step_time(prof, m, P.StepLoad((1,), (100,)))
    heavier = P.step_time(prof, dataclasses.replace(m, weight_bytes=2 * m.weight_bytes), P.StepLoad((1,), (100,)))
    assert heavier - prof.t_step - prof.t_seq == pytest.approx(2 * (one - prof.t_step - prof.t_seq), rel=0.05)
    p1 = P.step_time(prof, m, P.StepLoad((2000,), (0,)))
    p2 = P.step_time(prof, m, P.StepLoad((4000,), (0,)))
    assert 1.9 < (p2 - prof.t_step) / (p1 - prof.t_step) < 2.2  # linear in tokens, + attention
    # batch 8 decode costs little more than batch 1 (the weights are read once per step)
    eight = P.step_time(prof, m, P.StepLoad((1,) * 8, (100,) * 8))
    assert one < eight < 1.3 * one


def test_longer_contexts_make_decode_steps_slower() -> None:
    prof, m = P.PROFILES["h100-sxm"], L.MODEL_8B_BF16
    short = P.step_time(prof, m, P.StepLoad((1,) * 32, (512,) * 32))
    long = P.step_time(prof, m, P.StepLoad((1,) * 32, (8192,) * 32))
    assert long > 1.5 * short


def test_tp_needs_an_interconnect_and_pays_for_all_reduce() -> None:
    prof = P.PROFILES["l40s-48g"]
    m = L.MODEL_27B_AWQ_TP4
    base = P.step_time(dataclasses.replace(prof, link_bw=1e15, link_latency=0.0), m, P.StepLoad((2000,), (0,)))
    assert P.step_time(prof, m, P.StepLoad((2000,), (0,))) > base * 1.1  # PCIe all-reduce is not free
    with pytest.raises(ValueError, match="no TP interconnect"):
        P.step_time(dataclasses.replace(prof, link_bw=0.0), m, P.StepLoad((1,), (0,)))


def test_default_profile_from_the_gpu_model_and_unknown_names() -> None:
    assert P.default_profile("NVIDIA L40S") == "l40s-48g"
    assert P.default_profile("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert P.default_profile("Some Card", total_bytes=48 << 30) == "l40s-48g"
    with pytest.raises(ValueError, match="known: cpu-1core, h100-sxm, l40s-48g"):
        P.get("a100")


def _within(value: float, target: float, tol: float = 0.15) -> bool:
    return abs(value - target) <= tol * target


def test_field_report_operating_points_of_the_8b_int8_profile() -> None:
    one, eight, raised = (L.run(s) for s in L.REPORT[:3])
    assert _within(one.per_user_tps, 90.0), one
    assert _within(one.ttft_mean, 0.2), one
    assert _within(eight.output_tps, 150.0), eight
    assert _within(eight.ttft_mean, 2.0), eight
    assert raised.output_tps > 200.0 and raised.ttft_mean <= eight.ttft_mean, raised


def test_27b_tp4_ttft_passes_10_s_at_20_concurrent_users_and_rises_with_them() -> None:
    s = L.REPORT[3]
    ttft = {u: L.run(s, users=u).ttft_mean for u in (1, 5, 20)}
    assert ttft[1] < ttft[5] < ttft[20]
    assert ttft[20] > 10.0
    assert ttft[1] < 1.5


@pytest.mark.parametrize(
    "profile,model,budget,users,burst",
    [
        ("l40s-48g", "8b-int8", (4, 512), (1, 2, 8), False),  # closed loop, the report's initial budget (4 seats)
        ("l40s-48g", "8b-int8", (256, 2048), (1, 4, 16), True),  # bursts, vLLM's default budget
        ("h100-sxm", "8b-bf16", (1024, 8192), (1, 16, 64), True),
    ],
)
def test_ttft_and_throughput_rise_with_concurrency(
    profile: str, model: str, budget: tuple[int, int], users: tuple[int, ...], burst: bool
) -> None:
    seqs, tokens = budget
    blocks = L.BLOCKS_H100_8B if profile == "h100-sxm" else L.BLOCKS_48G_8B
    pts = [
        L.measure(
            P.PROFILES[profile],
            L.MODELS[model],
            L.Workload(u, 1024, 128, seqs, tokens, blocks, duration=120, warmup=20, burst=burst),
        )
        for u in users
    ]
    assert pts[0].output_tps < pts[1].output_tps < pts[2].output_tps
    assert pts[0].ttft_mean < pts[1].ttft_mean < pts[2].ttft_mean
    assert pts[0].per_user_tps > pts[2].per_user_tps  # each user's stream slows down


def test_unknown_profile_is_a_clear_error_at_start(tmp_path) -> None:
    import os
    import subprocess
    import sys

    for argv, env, src in (
        (["--sim-profile", "a100"], {}, "--sim-profile"),
        ([], {"VLLM_SIM_PROFILE": "tpu"}, "VLLM_SIM_PROFILE"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "clusterctl.lab.vllm_sim", "serve", str(tmp_path), *argv],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2
        assert f"vllm serve: error: {src}: unknown simulator profile" in r.stderr
        assert "known: cpu-1core, h100-sxm, l40s-48g" in r.stderr and "Traceback" not in r.stderr
