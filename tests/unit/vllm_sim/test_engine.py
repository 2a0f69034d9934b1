"""The continuous-batching scheduler and the threaded step engine, driven directly (no HTTP)."""

from __future__ import annotations

import threading

import pytest

from clusterctl.lab.vllm_sim import latency as L
from clusterctl.lab.vllm_sim.batching import StepEngine
from clusterctl.lab.vllm_sim.engine import GenRequest
from clusterctl.lab.vllm_sim.metrics import Metrics
from clusterctl.lab.vllm_sim.profiles import PROFILES
from clusterctl.lab.vllm_sim.scheduler import Scheduler, Seq
from clusterctl.lab.vllm_sim.toylm import ToyLM

PROF = PROFILES["l40s-48g"]
COST = L.MODEL_8B_INT8


def sched(blocks: int = 1000, seqs: int = 256, budget: int = 2048, prefix: bool = True) -> Scheduler:
    return Scheduler(
        PROF,
        COST,
        ToyLM(noise=False),
        num_blocks=blocks,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        prefix_caching=prefix,
    )


def seq(rid: int, n_prompt: int, n_out: int, tag: str = "", session: str = "") -> Seq:
    toks = [f" {tag}w{i}" for i in range(n_prompt)]
    return Seq(
        rid=rid,
        prompt="".join(toks),
        prompt_tokens=toks,
        max_tokens=n_out,
        temperature=0.0,
        seed=0,
        ignore_eos=True,
        session=session or f"s{rid}",
    )


def run_all(s: Scheduler, limit: int = 100_000) -> tuple[float, list]:
    now, loads = 0.0, []
    for _ in range(limit):
        load = s.step(now)
        if not load.new:
            break
        loads.append(load)
        now += s.duration(load)
        s.finish_step(now)
    return now, loads


def test_long_prompt_is_prefilled_in_chunks_within_the_token_budget() -> None:
    s = sched(budget=2048)
    a = seq(1, 5000, 4)
    s.add(a)
    _, loads = run_all(s)
    assert [ld.tokens for ld in loads[:3]] == [2048, 2048, 904]  # chunked prefill
    assert all(ld.tokens <= 2048 for ld in loads)
    assert len(a.out) == 4 and a.finish_reason == "length"
    # the first token comes with the last prefill chunk, then one token per step
    assert len(loads) == 3 + 3


def test_decodes_share_steps_with_a_new_prefill_and_seats_are_limited() -> None:
    s = sched(seqs=4)
    for i in range(10):
        s.add(seq(i, 100, 50, tag=f"t{i}"))
    s.step(0.0)
    assert len(s.running) == 4 and len(s.waiting) == 6
    s.finish_step(1.0)
    load = s.step(1.0)
    assert load.new == (1, 1, 1, 1)  # four decodes, no fifth sequence admitted
    now, _ = run_all(s)
    assert s.counters.generation_tokens == 500


def test_preemption_when_kv_blocks_run_out_and_outputs_survive_recompute() -> None:
    alone = {}
    for i in range(4):
        s = sched(blocks=1000)
        a = seq(i, 64, 100, tag=f"p{i}")
        s.add(a)
        run_all(s)
        alone[i] = a.out
    s = sched(blocks=24)  # 384 tokens of KV for four sequences growing to 164 tokens each
    seqs = [seq(i, 64, 100, tag=f"p{i}") for i in range(4)]
    for a in seqs:
        s.add(a)
    run_all(s)
    assert s.counters.preemptions > 0
    assert sum(a.preemptions for a in seqs) == s.counters.preemptions
    for i, a in enumerate(seqs):
        assert a.out == alone[i] and a.finish_reason == "length"
    assert s.pool.used == 0


def test_prefix_caching_reuses_full_blocks_and_cuts_prefill() -> None:
    for prefix in (True, False):
        s = sched(prefix=prefix)
        shared = [f" sys{i}" for i in range(96)]  # 6 full blocks
        a = Seq(
            rid=1,
            prompt="".join(shared) + " a",
            prompt_tokens=shared + [" a"],
            max_tokens=2,
            temperature=0.0,
            seed=0,
            ignore_eos=True,
        )
        b = Seq(
            rid=2,
            prompt="".join(shared) + " b",
            prompt_tokens=shared + [" b"],
            max_tokens=2,
            temperature=0.0,
            seed=0,
            ignore_eos=True,
        )
        s.add(a)
        t_a, _ = run_all(s)
        b.arrival = t_a
        s.add(b)
        t_b, loads = run_all(s)
        if prefix:
            assert s.counters.prefix_hits == 96 and s.counters.prefix_queries == 194
            assert loads[0].new == (1,)  # only the token after the cached prefix is computed
        else:
            assert s.counters.prefix_hits == 0
            assert loads[0].new == (97,)


