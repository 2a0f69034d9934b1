"""ops/autoscale.py: the daemon's loop (rounds, a failed round, stopping) without fleets."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from clusterctl.errors import ClusterctlError
from clusterctl.ops import autoscale as ops_autoscale


def _request(interval_s: float = 0.01) -> Any:
    return ops_autoscale.AutoscaleRequest(
        inventory=None,
        state_dir=Path("/nonexistent"),  # type: ignore[arg-type]
        make_fleet=None,  # type: ignore[arg-type]
        policies={"chat": SimpleNamespace(interval_s=interval_s)},
    )  # type: ignore[dict-item]


def test_daemon_runs_n_rounds_and_a_failed_round_does_not_end_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []

    def fake_round(
        inv: Any, state_dir: Path, make: Any, policies: Any, *, lock_wait_s: float, on_event: Any
    ) -> list[str]:
        calls.append(lock_wait_s)
        if len(calls) == 2:
            raise ClusterctlError("the autoscaler's lock is busy")
        return [f"outcome {len(calls)}"]

    monkeypatch.setattr(ops_autoscale, "run_round", fake_round)
    rounds: list[list[Any]] = []
    errors: list[str] = []
    n = ops_autoscale.run_daemon(
        _request(), interval=None, rounds=3, should_stop=lambda: False, on_round=rounds.append, on_error=errors.append
    )
    assert n == 3 and calls == [0.01, 0.01, 0.01]  # the lock waits one interval (the policies' smallest)
    assert rounds == [["outcome 1"], [], ["outcome 3"]]
    assert errors == ["autoscaler: round failed: the autoscaler's lock is busy"]


def test_daemon_stops_when_asked_after_the_round_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    stop = {"now": False}

    def fake_round(*args: Any, **kw: Any) -> list[str]:
        stop["now"] = True  # SIGTERM arrives during the round
        return ["done"]

    monkeypatch.setattr(ops_autoscale, "run_round", fake_round)
    rounds: list[list[Any]] = []
    n = ops_autoscale.run_daemon(
        _request(interval_s=60),
        interval=None,
        rounds=0,
        should_stop=lambda: stop["now"],
        on_round=rounds.append,
        on_error=lambda m: None,
    )
    assert n == 1 and rounds == [["done"]]  # no 60 s wait once stopped


def test_explicit_interval_wins_over_the_policies() -> None:
    assert ops_autoscale.daemon_interval(_request(interval_s=30), 2.5) == 2.5
    assert ops_autoscale.daemon_interval(_request(interval_s=30), None) == 30


def test_an_edited_inventory_applies_from_the_next_round_and_a_broken_edit_keeps_the_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon runs for days: an operator's edit of max replicas must not need a restart, and a
    half-saved file must neither stop it nor replace the policy it runs with."""
    import os

    from clusterctl.inventory.loader import load_inventory
    from tests.unit.autoscale.test_policy import BASE

    inv_file = tmp_path / "inv.yaml"
    inv_file.write_text(BASE + "    autoscale: {min: 1, max: 4}\n")
    inv = load_inventory(str(inv_file))
    from clusterctl.autoscale.run import autoscaled

    request = ops_autoscale.AutoscaleRequest(inv, tmp_path, None, autoscaled(inv, []))  # type: ignore[arg-type]
    seen: list[int] = []

    def fake_round(
        inv: Any, state_dir: Path, make: Any, policies: Any, *, lock_wait_s: float, on_event: Any
    ) -> list[str]:
        seen.append(policies["pool"].max_replicas)
        n = len(seen)
        if n == 1:  # between rounds the operator raises max to 6 ...
            inv_file.write_text(BASE + "    autoscale: {min: 1, max: 6}\n")
        elif n == 2:  # ... then saves a broken file (low above high) ...
            inv_file.write_text(BASE + "    autoscale: {min: 1, max: 8, low: 0.9}\n")
        elif n == 3:  # ... then fixes it; same size as before, so the mtime must tell
            inv_file.write_text(BASE + "    autoscale: {min: 1, max: 7, low: 0.1}\n")
            st = os.stat(inv_file)
            os.utime(inv_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        return []

    monkeypatch.setattr(ops_autoscale, "run_round", fake_round)
    errors: list[str] = []
    events: list[str] = []
    n = ops_autoscale.run_daemon(
        request,
        interval=0.01,
        rounds=5,
        should_stop=lambda: False,
        on_round=lambda outs: None,
        on_error=errors.append,
        on_event=events.append,
        reload=ops_autoscale.inventory_reloader(request),
    )
    assert n == 5
    assert seen == [4, 6, 6, 7, 7]  # the broken edit kept max 6; an unchanged file is not read again
    assert len(errors) == 1 and errors[0].startswith("autoscaler: inventory not reloaded, the previous one is kept: ")
    assert f"{inv_file}:" in errors[0] and "low (0.9) must be below high" in errors[0]
    assert events == ["autoscaler: inventory reloaded (pool)"] * 2


def test_an_inventory_without_any_policy_any_more_is_refused_on_reload(tmp_path: Path) -> None:
    from clusterctl.autoscale.run import autoscaled
    from clusterctl.inventory.loader import load_inventory
    from tests.unit.autoscale.test_policy import BASE

    inv_file = tmp_path / "inv.yaml"
    inv_file.write_text(BASE + "    autoscale: {min: 1, max: 4}\n")
    inv = load_inventory(str(inv_file))
    request = ops_autoscale.AutoscaleRequest(inv, tmp_path, None, autoscaled(inv, []))  # type: ignore[arg-type]
    reload = ops_autoscale.inventory_reloader(request)
    assert reload(request) is None  # unchanged
    inv_file.write_text(BASE)
    with pytest.raises(ClusterctlError, match="no template has an autoscale: policy any more"):
        reload(request)
    inv_file.unlink()
    with pytest.raises(ClusterctlError, match="cannot read the inventory"):
        reload(request)
