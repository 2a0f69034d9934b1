"""Simulator fixtures shared with the simulator's own tests (subprocesses on 127.0.0.1)."""

from __future__ import annotations

from vllm_sim.conftest import READY, host, models, nvml_lib, start_sim  # noqa: F401  (fixtures)

import math  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def trust_not_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests of workloads, reports and comparisons: on the shared 2-core machine the load may make a level
    untrusted (exit 3), which is right but not what they test; test_trust.py tests the judging itself."""
    from clusterctl.bench import trust

    for name in ("TTFT_ERROR_MS", "TPOT_ERROR_SHARE", "LAG_MS", "COALESCED_SHARE", "CPU_PERCENT"):
        monkeypatch.setattr(trust, name, math.inf)
