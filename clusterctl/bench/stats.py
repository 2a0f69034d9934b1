"""Aggregate per-request timings the way ``vllm bench serve`` does.

Definitions (vLLM, ``vllm/benchmarks/serve.py``), all times in seconds here and
milliseconds in reports:

- TTFT: the first chunk with a non-empty ``choices`` list (its text may be
  empty: special or byte-fallback tokens) minus the send time.
- ITL: every gap between successive such chunks (a flat list over requests).
- TPOT: ``(e2e - ttft) / (output_tokens - 1)``, only for requests with more
  than one output token (the first token is excluded).
- E2E: the last chunk with ``choices`` minus the send time (the usage chunk
  and ``[DONE]`` after it do not count).

Goodput counts requests that meet every SLO given (DistServe's definition; a
request with one output token has TPOT 0 for this purpose, as in vLLM).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from clusterctl.vllmclient import RequestResult


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``p`` in 0..100; NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean, median, p90 and p99 of ``values`` (seconds) in milliseconds; NaN when empty."""
    if not values:
        return {"mean": math.nan, "median": math.nan, "p90": math.nan, "p99": math.nan}
    return {
        "mean": 1000 * sum(values) / len(values),
        "median": 1000 * percentile(values, 50),
        "p90": 1000 * percentile(values, 90),
        "p99": 1000 * percentile(values, 99),
    }


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in milliseconds; None = not required."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        if self.ttft_ms is not None and 1000 * r.ttft > self.ttft_ms:
            return False
        if self.tpot_ms is not None and 1000 * (r.tpot or 0.0) > self.tpot_ms:
            return False
        return self.e2e_ms is None or 1000 * r.e2e <= self.e2e_ms


def aggregate(
    results: Sequence[RequestResult], duration: float, concurrency: int, slo: Slo | None = None
) -> dict[str, object]:
    """The report of one run: counts, throughputs (per second of ``duration``) and latency summaries (ms)."""
    done = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.input_tokens for r in done)
    dur = max(duration, 1e-9)
    report: dict[str, object] = {
        "concurrency": concurrency,
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(done) / dur,
        "output_throughput": out_tokens / dur,
        "total_token_throughput": (in_tokens + out_tokens) / dur,
        "ttft_ms": summarize([r.ttft for r in done]),
        "tpot_ms": summarize([t for r in done if (t := r.tpot) is not None]),
        "itl_ms": summarize([g for r in done for g in r.itl]),
        "e2e_ms": summarize([r.e2e for r in done]),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }
    if slo is not None:
        report["goodput"] = sum(1 for r in done if slo.met(r)) / dur
    return report
