"""Latency profiles: how long one engine step takes on a given accelerator.

A profile holds physical parameters of the hardware (memory bandwidth, usable
matmul throughput, fixed overheads, the TP interconnect); the model side
(:class:`ModelCost`: bytes of weights read per step, FLOPs per token, KV bytes
per token) comes from the served model.  One step of the engine takes::

    t = t_step + t_seq * seqs                       (CPU: schedule, sample, detokenize)
      + max(flops / flops_eff, bytes / mem_bw)      (roofline of one forward pass)
      + allreduce                                   (TP > 1: 2 per layer)

    flops = 2 * active_params_per_rank * tokens + 4 * layers * q_dim_per_rank * sum(new * ctx)
    bytes = weight_bytes_per_rank + kv_bytes_per_token_per_rank * sum(ctx + new)
    allreduce = 2 * layers * (link_latency + tokens * hidden * 2 bytes * 2(tp-1)/tp / link_bw)

``tokens`` is what the step computes (prefill chunks + one per decoding
sequence), ``ctx`` a sequence's tokens already in the KV cache.  A decode step
of a small batch is therefore memory-bound (weights / bandwidth); a prefill
chunk is compute-bound; attention over long contexts adds KV reads.  All
times are seconds at 1x; the engine multiplies by ``--time-scale``.

Nothing here knows a target figure: docs/latency-profiles.md lists the
workloads under which these parameters reproduce the published ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import memory as M


@dataclass(frozen=True)
class Profile:
    """Physical parameters of one accelerator (per GPU) and its host."""

    name: str
    description: str
    source: str
    mem_bw: float  # bytes/s actually reached by weight/KV streaming
    flops_eff: float  # usable dense matmul FLOP/s at the weights' precision
    t_step: float  # s per engine step (scheduler, input preparation, sampler, detokenizer)
    t_seq: float  # s per scheduled sequence per step (per-request CPU work)
    link_bw: float = 0.0  # bytes/s of the TP interconnect (0: TP 1 only)
    link_latency: float = 0.0  # s per all-reduce
    #: s an idle engine takes to start its first step after a request arrives (the front end handing the
    #: request over): requests of a burst that arrive meanwhile share that step.  0: it starts at once.
    t_pickup: float = 0.0


@dataclass(frozen=True)
class ModelCost:
    """What one forward pass of the served model costs per rank."""

    weight_bytes: float  # read once per step (per rank)
    active_params: float  # parameters multiplied per token (per rank; embeddings excluded)
    kv_bytes_per_token: float  # per rank
    layers: int
    q_dim: int  # query heads x head_dim per rank (attention FLOPs)
    hidden: int
    tp: int = 1

    @classmethod
    def from_shape(
        cls,
        m: M.ModelShape,
        weight_bytes: float,
        tp: int,
        kv_dtype_bytes: int,
        weight_bytes_per_param: float | None = None,
    ) -> "ModelCost":
        """From ``config.json``'s shape and the per-rank weight bytes start-up computed."""
        attn = m.hidden * m.heads * m.head_dim * 2 + m.hidden * m.kv_heads * m.head_dim * 2
        mlp = 3 * m.hidden * m.intermediate
        params = m.layers * (attn + mlp) + m.vocab * m.hidden  # + lm_head (the embedding is a lookup)
        return cls(
            weight_bytes=weight_bytes,
            active_params=params / tp,
            kv_bytes_per_token=M.kv_bytes_per_token(m, tp, kv_dtype_bytes),
            layers=m.layers,
            q_dim=m.heads // tp * m.head_dim,
            hidden=m.hidden,
            tp=tp,
        )


@dataclass(frozen=True)
class StepLoad:
    """What one step computes: ``new`` tokens and ``ctx`` cached tokens per scheduled sequence."""

    new: tuple[int, ...]
    ctx: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return sum(self.new)


