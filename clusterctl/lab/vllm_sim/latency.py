"""Operating points of a profile: N closed-loop users against the engine model, on a virtual clock.

Each of ``users`` clients sends a request of ``prompt_len`` distinct tokens
and ``output_len`` output tokens (``ignore_eos``), waits for the last token
and sends the next one at once (``vllm bench serve --max-concurrency N``
with a fixed-length random dataset).  Figures use research vllm.md §7's
definitions: TTFT = first token - arrival; output throughput = output
tokens of the requests finished in the window / window; ITL = mean gap
between a request's tokens after the first.  The first ``warmup`` seconds
are left out (the clients start together, then spread out).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .profiles import ModelCost, Profile
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
    sched = Scheduler(profile, cost, ToyLM(noise=False), num_blocks=w.num_blocks,
                      max_num_seqs=w.max_num_seqs, max_num_batched_tokens=w.max_num_batched_tokens,
                      prefix_caching=w.prefix_caching)
    counter = [0]
    done: list[Seq] = []

    def new(user: int, now: float) -> Seq:
        counter[0] += 1
        toks = [f" u{user}r{counter[0]}w{i}" for i in range(w.prompt_len)]  # no shared prefixes
        return Seq(rid=counter[0], prompt="".join(toks), prompt_tokens=toks, max_tokens=w.output_len,
                   temperature=0.0, seed=counter[0], ignore_eos=True, arrival=now, session=f"u{user}")

    mark: list[tuple[float, int]] = []  # (time, tokens generated so far) when the warm-up ended

    def arrivals(now: float, finished: list[Seq]) -> list[Seq]:
        if not mark and now >= w.warmup:
            mark.append((now, sched.counters.generation_tokens))
        if now == 0.0 and not finished and counter[0] == 0:
            return [new(u, 0.0) for u in range(w.users)]
        done.extend(finished)
        return [new(int(s.session[1:]), now) for s in finished]

    end = simulate(sched, arrivals, w.duration)
    window = [s for s in done if s.arrival >= w.warmup and s.finished is not None]
    if not window:
        raise ValueError(f"no request finished between {w.warmup} s and {end:.1f} s: lengthen the run")
    ttfts = sorted((s.first_token or 0.0) - s.arrival for s in window)
    itls = [((s.finished or 0.0) - (s.first_token or 0.0)) / (len(s.out) - 1) for s in window if len(s.out) > 1]
    t0, g0 = mark[0]
    tokens = sched.counters.generation_tokens - g0
    span = end - t0
    itl = sum(itls) / len(itls) if itls else 0.0
    return Point(users=w.users, ttft_mean=sum(ttfts) / len(ttfts), ttft_p90=ttfts[int(0.9 * (len(ttfts) - 1))],
                 itl_mean=itl, output_tps=tokens / span if span > 0 else 0.0,
                 per_user_tps=1 / itl if itl else 0.0, requests=len(window),
                 preemptions=sched.counters.preemptions)