def test_kv_usage_follows_allocated_blocks() -> None:
    s = sched(blocks=101)  # vLLM V1 keeps one block as its null block: 100 usable, usage counted over them
    assert s.pool.available == 100
    s.add(seq(1, 320, 10))
    s.step(0.0)
    assert s.kv_usage == pytest.approx(0.20)  # 320 tokens = 20 blocks of 16
    s.finish_step(0.1)
    run_all(s)
    assert s.kv_usage == 0.0  # freed (cached prefix blocks are evictable, not used)


def test_a_prompt_is_admitted_only_when_all_of_it_fits_the_free_blocks() -> None:
    """vLLM 0.32's admission (``scheduler_reserve_full_isl``, default on): a waiting prompt whose whole length
    does not fit the free blocks waits, even when its first chunk would fit; 0.11 admitted on the first chunk
    and preempted the prompt half-way through its prefill."""

    def run(full: bool) -> tuple[list[int], int, int]:
        s = Scheduler(
            PROF,
            COST,
            ToyLM(noise=False),
            num_blocks=41,
            max_num_seqs=8,
            max_num_batched_tokens=256,
            full_prompt_admission=full,
        )
        s.add(seq(1, 400, 50, "a"))  # 25 of the 40 usable blocks once prefilled
        s.add(seq(2, 400, 50, "b"))  # needs 25 more: only 15 free beside the first
        for t in range(2):  # the first prompt's prefill in chunks of 256 tokens; 112 tokens of budget left
            s.step(float(t))
            s.finish_step(float(t) + 0.5)
        running = [q.rid for q in s.running]
        run_all(s)
        return running, s.counters.preemptions, s.counters.generation_tokens

    assert run(True) == ([1], 0, 100)  # the second waits until the first finishes; nothing is recomputed
    running, preempted, generated = run(False)
    assert running == [1, 2] and preempted >= 1 and generated == 100  # admitted, then preempted mid-prefill


def test_threaded_engine_serves_concurrent_requests_and_records_simulated_latencies() -> None:
    m = Metrics("0.11", "m", {})
    eng = StepEngine(sched(), vocab=1000, scale=0.002, metrics=m)
    try:
        results: dict[int, list[str]] = {}

        def client(i: int) -> None:
            toks = [f" c{i}w{j}" for j in range(1400)]
            req = GenRequest(
                prompt="".join(toks), prompt_tokens=toks, max_tokens=8, temperature=0.0, seed=1, ignore_eos=True
            )
            results[i] = [ev.text for ev in eng.generate(req)]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all(len(results[i]) == 8 for i in range(4))
        h = m.hists["vllm:time_to_first_token_seconds"]
        assert sum(h.counts) == 4
        # simulated seconds, not wall time (0.002 x): each 1400-token prompt takes >= 0.19 s of prefill
        assert h.sum / 4 > 0.18
        assert m.counters["vllm:generation_tokens"] == 32
        assert m.counters["vllm:prompt_tokens"] == 4 * 1400
        assert eng.stats().running == 0
    finally:
        eng.close()


def test_engine_at_scale_zero_does_not_wait() -> None:
    eng = StepEngine(sched(), vocab=1000, scale=0.0)
    try:
        toks = [f" w{j}" for j in range(3000)]
        req = GenRequest(prompt="".join(toks), prompt_tokens=toks, max_tokens=50, temperature=0.0, ignore_eos=True)
        assert len(list(eng.generate(req))) == 50
        assert eng.now() > 0.5  # the simulated clock still advanced
    finally:
        eng.close()


