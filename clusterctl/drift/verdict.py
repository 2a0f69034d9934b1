"""A drift check from start to verdict: baseline, limits (per model, widened to the noise floor), replay, judge.

Shared by ``clusterctl drift check``, ``doctor --checks drift`` and the
release gate (:mod:`clusterctl.drift.gate`).  Errors (missing baseline, bad
threshold file, unreachable endpoint) raise ClusterctlError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.drift import compare, run, store
from clusterctl.vllmclient import Endpoint
from clusterctl.diagnose.thresholds import check_file


@dataclass
class Verdict:
    """``reasons`` is empty when the check passes; ``summary`` is :func:`compare.summarize`'s."""

    baseline: str
    summary: dict[str, Any]
    reasons: list[str]
    limits: compare.Thresholds
    calibrated: bool
    diffs: list[compare.PromptDiff]

    @property
    def passed(self) -> bool:
        return not self.reasons


def check(
    ep: Endpoint,
    baseline: str,
    *,
    thresholds: str | Path | None = None,
    use_calibration: bool = True,
    state_dir: Path | None = None,
    timeout: float = 60.0,
) -> Verdict:
    """Replay ``baseline``'s prompts against ``ep`` and judge them against the limits of the baseline's model
    (``thresholds`` file, default ``checks/drift.yaml``), widened to its calibrated noise floor if any;
    ``timeout`` (s) bounds each request."""
    base = store.load(baseline, state_dir)
    model = base.env.get("model")
    limits = compare.load_thresholds(thresholds or check_file("drift.yaml"), model)
    cal = store.load_calibration(model, state_dir) if use_calibration and model else None
    if cal:
        limits = limits.calibrated(cal["floor"])
    diffs = run.check(ep, base, timeout)
    summary = compare.summarize(diffs)
    return Verdict(baseline, summary, limits.judge(summary), limits, bool(cal), diffs)
