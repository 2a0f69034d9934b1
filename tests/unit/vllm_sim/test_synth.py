"""Synthetic models: real config.json field names, valid safetensors, sparse and real-byte modes."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

from clusterctl.lab.vllm_sim import synth


@pytest.mark.parametrize(
    "name,params", [("Qwen3-8B", 8_190_735_360), ("Qwen3-32B", 32_762_123_264), ("Llama-3-70B", 70_553_706_496)]
)
def test_parameter_counts_match_the_published_models(name: str, params: int) -> None:
    assert synth.param_count(synth.arch(name)) == params


def test_sparse_model_has_exact_sizes_and_no_data_blocks(models: dict[str, Path]) -> None:
    d = models["llama-3-70b"]
    index = json.loads((d / "model.safetensors.index.json").read_text())
    files = sorted(d.glob("*.safetensors"))
    assert index["metadata"]["total_size"] == 70_553_706_496 * 2
    assert set(index["weight_map"].values()) == {f.name for f in files}
    apparent = sum(f.stat().st_size for f in files)
    allocated = sum(f.stat().st_blocks * 512 for f in files)
    assert apparent > 141e9 and allocated < 50e6
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 80 and cfg["num_key_value_heads"] == 8
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["torch_dtype"] == "bfloat16"


def test_header_is_valid_safetensors(models: dict[str, Path]) -> None:
    f = sorted(models["qwen3-8b"].glob("*.safetensors"))[0]
    with open(f, "rb") as fh:
        (hlen,) = struct.unpack("<Q", fh.read(8))
    assert hlen % 8 == 0
    hdr = synth.read_header(f)
    first = hdr["model.embed_tokens.weight"]
    assert first == {"dtype": "BF16", "shape": [151936, 4096], "data_offsets": [0, 151936 * 4096 * 2]}
    assert f.stat().st_size == 8 + hlen + max(t["data_offsets"][1] for t in hdr.values())


def test_real_byte_model_is_deterministic_and_filled(tmp_path: Path) -> None:
    a = synth.write_model("tiny", tmp_path / "a")
    synth.write_model("tiny", tmp_path / "b")
    fa, fb = tmp_path / "a/model.safetensors", tmp_path / "b/model.safetensors"
    assert hashlib.sha256(fa.read_bytes()).digest() == hashlib.sha256(fb.read_bytes()).digest()
    assert fa.stat().st_blocks * 512 >= a["total_bytes"]
    assert fa.read_bytes()[-4096:] != bytes(4096)
    assert not list(tmp_path.glob("a/.*"))  # no temp files left behind


def test_quantized_models_are_smaller_and_declare_their_method(tmp_path: Path) -> None:
    full = synth.write_model("qwen3-8b", tmp_path / "bf16", sparse=True)["total_bytes"]
    awq = synth.write_model("qwen3-8b", tmp_path / "awq", sparse=True, quantization="awq")
    fp8 = synth.write_model("qwen3-8b", tmp_path / "fp8", sparse=True, quantization="fp8")
    assert 0.25 * full < awq["total_bytes"] < 0.4 * full  # 4-bit linears, fp16 embeddings
    assert 0.5 * full < fp8["total_bytes"] < 0.6 * full
    cfg = json.loads((tmp_path / "awq/config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "awq" and cfg["torch_dtype"] == "float16"
    dtypes = {t[1] for t in synth.iter_tensors(tmp_path / "fp8")}
    assert dtypes == {"BF16", "F8_E4M3", "F32"}


def test_corrupt_header_is_reported_with_the_file(tmp_path: Path) -> None:
    synth.write_model("tiny", tmp_path / "m")
    f = tmp_path / "m/model.safetensors"
    with open(f, "r+b") as fh:
        fh.write(struct.pack("<Q", 10**12))
    with pytest.raises(ValueError, match=f"{f}: safetensors header length"):
        synth.read_header(f)
    os.truncate(f, 4)
    with pytest.raises(ValueError, match="shorter than 8 bytes"):
        synth.read_header(f)


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="qwen3-8b"):
        synth.arch("gpt-5")
