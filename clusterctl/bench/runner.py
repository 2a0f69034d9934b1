"""The closed-loop load generator ``clusterctl bench`` uses: asyncio, one thread, many streams.

At most ``concurrency`` requests are in flight; each worker coroutine has
one keep-alive connection, opened before the clock starts (so a burst of
connects does not count as TTFT; a request that must reconnect counts its
connect, as vLLM's own client does), and sends its next request when the
previous one ends (and not before its Poisson
arrival time with ``request_rate``).  Either every prompt is sent once, or
with ``duration`` the prompts are cycled and no request starts after
``duration`` seconds (those in flight finish and count).  Results are the
same :class:`~clusterctl.bench.loadgen.RunResult` the threaded generator
returns; CPU is this process's CPU time (one core = the run's wall time).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Iterator, Sequence

from clusterctl.bench.http_sse import Client
from clusterctl.bench.loadgen import RunResult
from clusterctl.errors import ClusterctlError
from clusterctl.vllmclient import Endpoint, RequestResult


def schedule(
    prompts: Sequence[str], output_lens: Sequence[int], *, request_rate: float | None, seed: int, duration: float | None
) -> Iterator[tuple[float, str, int]]:
    """(send offset s, prompt, max_tokens) in order: each prompt once, or cycled while the offset is
    under ``duration``; offsets are 0 without ``request_rate``, else a seeded Poisson process."""
    if request_rate is not None and request_rate <= 0:
        raise ClusterctlError(f"request rate must be above 0, not {request_rate}")
    rng = random.Random(seed)
    pairs = zip(prompts, output_lens) if duration is None else itertools.cycle(list(zip(prompts, output_lens)))
    at = 0.0
    for prompt, n in pairs:
        if duration is not None and at >= duration:
            return
        yield at, prompt, n
        if request_rate is not None:
            at += rng.expovariate(request_rate)


#: Period (s) of the timer that measures the event loop's scheduling delay.
TICK = 0.005


async def _ticker(lags: list[float]) -> None:
    """Sleep TICK at a time and record how late each wake-up came (s): the time an SSE chunk may wait in the
    socket before this loop reads and stamps it (the process waiting for a CPU, or the loop busy)."""
    loop = asyncio.get_running_loop()
    due = loop.time() + TICK
    while True:
        await asyncio.sleep(max(0.0, due - loop.time()))
        now = loop.time()
        lags.append(max(0.0, now - due))
        due = max(due + TICK, now + TICK / 2)


async def _run(
    ep: Endpoint,
    jobs: Iterator[tuple[float, str, int]],
    concurrency: int,
    model: str | None,
    timeout: float,
    ignore_eos: bool,
    duration: float | None,
    on_result: Callable[[RequestResult], None] | None,
) -> tuple[list[RequestResult], float, float, list[float]]:
    """(results, wall s, CPU s, loop lags s), the first two from the moment the connections are open."""
    results: list[RequestResult] = []
    clients = [Client(ep, timeout) for _ in range(concurrency)]
    await asyncio.gather(*(c.connect() for c in clients))  # a failure shows again on the first request
    lags: list[float] = []
    ticker = asyncio.ensure_future(_ticker(lags))
    start, cpu0 = time.perf_counter(), time.process_time()

    async def worker(client: Client) -> None:
        for at, prompt, max_tokens in jobs:  # one shared iterator: each job goes to one worker
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if duration is not None and time.perf_counter() - start >= duration:
                return
            body: dict[str, object] = {
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": ignore_eos,
            }
            if model:
                body["model"] = model
            r = await client.stream(body)
            results.append(r)
            if on_result is not None:
                on_result(r)

    try:
        await asyncio.gather(*(worker(c) for c in clients))
    finally:
        ticker.cancel()
        for c in clients:
            c.close()
    return results, time.perf_counter() - start, time.process_time() - cpu0, lags


def run(
    ep: Endpoint,
    prompts: Sequence[str],
    concurrency: int,
    output_len: int,
    *,
    output_lens: Sequence[int | None] | None = None,
    model: str | None = None,
    timeout: float = 60.0,
    ignore_eos: bool = True,
    request_rate: float | None = None,
    seed: int = 0,
    duration: float | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
) -> RunResult:
    """Run one concurrency level.  ``output_lens`` (per prompt, None = ``output_len``) overrides the asked
    length; ``timeout`` (s) bounds each connect and silence; ``on_result`` sees every finished request."""
    if concurrency < 1:
        raise ClusterctlError(f"concurrency must be at least 1, not {concurrency}")
    if not prompts:
        raise ClusterctlError("no prompts to send")
    if duration is not None and duration <= 0:
        raise ClusterctlError(f"duration must be above 0 s, not {duration}")
    lens = [output_len if n is None else n for n in (output_lens or [None] * len(prompts))]
    jobs = schedule(prompts, lens, request_rate=request_rate, seed=seed, duration=duration)
    workers = concurrency if duration is not None else min(concurrency, len(prompts))
    results, wall, cpu, lags = asyncio.run(_run(ep, jobs, workers, model, timeout, ignore_eos, duration, on_result))
    return RunResult(concurrency, results, wall, cpu, lags)
