"""Predict vLLM's GPU memory budget for one instance, per tensor-parallel rank.

This is deploy's own prediction of what vLLM will compute at start-up
(research ``vllm.md`` §4; ``docs/vllm-simulator.md`` "Memory arithmetic"), so
an instance that cannot fit is refused before it is started.  All sizes are
bytes.  Per rank (one GPU)::

    requested    = cuda_total x gpu_memory_utilization        (>= 0.33: ceil)
    weights      = safetensors tensor bytes sharded by TP (norms replicated,
                   embed_tokens/lm_head vocab-parallel with the vocab padded to
                   64, k/v projections max(1, kv/TP) heads, the rest / TP);
                   online --quantization fp8 halves the linear weights
    activation   = T x (3*I/TP + (Hq/TP + 2*kv/TP)*d + 4*hidden) x dtype_bytes
                   + min(max_num_seqs, T) x vocab x 4        (T = max_num_batched_tokens)
    non_torch    = 0.1765 GiB (+0.9476 GiB NCCL / custom all-reduce when TP > 1,
                   +0.07 GiB on rank 0)
    graphs       = 0.85 GiB x layers / 64 (0 with --enforce-eager)
    available_kv = requested - weights - activation - non_torch          (< 0.21)
                 = requested - weights - activation - non_torch - graphs (>= 0.21,
                   CUDA-graph memory profiled into the budget)
                 = --kv-cache-memory-bytes when given
    per_token    = 2 x layers x max(1, kv/TP) x head_dim x kv_dtype_bytes   (full attention;
                   MLA, sliding-window and linear layers: ModelShape, docs/deploy-preflight.md)
    blocks       = available_kv // (per_token x 16);  kv_tokens = blocks x 16
                   (sliding + full layers: vLLM's groups, Budget.kv_tokens; linear /
                   mamba layers: the block raised to hold a layer's state, hybrid_block_size)
    needed       = cdiv(max_model_len, 16) x 16 x per_token   (Budget.kv_need)

The activation, non-torch and graph constants are a model fitted to vLLM
0.11's logged numbers (Qwen3-8B TP1 and Qwen3-32B TP2 on H100); the rest is
vLLM's formula.  :data:`MARGIN_BYTES` is what the pre-flight verdict keeps in
hand on top of the prediction to absorb its error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

GiB = 1 << 30
MiB = 1 << 20
BLOCK_SIZE = 16
VOCAB_PADDING = 64
#: Non-torch memory a worker adds while profiling (cuBLAS workspace, attention buffers).
NON_TORCH_BASE = int(0.1765 * GiB)
#: Extra non-torch memory of a TP > 1 worker (NCCL and custom all-reduce buffers).
NCCL_OVERHEAD = int(0.9476 * GiB)
#: Rank 0 keeps a little more (the custom all-reduce's IPC handles).
RANK0_EXTRA = int(0.07 * GiB)
#: CUDA-graph pool per layer (0.85 GiB for a 64-layer model in the 0.11 sample).
GRAPH_BYTES_PER_LAYER = int(0.85 * GiB / 64)
#: The CUDA context each process creates, outside the budget but seen by NVML.
CUDA_CONTEXT_BYTES = 512 * MiB
#: Safety margin per GPU the verdict keeps beyond the predicted KV need.
MARGIN_BYTES = 512 * MiB

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
KV_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gib(n: float) -> float:
    return n / GiB


#: ``layer_types`` entries (HF configs) and how vLLM caches them.
FULL_TYPES = frozenset({"full_attention", "attention", "global_attention"})
SLIDING_TYPES = frozenset({"sliding_attention", "sliding_window_attention", "local_attention"})
LINEAR_TYPES = frozenset({"linear_attention", "mamba", "mamba2", "gated_deltanet", "ssm"})


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs from a model's ``config.json`` (HF field names).

    The KV cache by layer kind (docs/deploy-preflight.md "KV cache by
    architecture", after vLLM's ``vllm/v1/kv_cache_interface.py``):

    - full attention: ``2 x kv_heads/TP x head_dim`` elements per token and layer;
    - multi-head latent attention (``mla_dim`` = ``kv_lora_rank + qk_rope_head_dim``):
      one compressed vector per token and layer, the same on every TP rank;
    - sliding-window layers (``sliding_layers``, ``sliding_window``): as full
      attention, but a request holds at most ``window - 1 + max_num_batched_tokens``
      tokens (+1 block);
    - linear-attention / mamba layers (``linear_layers``): no KV, a fixed state of
      ``linear_state_elems`` elements per layer and request (split by TP).

    ``full_layers`` None means every layer not sliding or linear.  ``notes``
    are what was not understood (the pre-flight reports them as WARN).
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_position: int
    dtype: str = "bfloat16"
    quantization: str | None = None
    full_layers: int | None = None
    sliding_layers: int = 0
    sliding_window: int = 0
    linear_layers: int = 0
    linear_state_elems: int = 0
    linear_ssm_elems: int = 0
    ssm_dtype_bytes: int = 0
    mla_dim: int = 0
    notes: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "ModelShape":
        """Read ``config.json``; raises ``KeyError``/``ValueError`` naming a missing field.

        Multimodal configs nest the language model under ``text_config``
        (Gemma 3, Llama 4, Mistral 3): read from there, the dtype and the
        quantization from the top when the text part does not say.
        """
        text = cfg.get("text_config")
        if isinstance(text, Mapping) and "num_hidden_layers" not in cfg:
            cfg = {
                **text,
                **{k: cfg[k] for k in ("torch_dtype", "dtype", "quantization_config") if k in cfg and k not in text},
            }
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        quant = cfg.get("quantization_config") or {}
        notes: list[str] = []
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        mla_dim = 0
        if cfg.get("kv_lora_rank"):
            mla_dim = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
            head_dim = int(cfg.get("qk_nope_head_dim") or 0) + int(cfg.get("qk_rope_head_dim") or 0) or head_dim
            kv_heads = heads  # the prefill expands the latent into per-head K and V
        full, sliding, linear, window = _layer_kinds(cfg, layers, notes)
        conv, ssm = _linear_state_elems(cfg, notes) if linear else (0, 0)
        return cls(
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=_mlp_width(cfg),
            vocab=int(cfg["vocab_size"]),
            max_position=int(cfg.get("max_position_embeddings") or 2048),
            dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
            quantization=quant.get("quant_method") if isinstance(quant, Mapping) else None,
            full_layers=full,
            sliding_layers=sliding,
            sliding_window=window,
            linear_layers=linear,
            linear_state_elems=conv,
            linear_ssm_elems=ssm,
            ssm_dtype_bytes=DTYPE_BYTES.get(str(cfg.get("mamba_ssm_dtype") or ""), 0),
            mla_dim=mla_dim,
            notes=tuple(notes),
        )

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads one rank holds (replicated, one each, when TP exceeds them)."""
        return max(1, self.kv_heads // tp)

    @property
    def attention_full(self) -> int:
        """Layers with a full-length KV cache."""
        if self.full_layers is not None:
            return self.full_layers
        return max(0, self.layers - self.sliding_layers - self.linear_layers)

    def layer_kv_bytes_per_token(self, tp: int, kv_dtype_bytes: int) -> int:
        """KV bytes of one token in one attention layer on one rank (MLA: not split by TP)."""
        if self.mla_dim:
            return self.mla_dim * kv_dtype_bytes
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * kv_dtype_bytes

    def state_bytes_per_request(self, tp: int, dtype_bytes: int) -> int:
        """Linear-attention / mamba state of one request on one rank (all such layers): the
        convolution state in the model's dtype, the recurrent state in ``mamba_ssm_dtype``."""
        per_layer = cdiv(self.linear_state_elems, tp) * dtype_bytes + cdiv(self.linear_ssm_elems, tp) * (
            self.ssm_dtype_bytes or dtype_bytes
        )
        return self.linear_layers * per_layer

    def linear_layer_state_bytes(self, tp: int, dtype_bytes: int) -> int:
        """One linear-attention / mamba layer's state per request on one rank (0 when none or unknown)."""
        return self.state_bytes_per_request(tp, dtype_bytes) // self.linear_layers if self.linear_layers else 0


def hybrid_block_size(shape: ModelShape, tp: int, settings: "Settings") -> int:
    """The attention block size vLLM uses (tokens).  With linear-attention / mamba layers every
    layer's page must be the same size, so vLLM raises the attention block until one layer's page
    of it holds one layer's state, in multiples of the kernel alignment (16; 64 with MLA):
    ``align x ceil(state / (align x bytes per token and layer))``, never below ``--block-size``
    (vLLM's ``HybridAttentionMambaModelConfig.verify_and_update_config``)."""
    state = shape.linear_layer_state_bytes(tp, settings.dtype_bytes)
    per_token = shape.layer_kv_bytes_per_token(tp, settings.kv_dtype_bytes)
    if not state or not per_token:
        return settings.block_size
    align = 64 if shape.mla_dim else 16
    return max(settings.block_size, align * cdiv(state, align * per_token))


def _layer_kinds(cfg: Mapping[str, Any], layers: int, notes: list[str]) -> tuple[int | None, int, int, int]:
    """``(full, sliding, linear, window)`` layer counts from ``layer_types``, Gemma 3's
    ``sliding_window_pattern`` or Qwen3-Next's ``full_attention_interval``."""
    window = int(cfg.get("sliding_window") or 0) if cfg.get("use_sliding_window") is not False else 0
    kinds = cfg.get("layer_types")
    if isinstance(kinds, list) and kinds:
        full = sum(1 for k in kinds if k in FULL_TYPES)
        sliding = sum(1 for k in kinds if k in SLIDING_TYPES)
        linear = sum(1 for k in kinds if k in LINEAR_TYPES)
        other = sorted({str(k) for k in kinds} - FULL_TYPES - SLIDING_TYPES - LINEAR_TYPES)
        if other:
            notes.append(f"layer_types {', '.join(other)} not understood: counted as full attention")
            full += len(kinds) - full - sliding - linear
        if sliding and not window:
            notes.append("sliding-window layers without sliding_window: counted as full attention")
            full, sliding = full + sliding, 0
        return full, sliding, linear, window
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1 and window:
        full = layers // pattern
        return full, layers - full, 0, window
    interval = cfg.get("full_attention_interval")
    if isinstance(interval, int) and interval >= 1 and "linear_num_value_heads" in cfg:
        full = layers // interval
        return full, 0, layers - full, 0
    if window:
        notes.append(
            f"sliding_window {window} without layer_types: every layer counted as full attention "
            "(an over-estimate if the model slides on some)"
        )
    return None, 0, 0, 0


def _linear_state_elems(cfg: Mapping[str, Any], notes: list[str]) -> tuple[int, int]:
    """Elements of one gated-DeltaNet layer's state, vLLM's
    ``MambaStateShapeCalculator.gated_delta_net_state_shape`` (Qwen3-Next): the convolution
    state ``(2 x key_dim + value_dim) x (kernel - 1)`` and the recurrent state
    ``value_heads x key_head_dim x value_head_dim``; both split by TP."""
    try:
        kh, kd = int(cfg["linear_num_key_heads"]), int(cfg["linear_key_head_dim"])
        vh, vd = int(cfg["linear_num_value_heads"]), int(cfg["linear_value_head_dim"])
        kernel = int(cfg.get("linear_conv_kernel_dim") or 4)
    except (KeyError, TypeError, ValueError):
        notes.append(
            "linear-attention / mamba layers whose state size the config does not give in "
            "linear_* fields: their state is not counted"
        )
        return 0, 0
    return (2 * kh * kd + vh * vd) * (kernel - 1), vh * kd * vd


def _mlp_width(cfg: Mapping[str, Any]) -> int:
    """The widest MLP one token goes through: dense ``intermediate_size``, or for a mixture of
    experts the ``experts per token`` (plus shared experts) times the expert width."""
    dense = int(cfg.get("intermediate_size") or 0)
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if experts <= 1:
        if not dense:
            raise KeyError("intermediate_size")
        return dense
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 1)
    width = int(cfg.get("moe_intermediate_size") or dense)
    shared = int(cfg.get("shared_expert_intermediate_size") or 0) or int(cfg.get("n_shared_experts") or 0) * width
    routed = top_k * width + shared
    dense_layers = int(cfg.get("first_k_dense_replace") or 0)
    return max(routed, dense if dense_layers else 0)