def test_an_idle_engine_hands_a_burst_over_together_with_a_pickup_time() -> None:
    """With ``t_pickup`` (the cpu-1core profile), a request that arrives shortly after the first one at an
    idle engine shares its first step: both first tokens come from one step."""
    import time
    from dataclasses import replace

    prof = replace(PROFILES["cpu-1core"], t_pickup=0.3)
    s = Scheduler(
        prof,
        L.MODEL_TINY_LLAMA,
        ToyLM(noise=False),
        num_blocks=512,
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        block_size=128,
    )
    eng = StepEngine(s, vocab=4096, scale=1.0)
    first: dict[int, float] = {}
    try:

        def client(i: int) -> None:
            toks = [f" c{i}w{j}" for j in range(16)]
            req = GenRequest(prompt="".join(toks), prompt_tokens=toks, max_tokens=2, temperature=0.0, ignore_eos=True)
            for _ev in eng.generate(req):
                first.setdefault(i, time.monotonic())

        threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
        threads[0].start()
        time.sleep(0.03)
        threads[1].start()
        for t in threads:
            t.join(30)
        assert len(first) == 2
        assert s.counters.steps == 2  # one prefill step for both, one decode step for both
    finally:
        eng.close()


def test_bench_point_runs_the_bench_closed_loop() -> None:
    """``bench_point``: N requests, at most C in flight from t=0; every request counted once."""
    b = L.bench_point(
        PROFILES["cpu-1core"],
        L.MODEL_TINY_LLAMA,
        concurrency=4,
        requests=10,
        prompt_len=128,
        output_len=8,
        num_blocks=512,
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        block_size=128,
    )
    assert b.requests == 10 and b.preemptions == 0
    one = L.bench_point(
        PROFILES["cpu-1core"],
        L.MODEL_TINY_LLAMA,
        concurrency=1,
        requests=3,
        prompt_len=128,
        output_len=8,
        num_blocks=512,
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        block_size=128,
    )
    # four prompts share a prefill step: TTFT grows with concurrency, so does throughput
    assert b.ttft_mean > one.ttft_mean and b.output_tps > one.output_tps


def _cpu_engine() -> tuple[Scheduler, StepEngine]:
    s = Scheduler(
        PROFILES["cpu-1core"],
        L.MODEL_TINY_LLAMA,
        ToyLM(noise=False),
        num_blocks=512,
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        block_size=128,
    )
    return s, StepEngine(s, vocab=4096, scale=1.0)


def _req(tag: str, n: int, out: int) -> GenRequest:
    toks = [f" {tag}w{j}" for j in range(n)]
    return GenRequest(prompt="".join(toks), prompt_tokens=toks, max_tokens=out, temperature=0.0, ignore_eos=True)


def test_a_request_after_an_idle_engine_waits_its_whole_first_step_at_1x() -> None:
    """At 1x, the first step after idle starts a new timeline: the next request of a closed loop (sent as
    the previous one finished) waits the pickup and its whole prefill step, as on the virtual clock
    (the step once continued the timeline that ended before the idle, and TTFT came out ~25 ms short)."""
    import time

    s, eng = _cpu_engine()
    prof = PROFILES["cpu-1core"]
    try:
        for i in range(3):
            list(eng.generate(_req(f"warm{i}", 16, 1)))
            t0 = time.monotonic()
            gen = eng.generate(_req(f"r{i}", 128, 1))
            next(gen)
            ttft = time.monotonic() - t0
            list(gen)
            step = prof.t_step + prof.t_seq + 2 * L.MODEL_TINY_LLAMA.active_params * 128 / prof.flops_eff
            assert ttft >= 0.95 * (prof.t_pickup + step), (i, ttft, prof.t_pickup + step)
    finally:
        eng.close()


def test_a_burst_the_front_end_is_still_parsing_shares_the_first_step() -> None:
    """Requests the HTTP front end accepted during the pickup (``arrive``) but queues only later (parsing,
    tokenizing: slow on a loaded machine) still share the idle engine's first step, as the real engine's
    burst does: both prompts in one prefill step, then one decode step for both."""
    import time

    s, eng = _cpu_engine()
    try:

        def client(i: int, delay: float) -> None:
            eng.arrive()
            time.sleep(delay)  # the front end's own work before the request reaches the engine
            list(eng.generate(_req(f"b{i}", 64, 2)))

        threads = [threading.Thread(target=client, args=(0, 0.0)), threading.Thread(target=client, args=(1, 0.12))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert s.counters.steps == 2, s.counters
        assert not eng._arriving
    finally:
        eng.close()