def step_time(p: Profile, m: ModelCost, load: StepLoad) -> float:
    """Seconds one engine step takes at 1x (see the module docstring)."""
    if not load.new:
        return 0.0
    tokens = load.tokens
    attn_pairs = sum(n * (c + (n + 1) / 2) for n, c in zip(load.new, load.ctx))
    flops = 2.0 * m.active_params * tokens + 4.0 * m.layers * m.q_dim * attn_pairs
    kv_read = m.kv_bytes_per_token * sum(c + n for n, c in zip(load.new, load.ctx))
    t = p.t_step + p.t_seq * len(load.new) + max(flops / p.flops_eff, (m.weight_bytes + kv_read) / p.mem_bw)
    if m.tp > 1:
        if p.link_bw <= 0:
            raise ValueError(f"profile {p.name} has no TP interconnect (link_bw)")
        per = tokens * m.hidden * 2 * 2 * (m.tp - 1) / m.tp
        t += 2 * m.layers * (p.link_latency + per / p.link_bw)
    return t


GB = 1e9
TB = 1e12
T = 1e12

#: The profiles, by name.  Sources and the figures each reproduces: docs/latency-profiles.md.
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="l40s-48g",
            description="48 GB PCIe accelerator (L40S class: 864 GB/s GDDR6, 362 dense INT8 TOPS), "
            "the field report's card; TP over PCIe Gen4 without NVLink",
            source="NVIDIA L40S datasheet (bandwidth, INT8 TOPS); field report (../shared/requirements.md)",
            mem_bw=0.90 * 864 * GB,  # ~90 % of peak reached by decode GEMV kernels
            flops_eff=0.30 * 362 * T,  # W8A8 GEMMs at ~30 % of dense peak, attention and sampling included
            t_step=0.0010,
            t_seq=0.0002,
            link_bw=20 * GB,
            link_latency=25e-6,  # PCIe Gen4 x16 all-reduce (no NVLink, no P2P)
        ),
        Profile(
            name="h100-sxm",
            description="H100 SXM5 80 GB (3.35 TB/s HBM3, 989 dense BF16 TFLOPS, NVLink 900 GB/s)",
            source="NVIDIA H100 datasheet; vLLM's published Llama-3-8B H100 serving figures (research vllm.md §7)",
            mem_bw=0.80 * 3350 * GB,
            flops_eff=0.45 * 989 * T,
            t_step=0.0012,
            t_seq=0.00002,
            link_bw=300 * GB,
            link_latency=8e-6,
        ),
        Profile(
            name="cpu-1core",
            description="one x86 core running vLLM 0.32's CPU backend (bf16, --enforce-eager, one OpenMP thread, "
            "the API server on the same core), as the lab's real engine serves the tiny real model",
            source="fitted to the real engine measured by benchmarks/real_vllm/calibrate.py at load 2-3 "
            "(benchmarks/results/real-vllm-calibration-2026-12-01T2255.json, docs/real-vllm.md)",
            mem_bw=10 * GB,  # not fitted: 6.6 MB of weights per step cost 0.7 ms, below the fitted overheads
            flops_eff=11.2e9,  # prompt tokens: about 0.4 ms each for the tiny model (4.5 MFLOP per token)
            t_step=0.0091,
            t_seq=0.00069,  # Python per step (scheduler, sampler, detokenizer, API server) and per sequence
            # The API server shares the busy core: a burst reaches the engine core together (measured: at 16
            # streams the median TTFT is one 2048-token prefill step, the clients stay in lockstep).
            t_pickup=0.02,
        ),
    )
}

DEFAULT_PROFILE = "h100-sxm"


def default_profile(gpu_name: str, total_bytes: int | None = None) -> str:
    """The profile for a GPU model name (NVML's): 48 GB class cards get l40s-48g, the rest h100-sxm."""
    n = gpu_name.upper()
    if any(k in n for k in ("L40", "A40", "A6000", "6000 ADA")):
        return "l40s-48g"
    if total_bytes is not None and total_bytes < 60 * (1 << 30):
        return "l40s-48g"
    return DEFAULT_PROFILE


def get(name: str) -> Profile:
    """A profile by name; ``ValueError`` naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown simulator profile {name!r} (known: {', '.join(sorted(PROFILES))})") from None
