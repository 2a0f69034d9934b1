"""Operating points of a profile: N closed-loop users against the engine model, on a virtual clock.

Each of ``users`` clients sends a request of ``prompt_len`` distinct tokens
and ``output_len`` output tokens (``ignore_eos``), waits for the last token
and sends the next one at once (``vllm bench serve --max-concurrency N``
with a fixed-length random dataset).  Figures use research vllm.md §7's
definitions: TTFT = first token - arrival; output throughput = output
tokens of the requests finished in the window / window; ITL = mean gap
between a request's tokens after the first.  The first ``warmup`` seconds
are left out (the clients start together, then spread out).  With
``burst`` each user sends one request at t=0 and the figures cover all of
them (throughput = all output tokens / time until the last one finished).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from . import memory as M
from .profiles import PROFILES, ModelCost, Profile
from .scheduler import Scheduler, Seq, simulate
from .toylm import ToyLM


@dataclass(frozen=True)
class Workload:
    users: int
    prompt_len: int
    output_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    num_blocks: int
    duration: float = 240.0  # simulated seconds
    warmup: float = 30.0
    prefix_caching: bool = True
    burst: bool = False  # True: each user sends one request at t=0 and no more (a load-test burst)


@dataclass(frozen=True)
class Point:
    users: int
    ttft_mean: float  # s
    ttft_p90: float  # s
    itl_mean: float  # s
    output_tps: float  # output tokens/s, all users together
    per_user_tps: float  # output tokens/s of one user's stream after its first token (1 / ITL)
    requests: int
    preemptions: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure(profile: Profile, cost: ModelCost, w: Workload) -> Point:
    """Run the workload on a virtual clock and summarise the requests finished after the warm-up."""
    sched = Scheduler(
        profile,
        cost,
        ToyLM(noise=False),
        num_blocks=w.num_blocks,
        max_num_seqs=w.max_num_seqs,
        max_num_batched_tokens=w.max_num_batched_tokens,
        prefix_caching=w.prefix_caching,
    )
    counter = [0]
    done: list[Seq] = []

    def new(user: int, now: float) -> Seq:
        counter[0] += 1
        toks = [f" u{user}r{counter[0]}w{i}" for i in range(w.prompt_len)]  # no shared prefixes
        return Seq(
            rid=counter[0],
            prompt="".join(toks),
            prompt_tokens=toks,
            max_tokens=w.output_len,
            temperature=0.0,
            seed=counter[0],
            ignore_eos=True,
            arrival=now,
            session=f"u{user}",
        )

    mark: list[tuple[float, int]] = []  # (time, tokens generated so far) when the warm-up ended

    def arrivals(now: float, finished: list[Seq]) -> list[Seq]:
        if not mark and now >= w.warmup:
            mark.append((now, sched.counters.generation_tokens))
        if now == 0.0 and not finished and counter[0] == 0:
            return [new(u, 0.0) for u in range(w.users)]
        done.extend(finished)
        if w.burst:
            return []
        return [new(int(s.session[1:]), now) for s in finished]

    end = simulate(sched, arrivals, w.duration)
    if w.burst:
        mark[:] = [(0.0, 0)]
    window = [s for s in done if s.arrival >= (0.0 if w.burst else w.warmup) and s.finished is not None]
    if not window:
        raise ValueError(f"no request finished between {w.warmup} s and {end:.1f} s: lengthen the run")
    ttfts = sorted((s.first_token or 0.0) - s.arrival for s in window)
    itls = [((s.finished or 0.0) - (s.first_token or 0.0)) / (len(s.out) - 1) for s in window if len(s.out) > 1]
    t0, g0 = mark[0]
    tokens = sched.counters.generation_tokens - g0
    span = end - t0
    itl = sum(itls) / len(itls) if itls else 0.0
    return Point(
        users=w.users,
        ttft_mean=sum(ttfts) / len(ttfts),
        ttft_p90=ttfts[int(0.9 * (len(ttfts) - 1))],
        itl_mean=itl,
        output_tps=tokens / span if span > 0 else 0.0,
        per_user_tps=1 / itl if itl else 0.0,
        requests=len(window),
        preemptions=sched.counters.preemptions,
    )


@dataclass(frozen=True)
class BenchPoint:
    """What ``clusterctl bench`` reports for one level, computed on the virtual clock (times in s)."""

    concurrency: int
    requests: int
    ttft_mean: float
    tpot_mean: float  # (E2E - TTFT) / (output tokens - 1), averaged over requests
    output_tps: float  # all output tokens / time until the last request finished
    preemptions: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bench_point(
    profile: Profile,
    cost: ModelCost,
    *,
    concurrency: int,
    requests: int,
    prompt_len: int,
    output_len: int,
    num_blocks: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    block_size: int = 16,
    prefix_caching: bool = True,
) -> BenchPoint:
    """``clusterctl bench -c C -n N`` on the virtual clock: ``requests`` distinct prompts, at most
    ``concurrency`` in flight from t=0, each next one sent when one finishes (the bench's workers)."""
    sched = Scheduler(
        profile,
        cost,
        ToyLM(noise=False),
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        prefix_caching=prefix_caching,
    )
    sent = [0]
    done: list[Seq] = []

    def new(now: float) -> Seq:
        sent[0] += 1
        toks = [f" r{sent[0]}w{i}" for i in range(prompt_len)]
        return Seq(
            rid=sent[0],
            prompt="".join(toks),
            prompt_tokens=toks,
            max_tokens=output_len,
            temperature=0.0,
            seed=sent[0],
            ignore_eos=True,
            arrival=now,
        )

    def arrivals(now: float, finished: list[Seq]) -> list[Seq]:
        if now == 0.0 and not finished and sent[0] == 0:
            return [new(0.0) for _ in range(min(concurrency, requests))]
        done.extend(finished)
        return [new(now) for _ in finished if sent[0] < requests]

    end = simulate(sched, arrivals, 1e6)
    if len(done) != requests:
        raise ValueError(f"{len(done)} of {requests} requests finished")
    ttft = [(s.first_token or 0.0) - s.arrival for s in done]
    tpot = [((s.finished or 0.0) - (s.first_token or 0.0)) / (len(s.out) - 1) for s in done if len(s.out) > 1]
    return BenchPoint(
        concurrency=concurrency,
        requests=requests,
        ttft_mean=sum(ttft) / len(ttft),
        tpot_mean=sum(tpot) / len(tpot) if tpot else 0.0,
        output_tps=sum(len(s.out) for s in done) / end if end > 0 else 0.0,
        preemptions=sched.counters.preemptions,
    )


# ---- reference scenarios (docs/latency-profiles.md): the models and workloads behind each profile's figures


def _shape(layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int, arch: str) -> M.ModelShape:
    return M.ModelShape(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv,
        head_dim=128,
        intermediate=inter,
        vocab=vocab,
        max_position=40960,
        torch_dtype="bfloat16",
        architecture=arch,
    )


QWEN3_8B = _shape(36, 4096, 32, 8, 12288, 151936, "Qwen3ForCausalLM")
GEMMA3_27B = _shape(62, 5376, 32, 16, 21504, 262144, "Gemma3ForCausalLM")
LLAMA3_8B = _shape(32, 4096, 32, 8, 14336, 128256, "LlamaForCausalLM")

#: Qwen3-8B W8A8 INT8: linear weights 1 byte (6.95 GB), lm_head kept in bf16 (1.24 GB).
MODEL_8B_INT8 = ModelCost.from_shape(QWEN3_8B, 6.95e9 + 1.24e9, 1, 2)
#: A 27B model (Gemma-3-27B shape) in AWQ 4-bit (+3 % scales/zeros), fp16 lm_head, TP 4: per rank.
MODEL_27B_AWQ_TP4 = ModelCost.from_shape(GEMMA3_27B, (25.6e9 * 0.53 + 2.82e9) / 4, 4, 2)
#: Llama-3.1-8B in bf16 (16.06 GB).
MODEL_8B_BF16 = ModelCost.from_shape(LLAMA3_8B, 16.06e9, 1, 2)

#: KV blocks used by the scenarios (none is KV-bound: about what a 0.9 utilisation leaves).
BLOCKS_48G_8B = 13_000
BLOCKS_48G_27B_TP4 = 17_000
BLOCKS_H100_8B = 30_000


@dataclass(frozen=True)
class Scenario:
    """One operating point of a profile and the figure it should show (report/publication)."""

    name: str
    profile: str
    model: str
    workload: Workload
    target: dict[str, float]  # Point field -> value (``ttft_mean_min`` style keys: a lower bound)


#: The tiny real model the real CPU engine serves (clusterctl/lab/realmodel.py: 2 layers, hidden 256, bf16;
#: 6,556,160 bytes of tensors in model.safetensors).
TINY_LLAMA = M.ModelShape(
    layers=2,
    hidden=256,
    heads=4,
    kv_heads=2,
    head_dim=64,
    intermediate=512,
    vocab=4096,
    max_position=4096,
    torch_dtype="bfloat16",
    architecture="LlamaForCausalLM",
)
MODEL_TINY_LLAMA = ModelCost.from_shape(TINY_LLAMA, 6_556_160, 1, 2)

MODELS = {
    "8b-int8": MODEL_8B_INT8,
    "27b-awq-tp4": MODEL_27B_AWQ_TP4,
    "8b-bf16": MODEL_8B_BF16,
    "tiny-llama": MODEL_TINY_LLAMA,
}

#: The field report's three operating points (8B INT8, 48 GB card; prompt 1400, output 64 tokens,
#: closed loop) and the 27B burst.  "initial" is the report's starting budget; "raised" vLLM 0.11's default.
REPORT = (
    Scenario(
        "8b-1-user",
        "l40s-48g",
        "8b-int8",
        Workload(1, 1400, 64, 256, 2048, BLOCKS_48G_8B, duration=200),
        {"per_user_tps": 90.0, "ttft_mean": 0.2},
    ),
    Scenario(
        "8b-8-users-initial-budget",
        "l40s-48g",
        "8b-int8",
        Workload(8, 1400, 64, 4, 512, BLOCKS_48G_8B, duration=200),
        {"output_tps": 150.0, "ttft_mean": 2.0},
    ),
    Scenario(
        "8b-8-users-raised-budget",
        "l40s-48g",
        "8b-int8",
        Workload(8, 1400, 64, 256, 2048, BLOCKS_48G_8B, duration=200),
        {"output_tps_min": 200.0, "ttft_mean_max": 2.0},
    ),
    Scenario(
        "27b-20-users-burst",
        "l40s-48g",
        "27b-awq-tp4",
        Workload(20, 4096, 256, 256, 2048, BLOCKS_48G_27B_TP4, duration=400, burst=True),
        {"ttft_mean_min": 10.0},
    ),
)


def run(s: Scenario, users: int | None = None) -> Point:
    """Measure a scenario (optionally at another number of users)."""
    w = s.workload if users is None else replace(s.workload, users=users)
    return measure(PROFILES[s.profile], MODELS[s.model], w)