@dataclass(frozen=True)
class WeightSizes:
    """A checkpoint's tensor bytes grouped by how tensor parallelism shards them.

    ``split``/``kv`` hold the non-linear part, ``*_linear`` the ``...proj.weight``
    tensors (the ones online FP8 stores in one byte); ``vocab`` is one
    ``(rows, bytes)`` pair per vocab-parallel tensor (embed_tokens, lm_head).
    ``source`` says where the numbers come from: ``safetensors`` headers, or
    ``inventory`` (params x dtype, when the model is not on the host yet).
    """

    replicated: int = 0
    split: int = 0
    split_linear: int = 0
    kv: int = 0
    kv_linear: int = 0
    vocab: tuple[tuple[int, int], ...] = ()
    source: str = "safetensors"

    @property
    def total(self) -> int:
        return (
            self.replicated + self.split + self.split_linear + self.kv + self.kv_linear + sum(b for _, b in self.vocab)
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "WeightSizes":
        return cls(
            replicated=int(d.get("replicated", 0)),
            split=int(d.get("split", 0)),
            split_linear=int(d.get("split_linear", 0)),
            kv=int(d.get("kv", 0)),
            kv_linear=int(d.get("kv_linear", 0)),
            vocab=tuple((int(r), int(b)) for r, b in d.get("vocab", [])),
            source=str(d.get("source", "safetensors")),
        )

    def per_rank(self, shape: ModelShape, tp: int, online_fp8: bool = False) -> int:
        """Bytes of weights one rank loads."""
        split_lin, kv_lin = self.split_linear, self.kv_linear
        if online_fp8:
            split_lin, kv_lin = split_lin // 2, kv_lin // 2
        if tp == 1:
            return self.replicated + self.split + split_lin + self.kv + kv_lin + sum(b for _, b in self.vocab)
        vocab = 0
        for rows, nbytes in self.vocab:
            padded = cdiv(rows, VOCAB_PADDING) * VOCAB_PADDING
            vocab += nbytes // rows * cdiv(padded, tp)
        kv = (self.kv + kv_lin) * shape.kv_heads_per_rank(tp) // shape.kv_heads
        return self.replicated + cdiv(self.split + split_lin, tp) + kv + vocab


def weights_from_params(params: float, dtype: str, shape: ModelShape) -> WeightSizes:
    """An estimate when only the parameter count is known (model not on the host).

    Embeddings and lm_head (vocab x hidden each) are vocab-parallel, the rest
    is split; norms are neglected (under 0.01 % of a model).
    """
    b = DTYPE_BYTES.get(dtype, 2)
    emb = shape.vocab * shape.hidden * b
    rest = max(0, int(params) * b - 2 * emb)
    return WeightSizes(split_linear=rest, vocab=((shape.vocab, emb), (shape.vocab, emb)), source="inventory")


@dataclass(frozen=True)
class VersionRules:
    """What differs between vLLM versions in the budget and the defaults."""

    version: tuple[int, int]
    default_util: float
    graphs_in_budget: bool  # CUDA-graph memory profiled into the budget (>= 0.21)
    requested_ceil: bool  # requested = ceil(total x util) (0.33)
    combined_kv_line: bool  # one "GPU KV cache size" line for all ranks (>= 0.12)

    def scheduler_defaults(self, gpu_name: str, total_bytes: int) -> tuple[int, int]:
        """Default ``(max_num_seqs, max_num_batched_tokens)`` of the OpenAI server.

        256/2048; 1024/8192 on GPUs of >= 70 GiB that are not A100; from 0.33
        1024/16384 on >= 160 GiB.
        """
        total_gib = total_bytes / GiB
        if self.version >= (0, 33) and total_gib >= 160:
            return 1024, 16384
        if total_gib >= 70 and "A100" not in gpu_name:
            return 1024, 8192
        return 256, 2048


def parse_version(text: str) -> tuple[int, int]:
    """``"0.11.0"`` → ``(0, 11)``; raises ``ValueError`` for anything else."""
    parts = text.strip().lstrip("v").split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"not a vLLM version: {text!r}")
    return int(parts[0]), int(parts[1])


