"""ops/autoscale.py: the daemon's loop (rounds, a failed round, stopping) without fleets."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from clusterctl.errors import ClusterctlError
from clusterctl.ops import autoscale as ops_autoscale


def _request(interval_s: float = 0.01) -> Any:
    return ops_autoscale.AutoscaleRequest(inventory=None, state_dir=Path("/nonexistent"),  # type: ignore[arg-type]
                                          make_fleet=None,  # type: ignore[arg-type]
                                          policies={"chat": SimpleNamespace(interval_s=interval_s)})  # type: ignore[dict-item]


def test_daemon_runs_n_rounds_and_a_failed_round_does_not_end_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []

    def fake_round(inv: Any, state_dir: Path, make: Any, policies: Any, *, lock_wait_s: float, on_event: Any) -> list[str]:
        calls.append(lock_wait_s)
        if len(calls) == 2:
            raise ClusterctlError("the autoscaler's lock is busy")
        return [f"outcome {len(calls)}"]

    monkeypatch.setattr(ops_autoscale, "run_round", fake_round)
    rounds: list[list[Any]] = []
    errors: list[str] = []
    n = ops_autoscale.run_daemon(_request(), interval=None, rounds=3, should_stop=lambda: False,
                                 on_round=rounds.append, on_error=errors.append)
    assert n == 3 and calls == [0.01, 0.01, 0.01]          # the lock waits one interval (the policies' smallest)
    assert rounds == [["outcome 1"], [], ["outcome 3"]]
    assert errors == ["autoscaler: round failed: the autoscaler's lock is busy"]


def test_daemon_stops_when_asked_after_the_round_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    stop = {"now": False}

    def fake_round(*args: Any, **kw: Any) -> list[str]:
        stop["now"] = True          # SIGTERM arrives during the round
        return ["done"]

    monkeypatch.setattr(ops_autoscale, "run_round", fake_round)
    rounds: list[list[Any]] = []
    n = ops_autoscale.run_daemon(_request(interval_s=60), interval=None, rounds=0, should_stop=lambda: stop["now"],
                                 on_round=rounds.append, on_error=lambda m: None)
    assert n == 1 and rounds == [["done"]]        # no 60 s wait once stopped


def test_explicit_interval_wins_over_the_policies() -> None:
    assert ops_autoscale.daemon_interval(_request(interval_s=30), 2.5) == 2.5
    assert ops_autoscale.daemon_interval(_request(interval_s=30), None) == 30
