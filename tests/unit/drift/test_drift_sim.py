"""Drift baseline/check/calibrate and the leak check against simulator subprocesses on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clusterctl.drift import compare, leak, prompts, run, store
from clusterctl.lab.vllm_sim import synth
from clusterctl.vllmclient import Endpoint

from .conftest import READY

PROMPTS = Path(__file__).resolve().parents[3] / "checks" / "drift" / "basic.jsonl"
THRESHOLDS = Path(__file__).resolve().parents[3] / "checks" / "drift.yaml"


def _up(start_sim: Any, host: Path, model: Path, *flags: str, scale: str = "0") -> Any:
    sim = start_sim(host, model, *flags, scale=scale)
    assert sim.wait_for(READY), sim.log
    return sim


def test_quantized_instance_fails_and_a_second_full_precision_one_passes(
    host, models, start_sim, tmp_path: Path
) -> None:
    awq = tmp_path / "qwen3-8b-awq"
    synth.write_model("qwen3-8b", awq, sparse=True, quantization="awq")
    ps = prompts.load(PROMPTS)
    limits = compare.load_thresholds(THRESHOLDS, None)

    sim = _up(start_sim, host, models["qwen3-8b"], "--no-sim-batch-noise")
    base = run.record(Endpoint.parse(sim.url), "reference", ps, k=8, extra_env={"quantization": None})
    store.save(base, tmp_path)
    assert sim.stop() == 0
    base = store.load("reference", tmp_path)
    assert base.env["model"] and len(base.outputs) == len(ps)

    results = {}
    for name, model in (("fp", models["qwen3-8b"]), ("awq", awq)):
        sim = _up(start_sim, host, model, "--no-sim-batch-noise")
        s = compare.summarize(run.check(Endpoint.parse(sim.url), base))
        results[name] = (s, limits.judge(s))
        assert sim.stop() == 0
    fp, awq_r = results["fp"], results["awq"]
    assert fp[1] == [] and fp[0]["exact_match"] == 1.0 and fp[0]["mean_kl"] == 0.0
    assert awq_r[1], awq_r  # fails a threshold
    assert awq_r[0]["exact_match"] < 0.9 and awq_r[0]["mean_kl"] > 0


def test_calibration_under_load_sets_limits_a_healthy_twin_passes(host, models, start_sim, tmp_path: Path) -> None:
    ps = prompts.load(PROMPTS)[:6]
    sim = _up(start_sim, host, models["qwen3-8b"], scale="0.02")  # batch noise on
    ep = Endpoint.parse(sim.url)
    cal = run.calibrate(ep, ps, runs=2, background=3)
    floor = cal["floor"]
    assert 0.0 <= floor["mean_kl"] and 0.5 <= floor["exact_match"] <= 1.0
    limits = compare.Thresholds(min_exact_match=1.0, max_mean_kl=0.0).calibrated(floor)
    assert limits.max_mean_kl >= 2 * floor["mean_kl"] and limits.min_exact_match <= floor["exact_match"]
    base = run.record(ep, "self", ps)
    assert limits.judge(compare.summarize(run.check(ep, base))) == []
    assert sim.stop() == 0


def test_leak_check_catches_the_leak_fault_and_is_quiet_when_healthy(host, models, start_sim) -> None:
    import json
    import urllib.request

    sim = _up(start_sim, host, models["qwen3-8b"], scale="0.02")  # batch noise on, requests overlap
    ep = Endpoint.parse(sim.url)
    healthy = leak.run(ep, sessions=4, requests=4, seed=1)
    assert healthy.failed == 0 and healthy.requests == 16 and healthy.sightings == []
    req = urllib.request.Request(
        sim.url + "/sim/fault",
        data=json.dumps({"fault": "leak"}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()
    leaky = leak.run(ep, sessions=4, requests=4, seed=2)
    assert leaky.sightings and all(s.owner != s.seen_by for s in leaky.sightings)
    assert sim.stop() == 0


def test_baseline_skips_prompts_longer_than_the_context_with_a_note(host, models, start_sim, tmp_path: Path) -> None:
    """--max-model-len 512: the two long prompts cannot fit; vLLM answers 400 and the baseline goes on."""
    ps = prompts.load(PROMPTS)
    sim = _up(start_sim, host, models["tiny"], "--max-model-len", "512")
    ep = Endpoint.parse(sim.url)
    base = run.record(ep, "short-ctx", ps, k=4)
    assert sorted(base.skipped) == ["long-sensors", "long-story"]
    assert all("maximum context length is 512" in why for why in base.skipped.values())
    assert set(base.outputs) == {p.id for p in ps} - set(base.skipped) and base.env["max_model_len"] == 512
    store.save(base, tmp_path)
    again = store.load("short-ctx", tmp_path)
    assert again.skipped == base.skipped
    assert compare.summarize(run.check(ep, again))["exact_match"] == 1.0  # only the recorded prompts are sent
    assert sim.stop() == 0
