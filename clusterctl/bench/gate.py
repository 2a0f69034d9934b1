"""Release gate on performance: the canary against the version it replaces, same workload, within a tolerance.

The deploy engine calls :func:`bench_gate` after a batch passed its health
gates, with the canary's URL and the URL of an instance still on the previous
version; a failing gate means the batch is rolled back.  Errors (unreachable,
failed requests) fail the gate: it fails closed.

So that the verdict is the change, not noise or the load generator:

- **like with like**: per level, rounds of ``requests`` go to the reference
  then the canary, alternately (A B A B ...), with the same prompts, so both
  see the same background load; each side's other traffic during the gate
  (its ``/metrics`` request count minus ours) is recorded, and when one
  served other traffic (it is in a gateway) and the other did not, the gate
  is inconclusive: measure both off the gateway, or both in it;
- **noise below the tolerance**: rounds are added (up to ``max_rounds``)
  until the 95 % confidence interval of the relative change of mean TTFT,
  TPOT and E2E is narrower than the tolerance either side; the intervals
  are in the details and the reason;
- **trusted numbers**: a level the trust check flags (:mod:`clusterctl.bench.trust`)
  on either side is measured again once; still flagged, the gate is
  inconclusive.

An inconclusive gate does not pass (``ok`` False, ``inconclusive`` True): it
is neither a pass nor a regression, and its reason says what to change.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterctl.bench import runner, server_metrics, trust
from clusterctl.bench.compare import compare
from clusterctl.bench.loadgen import RunResult
from clusterctl.bench.stats import aggregate
from clusterctl.errors import ClusterctlError
from clusterctl.vllmclient import Endpoint, RequestResult, synthetic_prompt

#: Per-request metrics whose mean change gets a confidence interval (name in the comparison, value of a result).
CI_METRICS = {"ttft_ms.mean": lambda r: r.ttft, "tpot_ms.mean": lambda r: r.tpot, "e2e_ms.mean": lambda r: r.e2e}
#: Other traffic, as a share of the gate's own requests, above which a side counts as serving other users.
OTHER_TRAFFIC_SHARE = 0.1


@dataclass(frozen=True)
class GateOutcome:
    """``ok`` passes the gate; ``reason`` is one line for the rollout's report; ``details`` is JSON-ready;
    ``inconclusive``: the measurement could not decide (not ok, and not a regression either)."""

    ok: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)
    inconclusive: bool = False


def change_ci(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """(relative change of the mean from ``a`` to ``b``, half-width of its 95 % confidence interval), by the
    normal approximation of the difference of two means (Welch); None with fewer than 2 values a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    if ma <= 0:
        return None
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1)
    return (mb - ma) / ma, 1.96 * math.sqrt(va / len(a) + vb / len(b)) / ma


def _requests_served(ep: Endpoint, timeout: float) -> float | None:
    try:
        m = server_metrics.scrape(ep, min(timeout, 10.0))
    except ClusterctlError:
        return None
    return m.get("vllm:request_success_total")


def _level(
    ep: Endpoint, prompts: list[str], level: int, output_len: int, timeout: float, seed: int
) -> tuple[RunResult, dict[str, Any]]:
    """One round on one side, with the server's timings around it and the trust check."""
    before = server_metrics_or_none(ep, timeout)
    run = runner.run(ep, prompts, level, output_len, timeout=timeout, seed=seed)
    rep = aggregate(run.results, run.duration, level)
    rep["generator_cpu_percent"] = 100 * run.cpu_s / max(run.duration, 1e-9)
    after = server_metrics_or_none(ep, timeout) if before is not None else None
    ttft = tpot = None
    if before is not None and after is not None:
        ttft = server_metrics.histogram_mean(before, after, "vllm:time_to_first_token_seconds")
        tpot = server_metrics.histogram_mean(before, after, "vllm:request_time_per_output_token_seconds")
    rep["trust"] = trust.judge(run, rep, ttft, tpot)
    return run, rep


def server_metrics_or_none(ep: Endpoint, timeout: float) -> dict[str, float] | None:
    try:
        return server_metrics.scrape(ep, min(timeout, 10.0))
    except ClusterctlError:
        return None


