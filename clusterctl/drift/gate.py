"""Release gate on outputs: the canary's greedy outputs against a named baseline (typically ``previous``).

The deploy engine calls :func:`drift_gate` after a batch passed its health
gates; a failing gate means the batch is rolled back.  Limits are those of
``drift check`` (per model in ``checks/drift.yaml``, widened to a calibrated
noise floor).  Errors (no baseline, unreachable canary) fail the gate: it
fails closed.
"""

from __future__ import annotations

from pathlib import Path

from clusterctl.bench.gate import GateOutcome
from clusterctl.drift import verdict
from clusterctl.errors import ClusterctlError
from clusterctl.vllmclient import Endpoint


def drift_gate(
    url: str,
    baseline: str = "previous",
    *,
    api_key: str | None = None,
    thresholds: str | Path | None = None,
    use_calibration: bool = True,
    timeout: float = 60.0,
    state_dir: Path | None = None,
) -> GateOutcome:
    """Replay ``baseline``'s prompts against ``url`` and pass when the drift check passes; ``timeout`` (s)
    bounds each request; ``state_dir`` is where baselines live (default ``$XDG_STATE_HOME/clusterctl``)."""
    try:
        ep = Endpoint.parse(url).with_key(api_key)
        v = verdict.check(
            ep, baseline, thresholds=thresholds, use_calibration=use_calibration, state_dir=state_dir, timeout=timeout
        )
    except ClusterctlError as e:
        return GateOutcome(False, f"drift gate could not run: {e}")
    s = v.summary
    details = {
        "baseline": baseline,
        "url": ep.url,
        "summary": s,
        "reasons": v.reasons,
        "calibrated": v.calibrated,
        "thresholds": vars(v.limits),
    }
    text = f"exact match {s['exact_match']:.0%}, vLLM rule {s['vllm_rule_pass']:.0%}, mean KL {s['mean_kl']:.4f}"
    if v.passed:
        return GateOutcome(True, f"outputs match baseline {baseline!r}: {text}", details)
    return GateOutcome(False, f"outputs drifted from baseline {baseline!r}: {'; '.join(v.reasons)}", details)