def rules_for(version: str) -> VersionRules:
    """The rules of a vLLM version string (``0.11.0``, ``0.33.0``, ...)."""
    v = parse_version(version)
    return VersionRules(
        version=v,
        default_util=0.92 if v >= (0, 33) else 0.9,
        graphs_in_budget=v >= (0, 21),
        requested_ceil=v >= (0, 33),
        combined_kv_line=v >= (0, 12),
    )


@dataclass(frozen=True)
class Settings:
    """The vLLM flags the budget depends on, resolved against the version's defaults."""

    util: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool = False
    kv_cache_dtype: str = "auto"
    dtype: str = "bfloat16"
    online_fp8: bool = False
    kv_cache_memory_bytes: int | None = None
    block_size: int = BLOCK_SIZE
    #: ``--max-model-len auto``/-1 (0.33): vLLM fits the length to the memory.
    auto_max_model_len: bool = False

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 2)

    @property
    def kv_dtype_bytes(self) -> int:
        if self.kv_cache_dtype == "auto":
            return self.dtype_bytes
        return KV_DTYPE_BYTES.get(self.kv_cache_dtype, self.dtype_bytes)


@dataclass(frozen=True)
class RankBudget:
    """One rank's predicted numbers (bytes)."""

    rank: int
    total: int
    requested: int
    weights: int
    activation: int
    non_torch: int
    graphs: int
    available_kv: int
    num_blocks: int

    @property
    def nvml_in_use(self) -> int:
        """What NVML will show for this rank once serving (context + budget, graphs outside it < 0.21)."""
        return CUDA_CONTEXT_BYTES + self.requested + self.graphs

    @property
    def footprint(self) -> int:
        """Everything the rank allocates: context, weights, activation, non-torch, KV cache, graphs."""
        return (
            CUDA_CONTEXT_BYTES
            + self.weights
            + self.activation
            + self.non_torch
            + max(0, self.available_kv)
            + self.graphs
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "total_gib": round(gib(self.total), 2),
            "requested_gib": round(gib(self.requested), 2),
            "weights_gib": round(gib(self.weights), 2),
            "activation_gib": round(gib(self.activation), 2),
            "non_torch_gib": round(gib(self.non_torch), 2),
            "cuda_graphs_gib": round(gib(self.graphs), 2),
            "available_kv_gib": round(gib(self.available_kv), 2),
            "num_blocks": self.num_blocks,
        }