def bench_gate(
    url: str,
    reference_url: str,
    *,
    api_key: str | None = None,
    reference_api_key: str | None = None,
    concurrency: Sequence[int] = (1, 8),
    requests: int = 16,
    input_len: int = 256,
    output_len: int = 64,
    tolerance: float = 0.1,
    timeout: float = 60.0,
    seed: int = 0,
    max_rounds: int = 4,
) -> GateOutcome:
    """Run the same prompts at each ``concurrency`` level against ``reference_url`` (A, previous version)
    and ``url`` (B, the canary), alternately, in rounds of ``requests`` until the noise is below the tolerance
    (see the module doc); fail on any failed request or a regression beyond ``tolerance`` (relative: latency
    up or throughput down, see :mod:`clusterctl.bench.compare`).  ``timeout`` (s) bounds each request."""
    try:
        a, b = Endpoint.parse(reference_url).with_key(reference_api_key), Endpoint.parse(url).with_key(api_key)
    except ClusterctlError as e:
        return GateOutcome(False, f"bench gate could not run: {e}")
    rng = random.Random(seed)
    served0 = {"a": _requests_served(a, timeout), "b": _requests_served(b, timeout)}
    sent = {"a": 0, "b": 0}
    reports: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    intervals: list[dict[str, Any]] = []
    untrusted: list[str] = []
    try:
        for level in concurrency:
            res: dict[str, list[RequestResult]] = {"a": [], "b": []}
            dur = {"a": 0.0, "b": 0.0}
            cis: dict[str, tuple[float, float] | None] = {}
            retried = False
            for _round in range(max_rounds):
                prompts = [synthetic_prompt(input_len, rng) for _ in range(requests)]
                for side, ep in (("a", a), ("b", b)):
                    run, rep = _level(ep, prompts, level, output_len, timeout, seed)
                    sent[side] += len(prompts)
                    if not rep["trust"]["trusted"] and not retried:
                        retried = True  # once per level: measure that round again
                        run, rep = _level(ep, prompts, level, output_len, timeout, seed)
                        sent[side] += len(prompts)
                    if not rep["trust"]["trusted"]:
                        untrusted.append(
                            f"{'canary' if side == 'b' else 'reference'} at {level}: "
                            + "; ".join(rep["trust"]["reasons"])
                        )
                    res[side] += run.results
                    dur[side] += run.duration
                if untrusted or any(not r.ok for side in res.values() for r in side):
                    break
                cis = {
                    m: change_ci(
                        [x for r in res["a"] if (x := f(r)) is not None],
                        [x for r in res["b"] if (x := f(r)) is not None],
                    )
                    for m, f in CI_METRICS.items()
                }
                if all(ci is None or ci[1] < tolerance for ci in cis.values()):
                    break
            for side in ("a", "b"):
                reports[side].append(aggregate(res[side], dur[side], level))
            intervals.append(
                {
                    "concurrency": level,
                    "requests_per_side": len(res["a"]),
                    **{m: None if ci is None else {"change": ci[0], "ci95": ci[1]} for m, ci in cis.items()},
                }
            )
            if untrusted:
                break
    except ClusterctlError as e:
        return GateOutcome(False, f"bench gate could not run: {e}")
    rows = compare(reports["a"], reports["b"], tolerance)
    other = _other_traffic(a, b, served0, sent, timeout)
    details = {
        "reference": a.url,
        "canary": b.url,
        "tolerance": tolerance,
        "comparison": rows,
        "intervals": intervals,
        "other_traffic": other,
        "untrusted": untrusted,
    }
    failed = {side: sum(r["failed"] for r in reps) for side, reps in reports.items()}
    if failed["b"] or failed["a"]:
        errors = sorted({e for reps in reports.values() for r in reps for e in r["errors"]})[:3]
        return GateOutcome(
            False, f"failed requests: canary {failed['b']}, reference {failed['a']} ({'; '.join(errors)})", details
        )
    if untrusted:
        return GateOutcome(
            False,
            "bench gate inconclusive: the load generator's numbers cannot be trusted ("
            + "; ".join(untrusted[:2])
            + "); give it a core of its own",
            details,
            inconclusive=True,
        )
    noisy = [
        f"{m} at {iv['concurrency']} +/-{iv[m]['ci95']:.0%}"
        for iv in intervals
        for m in CI_METRICS
        if iv.get(m) and iv[m]["ci95"] >= tolerance
    ]
    if noisy:
        return GateOutcome(
            False,
            f"bench gate inconclusive: noise above the tolerance ({tolerance:.0%}) after "
            f"{max_rounds} rounds of {requests}: {', '.join(noisy[:3])}; raise requests",
            details,
            inconclusive=True,
        )
    if other.get("unlike"):
        return GateOutcome(
            False, f"bench gate inconclusive: not like with like ({other['unlike']})", details, inconclusive=True
        )
    worse = [r for r in rows if r["regression"]]
    ci_text = ", ".join(
        f"{m.split('.')[0]} {iv[m]['change']:+.0%}+/-{iv[m]['ci95']:.0%}"
        for iv in intervals[:1]
        for m in CI_METRICS
        if iv.get(m)
    )
    if worse:
        text = ", ".join(f"{r['metric']} at {r['concurrency']} {r['change']:+.0%}" for r in worse[:4])
        return GateOutcome(False, f"regression beyond {tolerance:.0%}: {text} (95 % CI: {ci_text})", details)
    return GateOutcome(
        True,
        f"no regression beyond {tolerance:.0%} at concurrency "
        f"{','.join(str(c) for c in concurrency)} (95 % CI: {ci_text})",
        details,
    )


def _other_traffic(
    a: Endpoint, b: Endpoint, before: dict[str, float | None], sent: dict[str, int], timeout: float
) -> dict[str, Any]:
    """Requests each side served during the gate beyond the ``sent`` by the gate, and ``unlike`` when one
    served other traffic and the other did not."""
    out: dict[str, Any] = {}
    for side, key, ep in (("reference", "a", a), ("canary", "b", b)):
        now = _requests_served(ep, timeout)
        was = before[key]
        out[side] = None if now is None or was is None else max(0.0, now - was - sent[key])
    ours = max(1.0, min(sent.values()))
    busy = {side: n is not None and n > OTHER_TRAFFIC_SHARE * ours for side, n in out.items()}
    if busy["reference"] != busy["canary"] and None not in out.values():
        which = "canary" if busy["canary"] else "reference"
        out["unlike"] = (
            f"the {which} served {out[which]:.0f} other requests during the gate and the other "
            f"{out['reference' if which == 'canary' else 'canary']:.0f}: measure both off the gateway "
            "or both in it"
        )
    return out
