"""The load generator against a running simulator: vLLM's metrics, and agreement with the server's own timings."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from clusterctl.bench import loadgen, runner, server_metrics, trust
from clusterctl.bench.stats import aggregate
from clusterctl.vllmclient import Endpoint, synthetic_prompt

from .conftest import READY

#: Client mean TTFT may exceed the server's by loopback HTTP, JSON and thread
#: scheduling on a shared 2-core machine. This catches gross errors (a clock started or
#: stopped at the wrong point); benchmarks/bench/loadgen_accuracy.py records the real error.
TTFT_TOLERANCE_S = 0.025
SCALE = 0.25


def _sim(start_sim: Any, host: Path, models: dict[str, Path], scale: str, *flags: str) -> Any:
    sim = start_sim(host, models["qwen3-8b"], *flags, scale=scale, startup="0")
    assert sim.wait_for(READY), sim.log
    return sim


@pytest.mark.parametrize("gen", [runner.run, loadgen.run], ids=["asyncio", "threads"])
def test_ttft_rises_with_concurrency_and_agrees_with_server_histogram(host, models, start_sim, gen: Any) -> None:
    # The simulator's histograms are on its simulated clock (1x); server_metrics scales them to wall time
    # with the factor the simulator sends (x-sim-time-scale).
    sim = _sim(start_sim, host, models, str(SCALE), "--sim-profile", "l40s-48g")
    ep = Endpoint.parse(sim.url)
    rng = random.Random(1)
    means = {}
    for conc in (1, 8):
        prompts = [synthetic_prompt(256, rng) for _ in range(8)]
        before = server_metrics.scrape(ep)
        run = gen(ep, prompts, conc, output_len=8)
        after = server_metrics.scrape(ep)
        rep = aggregate(run.results, run.duration, conc)
        assert rep["completed"] == 8 and rep["failed"] == 0, rep
        assert rep["total_output_tokens"] == 64 and rep["total_input_tokens"] >= 8 * 256
        ttft = [r.ttft for r in run.results]
        client = sum(ttft) / len(ttft)
        server = server_metrics.histogram_mean(before, after, "vllm:time_to_first_token_seconds")
        assert server is not None
        # The promise: the client agrees with the server, or the trust check says it cannot be trusted (on
        # the shared 2-core machine the load sometimes delays the simulator's front end or the generator).
        judged = trust.judge(run, rep, server)
        assert abs(client - server) < TTFT_TOLERANCE_S or not judged["trusted"], (conc, client, server, judged)
        assert all(len(r.itl) == 7 and r.tpot is not None for r in run.results)
        means[conc] = client
    assert means[8] > 1.5 * means[1], means
    assert sim.stop() == 0


def test_duration_cycles_the_prompts_and_starts_nothing_after_it(host, models, start_sim) -> None:
    sim = _sim(start_sim, host, models, "0.05")
    ep = Endpoint.parse(sim.url)
    run = runner.run(ep, ["one two", "three four five"], 3, output_len=4, duration=0.6, output_lens=[2, None])
    assert all(r.ok for r in run.results), [r.error for r in run.results]
    assert len(run.results) > 6  # more than the 2 prompts: cycled for the duration
    assert {r.output_tokens for r in run.results} == {2, 4}  # a per-prompt length, else the default
    longest = max(r.e2e for r in run.results)
    assert 0.6 <= run.duration < 0.6 + longest + 0.5
    assert sim.stop() == 0


@pytest.mark.parametrize("gen", [runner.run, loadgen.run], ids=["asyncio", "threads"])
def test_unreachable_endpoint_is_a_failed_row_not_an_exception(gen: Any) -> None:
    from clusterctl.lab.vllm_sim.serve import free_port

    ep = Endpoint.parse(f"http://127.0.0.1:{free_port()}")
    run = gen(ep, ["a b c"] * 3, 2, output_len=4, timeout=2)
    rep = aggregate(run.results, run.duration, 2)
    assert rep["completed"] == 0 and rep["failed"] == 3
    assert any("ConnectionRefused" in e for e in rep["errors"])  # type: ignore[union-attr]
