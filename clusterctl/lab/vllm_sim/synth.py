"""Synthetic Hugging Face model directories: a real ``config.json`` and valid safetensors.

A safetensors file is an 8-byte little-endian header length, a JSON header
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
padded with spaces to 8 bytes) and the tensor bytes.  Two modes:

* sparse (``sparse=True``): the header is written and the file is extended
  with ``ftruncate`` to its full size, so sizes and headers are exact but no
  data blocks are allocated (a 141 GB Llama-3-70B costs a few KiB of disk);
* real bytes: every tensor is filled with deterministic pseudo-random bytes
  (for staging, hashing and page-cache tests; use the small architectures).

Stdlib only: this module also runs on lab hosts.
"""

from __future__ import annotations

import json
import math
import os
import random
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

#: Bytes per element of each safetensors dtype.
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
TORCH_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
#: Largest shard the generator writes (bytes of tensor data); HF checkpoints use 4-5 GB.
DEFAULT_SHARD_BYTES = 4_000_000_000
QUANTIZATIONS = ("fp8", "awq", "gptq")
AWQ_GROUP = 128
FP8_BLOCK = 128


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer's shape, with Hugging Face config field names in mind."""

    name: str  # the HF repo id it imitates
    model_type: str  # "qwen3" | "llama"
    architecture: str  # "Qwen3ForCausalLM" | "LlamaForCausalLM"
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_position: int
    tied: bool = False
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k
    rope_theta: float = 1_000_000.0
    torch_dtype: str = "bfloat16"

    def config(self, quantization: str | None = None) -> dict[str, Any]:
        """The ``config.json`` document (Hugging Face field names)."""
        cfg: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "max_position_embeddings": self.max_position,
            "rms_norm_eps": 1e-06 if self.model_type == "qwen3" else 1e-05,
            "rope_theta": self.rope_theta,
            "hidden_act": "silu",
            "tie_word_embeddings": self.tied,
            "attention_bias": False,
            "torch_dtype": "float16" if quantization in ("awq", "gptq") else self.torch_dtype,
            "bos_token_id": 151643 if self.model_type == "qwen3" else 128000,
            "eos_token_id": 151645 if self.model_type == "qwen3" else 128001,
            "transformers_version": "4.51.0",
            "use_cache": True,
        }
        if quantization == "fp8":
            cfg["quantization_config"] = {
                "quant_method": "fp8",
                "fmt": "e4m3",
                "activation_scheme": "dynamic",
                "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
            }
        elif quantization == "awq":
            cfg["quantization_config"] = {
                "quant_method": "awq",
                "bits": 4,
                "group_size": AWQ_GROUP,
                "zero_point": True,
                "version": "gemm",
            }
        elif quantization == "gptq":
            cfg["quantization_config"] = {
                "quant_method": "gptq",
                "bits": 4,
                "group_size": AWQ_GROUP,
                "desc_act": False,
                "sym": True,
            }
        return cfg


ARCHS: dict[str, Arch] = {
    a.name.split("/")[-1].lower(): a
    for a in [
        Arch("Qwen/Qwen3-8B", "qwen3", "Qwen3ForCausalLM", 36, 4096, 32, 8, 128, 12288, 151936, 40960, qk_norm=True),
        Arch("Qwen/Qwen3-32B", "qwen3", "Qwen3ForCausalLM", 64, 5120, 64, 8, 128, 25600, 151936, 40960, qk_norm=True),
        Arch(
            "Qwen/Qwen3-0.6B",
            "qwen3",
            "Qwen3ForCausalLM",
            28,
            1024,
            16,
            8,
            128,
            3072,
            151936,
            40960,
            tied=True,
            qk_norm=True,
        ),
        Arch(
            "meta-llama/Meta-Llama-3-70B-Instruct",
            "llama",
            "LlamaForCausalLM",
            80,
            8192,
            64,
            8,
            128,
            28672,
            128256,
            8192,
            rope_theta=500000.0,
        ),
        Arch(
            "meta-llama/Meta-Llama-3-8B-Instruct",
            "llama",
            "LlamaForCausalLM",
            32,
            4096,
            32,
            8,
            128,
            14336,
            128256,
            8192,
            rope_theta=500000.0,
        ),
        # Small ones with real bytes (a few MiB): staging, hashing, page-cache tests.
        Arch("clusterctl/tiny-qwen3", "qwen3", "Qwen3ForCausalLM", 2, 256, 4, 2, 64, 512, 4096, 4096, qk_norm=True),
        Arch(
            "clusterctl/small-llama",
            "llama",
            "LlamaForCausalLM",
            4,
            512,
            8,
            4,
            64,
            1536,
            8192,
            8192,
            rope_theta=500000.0,
        ),
    ]
}
ALIASES = {
    "llama-3-70b": "meta-llama-3-70b-instruct",
    "llama-3-8b": "meta-llama-3-8b-instruct",
    "tiny": "tiny-qwen3",
    "small": "small-llama",
}


