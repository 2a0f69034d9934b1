"""vLLM's memory arithmetic against the research's worked numbers (vllm.md §4.3) and the samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.lab.vllm_sim import memory as M
from clusterctl.lab.vllm_sim import synth

H100_TOTAL = (81559 - 512) * M.MiB  # the lab's H100 profile as CUDA sees it (total - reserved)


def shape(name: str) -> M.ModelShape:
    return M.ModelShape.from_config(synth.arch(name).config())


def weights(model_dir: Path, tp: int) -> int:
    m = M.ModelShape.from_config(__import__("json").loads((model_dir / "config.json").read_text()))
    ts = [(n, synth.nbytes(d, s), s) for n, d, s in synth.iter_tensors(model_dir)]
    return sum(M.weights_per_rank(ts, m, tp))


@pytest.mark.parametrize("name,per_token", [("qwen3-8b", 147_456), ("qwen3-32b", 262_144), ("llama-3-70b", 327_680)])
def test_kv_bytes_per_token_bf16(name: str, per_token: int) -> None:
    m = shape(name)
    assert M.kv_bytes_per_token(m, 1, 2) == per_token
    assert M.kv_bytes_per_token(m, 2, 2) == per_token // 2
    assert M.kv_bytes_per_token(m, 8, 2) == per_token // 8
    assert M.kv_bytes_per_token(m, 1, 1) == per_token // 2  # fp8 KV halves it


def test_kv_heads_are_replicated_when_tp_exceeds_them() -> None:
    m = shape("qwen3-8b")  # 8 KV heads
    assert M.kv_bytes_per_token(m, 16, 2) == M.kv_bytes_per_token(m, 8, 2)


def test_qwen3_8b_full_context_needs_5_62_gib() -> None:
    assert round(40960 * M.kv_bytes_per_token(shape("qwen3-8b")) / M.GiB, 2) == 5.62


def test_weights_from_safetensors_headers(models: dict[str, Path]) -> None:
    assert round(weights(models["llama-3-70b"], 1) / M.GiB, 1) == 131.4
    assert round(weights(models["qwen3-8b"], 1) / M.GiB, 2) == 15.26
    # The sample's "Model loading took 30.5172 GiB" for Qwen3-32B at TP=2.
    assert round(weights(models["qwen3-32b"], 2) / M.GiB, 2) == 30.51


def test_tp_shards_weights_but_not_norms_and_pads_the_vocabulary() -> None:
    m = shape("qwen3-8b")
    assert M.weights_per_rank([("model.norm.weight", 8192, [4096])], m, 4) == [8192]
    emb = 151936 * 4096 * 2
    # vocab padded to a multiple of 64 (151936 already is), split over 3 ranks rounding up
    assert M.weights_per_rank([("model.embed_tokens.weight", emb, [151936, 4096])], m, 3) == [
        M.cdiv(151936, 3) * 4096 * 2
    ]
    assert M.weights_per_rank([("model.layers.0.mlp.up_proj.weight", 100, [10, 5])], m, 2) == [50]


def _plan(name: str, tp: int, util: float, version: str = "0.11", rank: int = 0) -> tuple[int, int]:
    m = shape(name)
    ts = [(n, synth.nbytes(d, s), s) for n, d, s in synth.tensors(synth.arch(name))]
    w = sum(M.weights_per_rank(ts, m, tp))
    req = M.requested_bytes(H100_TOTAL, util, version)
    act = M.activation_peak(m, tp, 8192, 1024, 2)
    avail = M.available_kv(req, w, act, M.non_torch(tp, rank), 0, version)
    return avail, avail // (M.page_size(m, tp, 2) * m.layers)


def test_qwen3_8b_at_quarter_utilisation_reproduces_the_failure_sample() -> None:
    avail, _blocks = _plan("qwen3-8b", 1, 0.25)
    assert f"{avail / M.GiB:.2f}" == "2.87"
    assert M.estimate_max_model_len(avail, 147_456) == 20880


def test_qwen3_32b_tp2_reproduces_the_success_sample() -> None:
    avail0, blocks0 = _plan("qwen3-32b", 2, 0.9, rank=0)
    avail1, blocks1 = _plan("qwen3-32b", 2, 0.9, rank=1)
    assert (f"{avail0 / M.GiB:.2f}", f"{avail1 / M.GiB:.2f}") == ("37.97", "38.04")
    assert (blocks0 * 16, blocks1 * 16) == (311_040, 311_616)
    assert f"{blocks0 / M.cdiv(32768, 16):.2f}" == "9.49"


def test_graphs_are_inside_the_budget_only_in_0_33() -> None:
    m = shape("qwen3-8b")
    g = M.graph_memory(m, enforce_eager=False)
    assert g > 0 and M.graph_memory(m, enforce_eager=True) == 0
    assert M.available_kv(100, 10, 10, 10, g, "0.11") == 70
    assert M.available_kv(100, 10, 10, 10, g, "0.33") == 70 - g


def test_activation_grows_with_max_num_batched_tokens() -> None:
    m = shape("qwen3-8b")
    assert (
        M.activation_peak(m, 1, 16384, 1024, 2)
        > M.activation_peak(m, 1, 8192, 1024, 2)
        > M.activation_peak(m, 1, 2048, 1024, 2)
    )
