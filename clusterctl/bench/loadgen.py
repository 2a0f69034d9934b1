"""Closed-loop streaming load generator for ``/v1/completions`` (threads + http.client).

Each of ``concurrency`` worker threads sends one request at a time over its own
connection with :func:`clusterctl.vllmclient.stream_completion` (``stream: true``,
every SSE ``data:`` line time-stamped as it arrives; a failed request is a failed
result with the reason, never an exception).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from clusterctl.errors import ClusterctlError
from clusterctl.vllmclient import Endpoint, RequestResult, stream_completion


@dataclass
class RunResult:
    """One concurrency level: per-request results, wall duration (s), the generator's CPU seconds and, for the
    asyncio generator, how late each of its event loop's periodic timers fired (s)."""

    concurrency: int
    results: list[RequestResult]
    duration: float
    cpu_s: float
    loop_lag: list[float] = field(default_factory=list)


def arrival_times(n: int, rate: float | None, seed: int = 0) -> list[float]:
    """Send offsets (s) of ``n`` requests: all at 0 when ``rate`` is None, else a Poisson process of
    ``rate`` requests/s (exponential gaps), as ``vllm bench serve --request-rate``."""
    if rate is None:
        return [0.0] * n
    if rate <= 0:
        raise ClusterctlError(f"request rate must be above 0, not {rate}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def run(
    ep: Endpoint,
    prompts: Sequence[str],
    concurrency: int,
    output_len: int,
    *,
    model: str | None = None,
    timeout: float = 60.0,
    ignore_eos: bool = True,
    request_rate: float | None = None,
    seed: int = 0,
) -> RunResult:
    """Send every prompt with at most ``concurrency`` in flight, each not before its Poisson arrival time
    when ``request_rate`` (req/s) is given; returns when all have finished or failed."""
    if concurrency < 1:
        raise ClusterctlError(f"concurrency must be at least 1, not {concurrency}")
    results: list[RequestResult] = []
    lock = threading.Lock()
    todo = iter(zip(arrival_times(len(prompts), request_rate, seed), prompts))
    start = [0.0]

    def worker() -> None:
        while True:
            with lock:
                item = next(todo, None)
            if item is None:
                return
            at, prompt = item
            delay = start[0] + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            body: dict[str, object] = {
                "prompt": prompt,
                "max_tokens": output_len,
                "temperature": 0,
                "ignore_eos": ignore_eos,
            }
            if model:
                body["model"] = model
            r = stream_completion(ep, body, timeout)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, max(1, len(prompts))))]
    cpu0, t0 = time.process_time(), time.perf_counter()
    start[0] = t0
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return RunResult(concurrency, results, time.perf_counter() - t0, time.process_time() - cpu0)