@dataclass(frozen=True)
class Budget:
    """The whole instance: every rank, and what the KV cache needs and holds.

    ``layer_bytes_per_token``: one attention layer's KV bytes per token on a
    rank; ``full_layers``/``sliding_layers`` (window ``window``): how many of
    each; ``fixed_bytes``: linear-attention state per request;
    ``max_num_batched_tokens``: what a sliding layer holds beyond its window
    during a chunked prefill; ``linear_layers``: linear-attention / mamba layers
    whose state is known (each a group member holding one page per request).
    """

    ranks: tuple[RankBudget, ...]
    kv_bytes_per_token: int
    max_model_len: int
    block_size: int = BLOCK_SIZE
    layer_bytes_per_token: int = 0
    full_layers: int = 0
    sliding_layers: int = 0
    window: int = 0
    fixed_bytes: int = 0
    max_num_batched_tokens: int = 0
    linear_layers: int = 0

    @property
    def worst(self) -> RankBudget:
        return min(self.ranks, key=lambda r: r.available_kv)

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV cache vLLM will log ("GPU KV cache size"): with sliding and full layers
        grouped, the blocks divided among the groups (vLLM 0.11 ``_report_kv_cache_config``)."""
        return max(0, min(r.num_blocks for r in self.ranks)) // max(1, self.groups()[1]) * self.block_size

    def groups(self) -> tuple[int, int]:
        """``(layers per group, number of groups)`` of vLLM's hybrid KV cache manager
        (``_get_kv_cache_groups_uniform_page_size``: full, sliding and linear layers each cut
        into groups of the same size); one group of every layer otherwise."""
        counts = [c for c in (self.full_layers, self.sliding_layers, self.linear_layers) if c]
        if len(counts) < 2:
            return max(1, sum(counts)), 1
        size = min(counts)
        if max(counts) < size * 1.5:
            size = max(counts)
        return size, sum(cdiv(c, size) for c in counts)

    def kv_need(self, max_len: int) -> int:
        """KV bytes one request of ``max_len`` tokens needs on a rank (vLLM's ``max_memory_usage_bytes``)."""
        bs, page = self.block_size, self.block_size * self.layer_bytes_per_token
        need = self.full_layers * cdiv(max_len, bs) * page
        if self.sliding_layers:
            held = min(self.window - 1 + self.max_num_batched_tokens, max_len)
            need += self.sliding_layers * (cdiv(held, bs) + 1) * page
        if self.linear_layers:
            # each linear layer's state page is padded to the attention page (hybrid_block_size)
            return need + max(self.fixed_bytes, self.linear_layers * page)
        return need + self.fixed_bytes

    @property
    def needed_kv(self) -> int:
        """KV bytes one request of ``max_model_len`` tokens needs on a rank."""
        return self.kv_need(self.max_model_len)

    def max_len_for(self, available: int) -> int:
        """Largest length whose KV fits in ``available`` bytes (vLLM's estimate, a binary search)."""
        if available <= 0 or not self.layer_bytes_per_token or self.kv_need(self.block_size) > available:
            return 0
        lo, hi = self.block_size, 1 << 26
        if self.kv_need(hi) <= available:
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.kv_need(mid) <= available else (lo, mid)
        return lo

    def max_concurrency(self) -> float:
        size, _ = self.groups()
        page = self.block_size * self.layer_bytes_per_token * size
        per_request = cdiv(self.needed_kv, page) if page else 0
        return min(r.num_blocks for r in self.ranks) / per_request if per_request else 0.0


def activation_peak(
    shape: ModelShape, tp: int, max_num_batched_tokens: int, max_num_seqs: int, dtype_bytes: int
) -> int:
    """Peak torch memory of the profiling forward pass beyond the weights (bytes)."""
    t = max_num_batched_tokens
    kvr = shape.kv_heads_per_rank(tp)
    per_token = 3 * cdiv(shape.intermediate, tp) + (shape.heads // tp + 2 * kvr) * shape.head_dim + 4 * shape.hidden
    logits = min(max_num_seqs, t) * cdiv(shape.vocab, tp) * tp * 4
    return t * per_token * dtype_bytes + logits


def non_torch(tp: int, rank: int) -> int:
    if tp == 1:
        return NON_TORCH_BASE
    return NON_TORCH_BASE + NCCL_OVERHEAD + (RANK0_EXTRA if rank == 0 else 0)


def graph_memory(shape: ModelShape, enforce_eager: bool) -> int:
    return 0 if enforce_eager else GRAPH_BYTES_PER_LAYER * shape.layers


def kv_bytes_per_token(shape: ModelShape, tp: int, kv_dtype_bytes: int) -> int:
    """KV bytes of one token over all attention layers on one rank (Qwen3-8B bf16 TP1: 147456;
    sliding-window layers included, as while a request is shorter than the window)."""
    return (shape.attention_full + shape.sliding_layers) * shape.layer_kv_bytes_per_token(tp, kv_dtype_bytes)


def requested_bytes(total: int, util: float, rules: VersionRules) -> int:
    return math.ceil(total * util) if rules.requested_ceil else int(total * util)


def predict(
    shape: ModelShape, weights: WeightSizes, settings: Settings, totals: list[int], rules: VersionRules
) -> Budget:
    """The budget vLLM will compute for an instance whose ranks see CUDA totals ``totals`` (bytes)."""
    tp = len(totals)
    w = weights.per_rank(shape, tp, settings.online_fp8)
    act = activation_peak(shape, tp, settings.max_num_batched_tokens, settings.max_num_seqs, settings.dtype_bytes)
    graphs = graph_memory(shape, settings.enforce_eager)
    per_token = kv_bytes_per_token(shape, tp, settings.kv_dtype_bytes)
    layer_bpt = shape.layer_kv_bytes_per_token(tp, settings.kv_dtype_bytes)
    block = hybrid_block_size(shape, tp, settings)
    linear = shape.linear_layers if shape.linear_layer_state_bytes(tp, settings.dtype_bytes) else 0
    shell = Budget(
        ranks=(),
        kv_bytes_per_token=per_token,
        max_model_len=settings.max_model_len,
        block_size=block,
        layer_bytes_per_token=layer_bpt,
        linear_layers=linear,
        full_layers=shape.attention_full,
        sliding_layers=shape.sliding_layers,
        window=shape.sliding_window,
        fixed_bytes=shape.state_bytes_per_request(tp, settings.dtype_bytes),
        max_num_batched_tokens=settings.max_num_batched_tokens,
    )
    # vLLM: num_blocks = available // page_size // layers per group (get_num_blocks)
    page_layers = layer_bpt * block * shell.groups()[0]
    ranks = []
    for r, total in enumerate(totals):
        req = requested_bytes(total, settings.util, rules)
        nt = non_torch(tp, r)
        if settings.kv_cache_memory_bytes is not None:
            avail = settings.kv_cache_memory_bytes
        else:
            avail = req - w - act - nt - (graphs if rules.graphs_in_budget else 0)
        ranks.append(
            RankBudget(
                rank=r,
                total=total,
                requested=req,
                weights=w,
                activation=act,
                non_torch=nt,
                graphs=graphs,
                available_kv=avail,
                num_blocks=max(0, avail) // page_layers if page_layers else 0,
            )
        )
    return replace(shell, ranks=tuple(ranks))


#: A correction applied to every budget a search predicts (a pipeline stage's, deploy/preflight/stages.py).
Adjust = Callable[[Budget], Budget]


def util_to_fit(
    shape: ModelShape,
    weights: WeightSizes,
    settings: Settings,
    totals: list[int],
    rules: VersionRules,
    margin: int = MARGIN_BYTES,
    adjust: Adjust | None = None,
) -> float | None:
    """Smallest ``gpu_memory_utilization`` (a multiple of 0.01) whose budget holds one
    ``max_model_len`` request plus ``margin`` on every rank; ``None`` when even 1.0 does not."""
    for pct in range(1, 101):
        util = pct / 100
        s = Settings(**{**settings.__dict__, "util": util, "kv_cache_memory_bytes": None})
        b = predict(shape, weights, s, totals, rules)
        b = adjust(b) if adjust else b
        if b.worst.available_kv >= b.needed_kv + margin:
            return util
    return None


def tp_to_fit(
    shape: ModelShape,
    weights: WeightSizes,
    settings: Settings,
    total: int,
    rules: VersionRules,
    current_tp: int,
    max_gpus: int,
    margin: int = MARGIN_BYTES,
    adjust: Adjust | None = None,
) -> int | None:
    """Smallest larger power-of-two TP (dividing the heads, at most ``max_gpus``) at which the
    same settings hold one ``max_model_len`` request plus ``margin``; ``None`` when none does."""
    tp = current_tp * 2
    while tp <= max_gpus:
        if shape.heads % tp == 0:
            b = predict(shape, weights, settings, [total] * tp, rules)
            b = adjust(b) if adjust else b
            if b.worst.available_kv >= b.needed_kv + margin:
                return tp
        tp *= 2
    return None