def arch(name: str) -> Arch:
    """The architecture called ``name`` (case-insensitive, HF id or short name).

    Raises ``KeyError`` with the known names.
    """
    key = name.split("/")[-1].lower()
    key = ALIASES.get(key, key)
    if key not in ARCHS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(ARCHS))}")
    return ARCHS[key]


def _linear(name: str, out_f: int, in_f: int, dt: str, quant: str | None) -> list[tuple[str, str, list[int]]]:
    if quant is None:
        return [(f"{name}.weight", dt, [out_f, in_f])]
    if quant == "fp8":
        return [
            (f"{name}.weight", "F8_E4M3", [out_f, in_f]),
            (f"{name}.weight_scale_inv", "F32", [math.ceil(out_f / FP8_BLOCK), math.ceil(in_f / FP8_BLOCK)]),
        ]
    groups = max(1, in_f // AWQ_GROUP)
    if quant == "awq":
        return [
            (f"{name}.qweight", "I32", [in_f, out_f // 8]),
            (f"{name}.qzeros", "I32", [groups, out_f // 8]),
            (f"{name}.scales", "F16", [groups, out_f]),
        ]
    if quant == "gptq":
        return [
            (f"{name}.qweight", "I32", [in_f // 8, out_f]),
            (f"{name}.qzeros", "I32", [groups, out_f // 8]),
            (f"{name}.scales", "F16", [groups, out_f]),
            (f"{name}.g_idx", "I32", [in_f]),
        ]
    raise ValueError(f"unknown quantization {quant!r}; known: {', '.join(QUANTIZATIONS)}")


def tensors(a: Arch, quantization: str | None = None) -> list[tuple[str, str, list[int]]]:
    """Every tensor of the checkpoint as ``(name, safetensors dtype, shape)``, in file order."""
    dt = "F16" if quantization in ("awq", "gptq") else TORCH_DTYPES[a.torch_dtype]
    out = [("model.embed_tokens.weight", dt, [a.vocab, a.hidden])]
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    for i in range(a.layers):
        p = f"model.layers.{i}"
        out.append((f"{p}.input_layernorm.weight", dt, [a.hidden]))
        for proj, o, n in (
            ("q_proj", q, a.hidden),
            ("k_proj", kv, a.hidden),
            ("v_proj", kv, a.hidden),
            ("o_proj", a.hidden, q),
        ):
            out += _linear(f"{p}.self_attn.{proj}", o, n, dt, quantization)
        if a.qk_norm:
            out += [
                (f"{p}.self_attn.q_norm.weight", dt, [a.head_dim]),
                (f"{p}.self_attn.k_norm.weight", dt, [a.head_dim]),
            ]
        out.append((f"{p}.post_attention_layernorm.weight", dt, [a.hidden]))
        for proj, o, n in (
            ("gate_proj", a.intermediate, a.hidden),
            ("up_proj", a.intermediate, a.hidden),
            ("down_proj", a.hidden, a.intermediate),
        ):
            out += _linear(f"{p}.mlp.{proj}", o, n, dt, quantization)
    out.append(("model.norm.weight", dt, [a.hidden]))
    if not a.tied:
        out.append(("lm_head.weight", dt, [a.vocab, a.hidden]))
    return out


def nbytes(dtype: str, shape: list[int]) -> int:
    return DTYPE_BYTES[dtype] * math.prod(shape)


def param_count(a: Arch) -> int:
    """Parameters of the unquantized model (tied embeddings counted once)."""
    return sum(math.prod(s) for _n, _d, s in tensors(a))


def _shards(ts: list[tuple[str, str, list[int]]], limit: int) -> list[list[tuple[str, str, list[int]]]]:
    shards: list[list[tuple[str, str, list[int]]]] = [[]]
    size = 0
    for t in ts:
        b = nbytes(t[1], t[2])
        if shards[-1] and size + b > limit:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += b
    return shards


def _header(entries: list[tuple[str, str, list[int]]]) -> tuple[bytes, int]:
    hdr: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, dt, shape in entries:
        end = off + nbytes(dt, shape)
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, end]}
        off = end
    raw = json.dumps(hdr, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, off


def _fill(f: Any, n: int, rng: random.Random) -> None:
    chunk = 1 << 20
    while n > 0:
        k = min(chunk, n)
        f.write(rng.randbytes(k))
        n -= k


def write_model(
    name: str,
    out_dir: Path,
    *,
    sparse: bool = False,
    quantization: str | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    seed: int = 0,
) -> dict[str, Any]:
    """Write model ``name`` into ``out_dir`` (created); return a summary.

    Files: ``config.json``, ``generation_config.json``, ``model-0000i-of-0000n.safetensors``
    and ``model.safetensors.index.json`` (``metadata.total_size`` = tensor bytes).  Each
    file is written under a temporary name and renamed, so a half-written model never
    looks complete.  Summary: ``{"name", "params", "total_bytes", "files", "sparse"}``.
    Raises ``KeyError`` (unknown model) or ``ValueError`` (unknown quantization).
    """
    a = arch(name)
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; known: {', '.join(QUANTIZATIONS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = _shards(tensors(a, quantization), shard_bytes)
    n = len(shards)
    weight_map: dict[str, str] = {}
    total = 0
    rng = random.Random(f"{a.name}/{quantization}/{seed}")
    files = []
    for i, entries in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors" if n > 1 else "model.safetensors"
        hdr, data = _header(entries)
        tmp = out_dir / f".{fname}.tmp"
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(hdr)))
            f.write(hdr)
            if sparse:
                f.truncate(8 + len(hdr) + data)
            else:
                _fill(f, data, rng)
        os.replace(tmp, out_dir / fname)
        files.append(fname)
        total += data
        weight_map.update({e[0]: fname for e in entries})
    docs = {
        "config.json": a.config(quantization),
        "generation_config.json": {
            "bos_token_id": a.config()["bos_token_id"],
            "eos_token_id": a.config()["eos_token_id"],
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
        },
    }
    if n > 1:
        docs["model.safetensors.index.json"] = {"metadata": {"total_size": total}, "weight_map": weight_map}
    for fname, doc in docs.items():
        tmp = out_dir / f".{fname}.tmp"
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, out_dir / fname)
    return {
        "name": a.name,
        "params": param_count(a),
        "total_bytes": total,
        "files": files,
        "sparse": sparse,
        "quantization": quantization,
    }


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (without ``__metadata__``).

    Raises ``ValueError`` naming the file when it is not a valid safetensors
    file: a header length beyond the file, bad JSON, offsets out of order or
    past the end.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > min(size - 8, 100_000_000):
            raise ValueError(f"{path}: safetensors header length {hlen} exceeds the file")
        try:
            hdr = json.loads(f.read(hlen))
        except ValueError as e:
            raise ValueError(f"{path}: safetensors header is not JSON: {e}") from None
    hdr.pop("__metadata__", None)
    data = size - 8 - hlen
    if not isinstance(hdr, dict):
        raise ValueError(f"{path}: safetensors header is not a JSON object")
    for name, t in hdr.items():
        try:
            begin, end = t["data_offsets"]
            ok = t["dtype"] in DTYPE_BYTES and end - begin == nbytes(t["dtype"], t["shape"]) and end <= data
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"{path}: tensor {name}: dtype/shape/offsets inconsistent with the file")
    return hdr


def iter_tensors(model_dir: Path) -> Iterator[tuple[str, str, list[int]]]:
    """Every tensor of every ``*.safetensors`` file in ``model_dir`` (sorted by file)."""
    for p in sorted(Path(model_dir).glob("*.safetensors")):
        for name, t in read_header(p).items():
            yield name, t["dtype"], list(t["shape"])
