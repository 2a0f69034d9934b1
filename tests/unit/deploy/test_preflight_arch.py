"""The KV arithmetic by architecture, on published models' real config.json fields
(tests/fixtures/deploy/configs/README.md for where each comes from), against what vLLM itself
logged for them and against vLLM's own formulas (vllm/v1/kv_cache_interface.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


from clusterctl.deploy.preflight import memory as M
from clusterctl.deploy.preflight.checks import check_instances
from clusterctl.diagnose.findings import Severity
from unit.deploy.preflight_helpers import H100_TOTAL, host, instance, inventory

CONFIGS = Path(__file__).resolve().parents[2] / "fixtures" / "deploy" / "configs"


def config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def budget(shape: M.ModelShape, tp: int, mml: int, batched: int = 8192, avail: int = 10 * M.GiB) -> M.Budget:
    s = M.Settings(
        util=0.9, max_model_len=mml, max_num_seqs=256, max_num_batched_tokens=batched, kv_cache_memory_bytes=avail
    )
    return M.predict(shape, M.WeightSizes(), s, [H100_TOTAL] * tp, M.rules_for("0.11.0"))


def test_gpt_oss_sliding_layers_need_what_vllm_logged():
    # vllm#27508 (vLLM 0.11, H100, --max-num-batched-tokens 1024): "(4.54 GiB KV cache is needed"
    shape = M.ModelShape.from_config(config("gpt-oss-120b"))
    assert (shape.attention_full, shape.sliding_layers, shape.sliding_window) == (18, 18, 128)
    b = budget(shape, 1, 131072, batched=1024)
    # full: 18 x 131072 x (2 x 8 x 64 x 2); sliding: 18 x (cdiv(min(127 + 1024, 131072), 16) + 1) x 16 x 2048
    assert b.needed_kv == 18 * 131072 * 2048 + 18 * 73 * 16 * 2048
    assert round(M.gib(b.needed_kv), 2) == 4.54
    # every layer as full attention (the old arithmetic) would have asked for 9 GiB
    assert round(M.gib(36 * 131072 * 2048), 2) == 9.0
    # vLLM's hybrid manager: 2 groups of 18 layers; blocks = memory // (page x 18), logged tokens / 2 groups
    assert b.groups() == (18, 2)
    blocks = 10 * M.GiB // (16 * 2048 * 18)
    assert b.ranks[0].num_blocks == blocks and b.kv_tokens == blocks // 2 * 16
    # and the longest length 1.71 GiB holds, as vLLM estimates it (binary search on the same sum)
    est = b.max_len_for(int(1.71 * M.GiB))
    assert b.kv_need(est) <= 1.71 * M.GiB < b.kv_need(est + 16)


def test_mla_is_one_latent_vector_per_token_replicated_on_every_rank():
    # vllm#15871 (DeepSeek-V2-Lite-Chat, max seq len 32768): "(0.95 GiB KV cache is needed"
    shape = M.ModelShape.from_config(config("deepseek-v2-lite-chat"))
    assert shape.mla_dim == 512 + 64
    b1, b2 = budget(shape, 1, 32768), budget(shape, 2, 32768)
    assert b1.kv_bytes_per_token == 27 * 576 * 2 == b2.kv_bytes_per_token  # MLAAttentionSpec: no K/V pair, no TP split
    assert round(M.gib(b1.needed_kv), 2) == 0.95
    # 2 x kv_heads x head_dim per layer (the old arithmetic) asked for 7.1x too much
    assert round(2 * 27 * 16 * 128 * 2 / b1.kv_bytes_per_token, 1) == 7.1


def test_hybrid_linear_attention_counts_kv_only_on_full_layers_and_a_fixed_state():
    shape = M.ModelShape.from_config(config("qwen3-next-80b-a3b-instruct"))
    assert (shape.attention_full, shape.linear_layers) == (12, 36)
    b = budget(shape, 4, 32768)
    # 12 full layers x 2 x max(1, 2 KV heads / TP 4) x 256 x 2 bytes
    assert b.kv_bytes_per_token == 12 * 2 * 1 * 256 * 2
    # gated_delta_net_state_shape at TP 4: conv (8192 / 4) x 3, recurrent (32 / 4) x 128 x 128, bf16
    assert b.fixed_bytes == 36 * (2048 * 3 + 8 * 128 * 128) * 2
    # vLLM raises the attention block to hold one layer's state: 16 x ceil(274432 / (16 x 1024)) = 272
    # tokens, and pads each linear layer's state page to that page (272 x 1024 bytes)
    assert b.block_size == 272
    assert b.needed_kv == 12 * M.cdiv(32768, 272) * 272 * 1024 + 36 * 272 * 1024


def qwen3_next_tp2_fp8(avail: int) -> M.Budget:
    # vllm#26646 (vLLM ~0.11): Qwen3-Next-80B-A3B-Instruct int4 AutoRound, TP 2, --kv-cache-dtype fp8,
    # --max-model-len 215040; logged "GPU KV cache size: 90,048 tokens" and
    # "Maximum concurrency for 215,040 tokens per request: 1.66x"
    shape = M.ModelShape.from_config(config("qwen3-next-80b-a3b-instruct"))
    s = M.Settings(
        util=0.9,
        max_model_len=215040,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        kv_cache_dtype="fp8",
        kv_cache_memory_bytes=avail,
    )
    return M.predict(shape, M.WeightSizes(), s, [H100_TOTAL] * 2, M.rules_for("0.11.0"))


# Per rank: full-attention layer 2 x 1 x 256 x 1 = 512 B/token; linear layer state
# conv 8192/2 x 3 x 2 + recurrent 16 x 128 x 128 x 2 = 24576 + 524288 = 548864 B.
# Block 16 x ceil(548864 / (16 x 512)) = 1072; page 548864 B per layer; 12 layers per group.
# The logged 90,048 tokens = num_blocks // 4 groups x 1072 → num_blocks 336..339, and 1.66x =
# num_blocks / ceil((12 x 201 + 36) pages / 12) = num_blocks / 204 → 338 or 339: available
# (derived from the log, not measured) in [338, 340) x 12 x 548864 bytes, about 2.07-2.09 GiB.
GROUP_BYTES = 12 * 548864


def test_hybrid_linear_block_size_and_groups_match_what_vllm_logged():
    lo, hi = 338 * GROUP_BYTES, 340 * GROUP_BYTES
    for avail in (lo, (lo + hi) // 2, hi - 1):
        b = qwen3_next_tp2_fp8(avail)
        assert b.block_size == 1072
        assert b.groups() == (12, 4)  # 1 full-attention group + 3 linear groups
        assert b.kv_tokens == 90048 == 84 * 1072
        assert f"{b.max_concurrency():.2f}" == "1.66"
    # just outside the window the figures move by a whole block per group (tokens stay a multiple of 1072)
    assert qwen3_next_tp2_fp8(336 * GROUP_BYTES - 1).kv_tokens == 83 * 1072
    assert qwen3_next_tp2_fp8(340 * GROUP_BYTES).kv_tokens == 85 * 1072
    # the figures we used to predict (block 16, linear layers outside the groups) were 4x off
    assert qwen3_next_tp2_fp8(lo).kv_tokens != 362336


def test_non_hybrid_models_keep_the_16_token_block_and_their_groups():
    for name, groups in (("gpt-oss-120b", (18, 2)), ("deepseek-v2-lite-chat", (27, 1)), ("gemma-3-27b-it", (10, 7))):
        b = budget(M.ModelShape.from_config(config(name)), 2, 32768)
        assert b.block_size == 16 and b.linear_layers == 0 and b.groups() == groups
        assert b.kv_tokens == b.ranks[0].num_blocks // groups[1] * 16


def test_text_config_of_a_multimodal_model_is_read():
    shape = M.ModelShape.from_config(config("gemma-3-27b-it"))
    assert (shape.layers, shape.heads, shape.kv_heads, shape.head_dim) == (62, 32, 16, 128)
    assert (shape.attention_full, shape.sliding_layers, shape.sliding_window) == (10, 52, 1024)
    assert shape.dtype == "bfloat16" and shape.max_position == 131072 and not shape.notes


def test_moe_activation_width_is_the_experts_a_token_goes_through():
    assert M.ModelShape.from_config(config("gpt-oss-120b")).intermediate == 4 * 2880
    assert M.ModelShape.from_config(config("deepseek-v2-lite-chat")).intermediate == 6 * 1408 + 2 * 1408
    assert M.ModelShape.from_config(config("qwen3-next-80b-a3b-instruct")).intermediate == 10 * 512 + 512


def test_dense_models_are_unchanged():
    cfg = {
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
    }
    shape = M.ModelShape.from_config(cfg)
    assert M.kv_bytes_per_token(shape, 1, 2) == 147_456 and shape.notes == ()


def test_layer_kinds_it_does_not_know_are_counted_as_full_attention_with_a_note():
    cfg = {**config("gpt-oss-120b"), "layer_types": ["chunked_attention", "full_attention"] * 18}
    shape = M.ModelShape.from_config(cfg)
    assert shape.attention_full == 36 and "chunked_attention not understood" in shape.notes[0]


def _doc(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"config": cfg, "weights": {"split_linear": 4 * M.GiB, "vocab": [[151936, 1 << 28], [151936, 1 << 28]]}}


def test_an_architecture_not_understood_is_a_warning_never_a_refusal():
    inv = inventory()
    # a config.json without the fields the arithmetic reads, and no inventory arch to fall back on
    weird = {"model_type": "some_new_arch", "n_layer": 40, "vocab_size": 32000}
    r = check_instances(
        inv, {"q": instance("q", model="qwen3-32b")}, {"gpu01": host({"/models/qwen3-32b": _doc(weird)})}
    ).row("q")
    assert [(p.severity, p.check) for p in r.problems] == [(Severity.WARN, "model.unknown_arch")]
    assert "num_hidden_layers" in r.problems[0].message and r.ok
    odd = {
        **config("gpt-oss-120b"),
        "layer_types": ["chunked_attention", "full_attention"] * 18,
        "quantization_config": None,
    }
    r = check_instances(
        inv,
        {"q": instance("q", model="qwen3-32b", max_model_len=4096)},
        {"gpu01": host({"/models/qwen3-32b": _doc(odd)})},
    ).row("q")
    arch = [p for p in r.problems if p.check == "model.arch"]
    assert [p.severity for p in arch] == [Severity.WARN] and "chunked_attention" in arch[0].message
