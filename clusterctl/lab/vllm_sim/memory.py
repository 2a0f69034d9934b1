"""vLLM's GPU memory arithmetic (research vllm.md §4), per tensor-parallel rank.

All sizes are bytes unless a name says GiB.  Per rank (one GPU)::

    requested    = total * gpu_memory_utilization          (0.33: ceil)
    check        : free_at_start < requested  -> StartupMemoryError
    weights      = safetensors bytes, sharded / TP (norms replicated,
                   embed_tokens/lm_head vocab-parallel: vocab padded to 64,
                   k/v projections replicated when TP > kv heads)
    activation   = peak of the dummy forward at max_num_batched_tokens
                   (+ the sampler's fp32 logits for max_num_seqs rows)
    non_torch    = NON_TORCH_BASE (+ NCCL/custom all-reduce buffers when TP > 1)
    graphs       = CUDA-graph pool (0 with enforce_eager)
    available_kv = requested - weights - activation - non_torch   (0.11; graphs
                   come on top, outside the budget)
                 = requested - weights - activation - non_torch - graphs  (0.33)
    page         = 2 * block_size * kv_heads_per_rank * head_dim * kv_dtype_bytes  (per layer)
    blocks       = available_kv // page // layers;  tokens = blocks * block_size
    concurrency  = blocks / cdiv(max_model_len, block_size)

The activation and non-torch constants are a model fitted to the two 0.11
samples (Qwen3-8B TP1 at 0.25 -> 2.87 GiB KV; Qwen3-32B TP2 at 0.9 -> 37.97 GiB
KV on 80 GB GPUs); see docs/vllm-simulator.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

GiB = 1 << 30
MiB = 1 << 20
BLOCK_SIZE = 16
VOCAB_PADDING = 64
#: Non-torch memory a worker adds while profiling (cuBLAS workspace, attention buffers).
NON_TORCH_BASE = int(0.1765 * GiB)
#: Extra non-torch memory of a TP > 1 worker (NCCL and custom all-reduce buffers).
NCCL_OVERHEAD = int(0.9476 * GiB)
#: Rank 0 keeps a little more (the custom all-reduce's IPC handles); other ranks this much less.
RANK0_EXTRA = int(0.07 * GiB)
#: CUDA-graph pool of a 64-layer model on 80 GB GPUs (0.85 GiB in the 0.11 sample); scaled by layers.
GRAPH_BYTES_PER_LAYER = int(0.85 * GiB / 64)
#: CUDA context created before the startup check (counted by NVML, not by the budget).
CUDA_CONTEXT_BYTES = 512 * MiB

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
KV_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gib(x: float) -> float:
    return x / GiB


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs from ``config.json``."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_position: int
    torch_dtype: str
    architecture: str

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> "ModelShape":
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return cls(
            layers=int(cfg["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            max_position=int(cfg.get("max_position_embeddings", 2048)),
            torch_dtype=str(cfg.get("torch_dtype", "bfloat16")),
            architecture=(cfg.get("architectures") or ["LlamaForCausalLM"])[0],
        )


def kv_heads_per_rank(m: ModelShape, tp: int) -> int:
    """KV heads one rank holds: replicated (1 each) when TP exceeds the KV heads."""
    return max(1, m.kv_heads // tp)


def kv_bytes_per_token(m: ModelShape, tp: int = 1, kv_dtype_bytes: int = 2) -> int:
    """K and V bytes of one token over all layers on one rank (Qwen3-8B bf16 TP1: 147456)."""
    return 2 * m.layers * kv_heads_per_rank(m, tp) * m.head_dim * kv_dtype_bytes


def page_size(m: ModelShape, tp: int, kv_dtype_bytes: int, block_size: int = BLOCK_SIZE) -> int:
    """One KV block of one layer on one rank."""
    return 2 * block_size * kv_heads_per_rank(m, tp) * m.head_dim * kv_dtype_bytes


def _tensor_bytes_per_rank(name: str, nbytes: int, shape: list[int], m: ModelShape, tp: int) -> int:
    if tp == 1 or not shape or "norm" in name:
        return nbytes
    if "embed_tokens" in name or name.startswith("lm_head"):
        rows = shape[0]
        padded = cdiv(rows, VOCAB_PADDING) * VOCAB_PADDING
        return nbytes // rows * cdiv(padded, tp)
    if ".k_proj." in name or ".v_proj." in name:
        return nbytes * kv_heads_per_rank(m, tp) // m.kv_heads
    return cdiv(nbytes, tp)


def weights_per_rank(tensors: Iterable[tuple[str, int, list[int]]], m: ModelShape, tp: int) -> list[int]:
    """Per-rank bytes of each tensor ``(name, nbytes, shape)``, in load order."""
    return [_tensor_bytes_per_rank(n, b, s, m, tp) for n, b, s in tensors]


def activation_peak(m: ModelShape, tp: int, max_num_batched_tokens: int, max_num_seqs: int, dtype_bytes: int) -> int:
    """Peak torch memory of the profiling forward pass beyond the weights.

    One layer's live tensors at ``max_num_batched_tokens`` tokens (the MLP's
    gate/up output and activation, q/k/v, a few hidden-size buffers) plus the
    sampler's fp32 logits for ``max_num_seqs`` rows.
    """
    t = max_num_batched_tokens
    inter = cdiv(m.intermediate, tp)
    qkv = (m.heads // tp + 2 * kv_heads_per_rank(m, tp)) * m.head_dim
    per_token = 3 * inter + qkv + 4 * m.hidden
    logits = min(max_num_seqs, t) * cdiv(m.vocab, tp) * tp * 4
    return t * per_token * dtype_bytes + logits


def non_torch(tp: int, rank: int) -> int:
    """Non-torch memory a rank adds while profiling."""
    if tp == 1:
        return NON_TORCH_BASE
    return NON_TORCH_BASE + NCCL_OVERHEAD + (RANK0_EXTRA if rank == 0 else 0)


def graph_memory(m: ModelShape, enforce_eager: bool) -> int:
    """CUDA-graph memory (0 with ``--enforce-eager``)."""
    return 0 if enforce_eager else GRAPH_BYTES_PER_LAYER * m.layers


def estimate_max_model_len(available: int, per_token: int, block_size: int = BLOCK_SIZE) -> int:
    """Largest length whose blocks fit in ``available`` (vLLM's binary search)."""
    blocks = available // (per_token * block_size) if per_token else 0
    return blocks * block_size


@dataclass
class RankPlan:
    """One rank's numbers (bytes)."""

    rank: int
    gpu: int
    total: int
    free: int
    requested: int
    weights: int
    activation: int
    non_torch: int
    graphs: int
    available_kv: int
    num_blocks: int

    @property
    def in_use(self) -> int:
        """What NVML shows for this process once serving (0.11: graphs come on top)."""
        return self.requested + self.graphs


@dataclass
class Plan:
    ranks: list[RankPlan] = field(default_factory=list)
    kv_per_token: int = 0
    block_size: int = BLOCK_SIZE

    @property
    def num_blocks(self) -> int:
        return min(r.num_blocks for r in self.ranks)

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def max_concurrency(self, max_model_len: int) -> float:
        return self.num_blocks / cdiv(max_model_len, self.block_size)


def requested_bytes(total: int, util: float, version: str) -> int:
    return math.ceil(total * util) if version == "0.33" else int(total * util)


def available_kv(requested: int, weights: int, activation: int, nt: int, graphs: int, version: str) -> int:
    avail = requested - weights - activation - nt
    return avail - graphs if version == "0.33" else avail
