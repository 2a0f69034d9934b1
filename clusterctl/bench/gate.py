"""Release gate on performance: the canary against the version it replaces, same workload, within a tolerance.

The deploy engine calls :func:`bench_gate` after a batch passed its health
gates, with the canary's URL and the URL of an instance still on the previous
version; a failing gate means the batch is rolled back.  Errors (unreachable,
failed requests) fail the gate: it fails closed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterctl.bench import runner
from clusterctl.bench.compare import compare
from clusterctl.bench.loadgen import Endpoint, synthetic_prompt
from clusterctl.bench.stats import aggregate
from clusterctl.errors import ClusterctlError


@dataclass(frozen=True)
class GateOutcome:
    """``ok`` passes the gate; ``reason`` is one line for the rollout's report; ``details`` is JSON-ready."""

    ok: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


def bench_gate(url: str, reference_url: str, *, api_key: str | None = None, reference_api_key: str | None = None,
               concurrency: Sequence[int] = (1, 8), requests: int = 16, input_len: int = 256, output_len: int = 64,
               tolerance: float = 0.1, timeout: float = 60.0, seed: int = 0) -> GateOutcome:
    """Run the same prompts at each ``concurrency`` level against ``reference_url`` (A, previous version)
    then ``url`` (B, the canary); fail on any failed request or a regression beyond ``tolerance`` (relative:
    latency up or throughput down, see :mod:`clusterctl.bench.compare`).  ``timeout`` (s) bounds each
    connect and silence; the gate takes about 2 x levels x (requests / level) request times."""
    try:
        a, b = Endpoint.parse(reference_url).with_key(reference_api_key), Endpoint.parse(url).with_key(api_key)
        rng = random.Random(seed)
        reports: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
        for level in concurrency:
            prompts = [synthetic_prompt(input_len, rng) for _ in range(requests)]
            for side, ep in (("a", a), ("b", b)):
                run = runner.run(ep, prompts, level, output_len, timeout=timeout, seed=seed)
                reports[side].append(aggregate(run.results, run.duration, level))
    except ClusterctlError as e:
        return GateOutcome(False, f"bench gate could not run: {e}")
    rows = compare(reports["a"], reports["b"], tolerance)
    details = {"reference": a.url, "canary": b.url, "tolerance": tolerance, "comparison": rows}
    failed = {side: sum(r["failed"] for r in reps) for side, reps in reports.items()}
    if failed["b"] or failed["a"]:
        errors = sorted({e for reps in reports.values() for r in reps for e in r["errors"]})[:3]
        return GateOutcome(False, f"failed requests: canary {failed['b']}, reference {failed['a']} "
                                  f"({'; '.join(errors)})", details)
    worse = [r for r in rows if r["regression"]]
    if worse:
        text = ", ".join(f"{r['metric']} at {r['concurrency']} {r['change']:+.0%}" for r in worse[:4])
        return GateOutcome(False, f"regression beyond {tolerance:.0%}: {text}", details)
    return GateOutcome(True, f"no regression beyond {tolerance:.0%} at concurrency "
                             f"{','.join(str(c) for c in concurrency)}", details)
