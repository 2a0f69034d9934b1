"""Health gates against a real simulator process on 127.0.0.1 (--time-scale 0)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clusterctl.deploy.rollout.gates import GateTarget, unit_failure, wait_gates
from clusterctl.lab.vllm_sim import synth
from clusterctl.lab.vllm_sim.serve import free_port
from unit.vllm_sim.conftest import host, nvml_lib, start_sim  # noqa: F401  (fixtures)

KEY = "gate-key-123"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gates")
    synth.write_model("tiny", root / "tiny", sparse=False)
    return root / "tiny"


@pytest.fixture
def sim(start_sim, host: Path, tiny: Path):  # noqa: F811
    s = start_sim(host, tiny, "--served-model-name", "tiny", "--max-model-len", "2048", env={"VLLM_API_KEY": KEY})
    assert s.wait_for("Application startup complete.", 60), s.log
    return s


def target(port: int, name: str = "tiny", key: str | None = KEY) -> GateTarget:
    return GateTarget("i1", "h1", "127.0.0.1", port, name, key)


def test_a_serving_instance_passes_every_step(sim) -> None:
    [r] = wait_gates([target(sim.port)], timeout_s=20, poll_s=0.1)
    assert r.ok and r.step == "completion", r


def test_wrong_served_name_fails_at_the_models_step(sim) -> None:
    [r] = wait_gates([target(sim.port, name="other")], timeout_s=1.5, poll_s=0.2)
    assert not r.ok and r.step == "models" and "'other'" in r.reason


def test_a_wrong_key_fails_the_completion_and_never_shows_the_key(sim) -> None:
    [r] = wait_gates([target(sim.port, key="wrong-key")], timeout_s=1.5, poll_s=0.2)
    assert not r.ok and r.step in ("models", "completion") and "401" in r.reason
    assert "wrong-key" not in r.reason and KEY not in r.reason


def test_a_hung_engine_passes_health_but_fails_the_completion_within_the_timeout(start_sim, host, tiny) -> None:  # noqa: F811
    # Time scale 0 would make the engine's execute timeout (which ends a hang) instant.
    sim = start_sim(
        host,
        tiny,
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "2048",
        scale="0.001",
        env={"VLLM_API_KEY": KEY, "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "10000000"},
    )
    assert sim.wait_for("Application startup complete.", 60), sim.log
    assert sim.post("/sim/fault", {"fault": "hang"})[0] == 200
    t0 = time.monotonic()
    [r] = wait_gates([target(sim.port)], timeout_s=3, poll_s=0.2, request_timeout_s=1)
    assert not r.ok and r.step == "completion" and "not ready after 3 s" in r.reason
    assert time.monotonic() - t0 < 6
    assert sim.get("/health")[0] == 200  # what /health alone would have accepted


def test_nothing_listening_times_out_at_the_health_step() -> None:
    [r] = wait_gates([target(free_port())], timeout_s=1, poll_s=0.2)
    assert not r.ok and r.step == "health" and "not ready after 1 s" in r.reason


def test_a_dead_unit_fails_at_once_without_waiting_for_the_timeout() -> None:
    t0 = time.monotonic()
    [r] = wait_gates([target(free_port())], timeout_s=30, units=lambda: {"i1": ("activating", "auto-restart", 1)})
    assert not r.ok and r.step == "unit" and "NRestarts 1" in r.reason and time.monotonic() - t0 < 2


@pytest.mark.parametrize(
    "state,dead",
    [
        (("active", "running", 0), False),
        (("activating", "start", 0), False),
        (None, False),
        (("failed", "failed", 0), True),
        (("activating", "auto-restart", 0), True),
        (("active", "running", 2), True),
        (("inactive", "dead", 0), True),
    ],
)
def test_unit_states_that_mean_the_engine_died(state, dead: bool) -> None:
    assert (unit_failure(target(1), state) is not None) is dead


def test_the_gate_returns_as_soon_as_every_target_passed_without_a_last_wait(sim) -> None:
    t0 = time.monotonic()
    [r] = wait_gates([target(sim.port)], timeout_s=20, poll_s=5)
    assert r.ok and time.monotonic() - t0 < 2.5  # it slept one more poll_s after the pass before


def test_an_engine_ready_just_after_the_first_round_is_not_held_back_a_whole_poll(sim) -> None:
    t0 = time.monotonic()
    # the unit reads "activating" for 0.3 s (a short load), then "active"
    units = lambda: {"i1": ("active", "running", 0) if time.monotonic() - t0 > 0.3 else ("activating", "start", 0)}  # noqa: E731
    [r] = wait_gates([target(sim.port)], timeout_s=20, poll_s=4, units=units)
    took = time.monotonic() - t0
    assert r.ok and 0.3 < took < 2.5, took  # rounds at 0, 0.25, 0.75 s (then every poll_s): before, 4 s
