"""Release gates the deploy engine calls: drift_gate (outputs vs a baseline), bench_gate (canary vs previous)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clusterctl.bench.gate import bench_gate
from clusterctl.drift import prompts, run, store
from clusterctl.drift.gate import drift_gate
from clusterctl.lab.vllm_sim import synth
from clusterctl.lab.vllm_sim.serve import free_port
from clusterctl.vllmclient import Endpoint

from .conftest import READY

PROMPTS = Path(__file__).resolve().parents[3] / "checks" / "drift" / "basic.jsonl"


def test_drift_gate_passes_a_twin_and_stops_a_quantized_canary(host, models, start_sim, tmp_path: Path) -> None:
    awq = tmp_path / "qwen3-8b-awq"
    synth.write_model("qwen3-8b", awq, sparse=True, quantization="awq")
    prev = start_sim(host, models["qwen3-8b"], "--no-sim-batch-noise", scale="0")
    canary = start_sim(host, awq, "--no-sim-batch-noise", scale="0", gpus="1")
    assert prev.wait_for(READY) and canary.wait_for(READY), prev.log + canary.log
    state = tmp_path / "state"
    store.save(run.record(Endpoint.parse(prev.url), "previous", prompts.load(PROMPTS)), state)

    ok = drift_gate(prev.url, "previous", state_dir=state)
    assert ok.ok and "match baseline 'previous'" in ok.reason and ok.details["summary"]["exact_match"] == 1.0
    bad = drift_gate(canary.url, "previous", state_dir=state)
    assert not bad.ok and "drifted from baseline 'previous'" in bad.reason and bad.details["reasons"]
    missing = drift_gate(prev.url, "nope", state_dir=state)
    assert not missing.ok and "could not run" in missing.reason and "no baseline 'nope'" in missing.reason
    gone = drift_gate(f"http://127.0.0.1:{free_port()}", "previous", state_dir=state, timeout=2)
    assert not gone.ok and "could not run" in gone.reason
    assert prev.stop() == 0 and canary.stop() == 0


def test_bench_gate_passes_an_equal_canary_and_stops_a_slow_one(host, models, start_sim, trust_not_judged) -> None:
    # Time scale 3 (start-up at once): a simulated decode step of ~20 ms, ~100 ms slowed, dwarfs the per-token
    # cost of the HTTP stream and the load generator, which a loaded machine inflates on both sides alike; at
    # scale 0.25 (~1.5 ms a step) that cost alone hid the 5x slow-down under a load of 30.
    prev = start_sim(host, models["qwen3-8b"], scale="3", startup="0")
    canary = start_sim(host, models["qwen3-8b"], scale="3", gpus="1", startup="0")
    assert prev.wait_for(READY) and canary.wait_for(READY), prev.log + canary.log
    kw = {"concurrency": (2,), "requests": 4, "input_len": 32, "output_len": 8, "tolerance": 2.0}
    # The reference against itself: rounds alternate, so what the shared machine's load does to one round it
    # does to the next; any difference is noise, never a regression.
    same = bench_gate(prev.url, prev.url, **kw)  # type: ignore[arg-type]
    assert same.ok and "95 % CI: ttft" in same.reason, same.reason
    [iv] = same.details["intervals"]
    assert iv["requests_per_side"] >= 4 and iv["ttft_ms.mean"]["ci95"] < 2.0  # noise under the tolerance
    canary.post("/sim/fault", {"fault": "slowdown", "factor": 5})
    slow = bench_gate(canary.url, prev.url, **kw)  # type: ignore[arg-type]
    assert not slow.ok and "regression beyond 200%" in slow.reason and "tpot_ms.mean" in slow.reason
    assert slow.details["other_traffic"] == {"reference": 0.0, "canary": 0.0}  # like with like: only ours
    gone = bench_gate(f"http://127.0.0.1:{free_port()}", prev.url, timeout=2, **kw)  # type: ignore[arg-type]
    assert not gone.ok and "failed requests: canary 4, reference 0" in gone.reason
    assert prev.stop() == 0 and canary.stop() == 0


def test_release_gates_in_the_deploy_engines_terms(host, models, start_sim, trust_not_judged, tmp_path: Path) -> None:
    from clusterctl.deploy.rollout.gates import GateTarget
    from clusterctl.drift.release import release_gates

    awq = tmp_path / "qwen3-8b-awq"
    synth.write_model("qwen3-8b", awq, sparse=True, quantization="awq")
    sims = {
        "prev": start_sim(host, models["qwen3-8b"], "--no-sim-batch-noise", scale="0.05", startup="0"),
        "twin": start_sim(host, models["qwen3-8b"], "--no-sim-batch-noise", scale="0.05", gpus="1", startup="0"),
    }
    assert all(s.wait_for(READY) for s in sims.values()), [s.log for s in sims.values()]
    state = tmp_path / "state"
    store.save(run.record(Endpoint.parse(sims["prev"].url), "previous", prompts.load(PROMPTS)[:4]), state)

    def target(name: str) -> GateTarget:
        return GateTarget(name, f"host-{name}", "127.0.0.1", int(sims[name].url.rsplit(":", 1)[1]), "qwen3-8b")

    seen: list[str] = []
    kw: dict[str, Any] = {
        "bench_reference": lambda t: target("prev"),
        "drift_options": {"state_dir": state},
        # the wiring is under test here; the gate's sensitivity is tested above
        "bench_options": {"concurrency": (2,), "requests": 4, "input_len": 32, "output_len": 8, "tolerance": 50.0},
        "on_result": lambda r: seen.append(f"{r.instance}:{r.step}"),
    }
    twin = release_gates([target("twin")], **kw)
    assert [(r.instance, r.step, r.ok) for r in twin] == [("twin", "drift", True), ("twin", "bench", True)], [
        r.reason for r in twin
    ]
    assert sims.pop("twin").stop() == 0
    sims["awq"] = start_sim(host, awq, "--no-sim-batch-noise", scale="0.05", gpus="1", startup="0")
    assert sims["awq"].wait_for(READY), sims["awq"].log
    bad = release_gates([target("awq")], **kw)
    assert [(r.instance, r.step, r.ok) for r in bad] == [("awq", "drift", False)]  # not benched after drift failed
    assert bad[0].host == "host-awq" and "drifted from baseline 'previous'" in bad[0].reason
    assert seen == ["twin:drift", "twin:bench", "awq:drift"]
    assert all(s.stop() == 0 for s in sims.values())


def test_bench_gate_is_inconclusive_on_noise_or_untrusted_numbers(
    host, models, start_sim, trust_not_judged, monkeypatch
) -> None:
    from clusterctl.bench import gate, trust

    assert gate.change_ci([1.0, 1.0], [1.0, 1.0]) == (0.0, 0.0)
    change, half = gate.change_ci([10.0, 12.0, 11.0, 9.0], [20.0, 22.0, 21.0, 19.0])  # type: ignore[misc]
    assert change == pytest.approx(20.5 / 10.5 - 1) and 0 < half < 0.3
    prev = start_sim(host, models["qwen3-8b"], scale="0.05", startup="0")
    canary = start_sim(host, models["qwen3-8b"], scale="0.05", gpus="1", startup="0")
    assert prev.wait_for(READY) and canary.wait_for(READY), prev.log + canary.log
    kw = {"concurrency": (2,), "requests": 2, "input_len": 8, "output_len": 4, "max_rounds": 2}
    # a tolerance no measurement can resolve: more rounds, then inconclusive, never a pass or a regression
    noisy = gate.bench_gate(canary.url, prev.url, tolerance=1e-6, **kw)  # type: ignore[arg-type]
    assert not noisy.ok and noisy.inconclusive and "noise above the tolerance" in noisy.reason, noisy.reason
    assert noisy.details["intervals"][0]["requests_per_side"] == 4
    # a starved generator (every level flagged): measured again once, then inconclusive
    monkeypatch.setattr(trust, "judge", lambda *a, **k: {"trusted": False, "reasons": ["loop 12 ms late"]})
    starved = gate.bench_gate(canary.url, prev.url, tolerance=1.0, **kw)  # type: ignore[arg-type]
    assert not starved.ok and starved.inconclusive and "cannot be trusted" in starved.reason, starved.reason
    assert prev.stop() == 0 and canary.stop() == 0
