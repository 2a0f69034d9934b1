"""Release gates in the deploy engine's own terms: :class:`~clusterctl.deploy.rollout.gates.GateTarget` in,
:class:`~clusterctl.deploy.rollout.gates.GateResult` out (step ``drift`` or ``bench``).

After a batch's health gates pass (``gates.wait_gates``), the engine can call
:func:`release_gates` with the same targets and treat a result with
``ok=False`` like a failed health gate (the batch is rolled back), except one
with ``inconclusive`` (the gate could not decide): the deploy engine keeps the
batch and pauses the rollout there.

- drift: each target against the named baseline (:func:`clusterctl.drift.gate.drift_gate`);
- bench: each target against the instance ``reference(target)`` returns (one
  still on the previous version; None skips it) with
  :func:`clusterctl.bench.gate.bench_gate`.

Targets are checked one after another (a bench run must not share the
machine with another); each result's ``seconds`` is its own duration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clusterctl.bench.gate import GateOutcome, bench_gate
from clusterctl.deploy.rollout.gates import GateResult, GateTarget
from clusterctl.drift.gate import drift_gate


def release_gates(
    targets: Sequence[GateTarget],
    *,
    drift_baseline: str | None = "previous",
    bench_reference: Callable[[GateTarget], GateTarget | None] | None = None,
    drift_options: Mapping[str, Any] | None = None,
    bench_options: Mapping[str, Any] | None = None,
    on_result: Callable[[GateResult], None] | None = None,
) -> list[GateResult]:
    """One result per target and gate asked for (drift first, then bench; a target that fails drift is not
    benched).  ``drift_options`` / ``bench_options`` go to :func:`drift_gate` / :func:`bench_gate`
    (thresholds, timeout, concurrency, tolerance...)."""
    out: list[GateResult] = []

    def record(t: GateTarget, step: str, started: float, g: GateOutcome) -> bool:
        r = GateResult(
            t.instance,
            t.host,
            g.ok,
            step,
            g.reason,
            time.monotonic() - started,
            inconclusive=not g.ok and g.inconclusive,
        )
        out.append(r)
        if on_result is not None:
            on_result(r)
        return g.ok

    for t in targets:
        if drift_baseline is not None:
            t0 = time.monotonic()
            if not record(
                t, "drift", t0, drift_gate(t.url, drift_baseline, api_key=t.api_key, **dict(drift_options or {}))
            ):
                continue
        ref = bench_reference(t) if bench_reference is not None else None
        if ref is not None:
            t0 = time.monotonic()
            record(
                t,
                "bench",
                t0,
                bench_gate(
                    t.url, ref.url, api_key=t.api_key, reference_api_key=ref.api_key, **dict(bench_options or {})
                ),
            )
    return out
