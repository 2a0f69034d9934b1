"""``report run --active``: drift, leak and TTFT checks against simulator subprocesses on 127.0.0.1,
as findings and metrics a report run stores, compares and charts."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from unit.vllm_sim.conftest import READY

from clusterctl.diagnose.findings import Severity
from clusterctl.drift import prompts, store
from clusterctl.drift import run as drift_run
from clusterctl.drift.client import Output
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.loader import load_inventory
from clusterctl.lab.vllm_sim import synth
from clusterctl.report.active import Target, parse_kinds, run_active, targets
from clusterctl.report.run import Options, report_run
from clusterctl.vllmclient import Endpoint

ROOT = Path(__file__).resolve().parents[3]
THRESHOLDS = ROOT / "checks" / "drift.yaml"


def _by_check(outcome):
    return {(f.check, f.subject): f for f in outcome.findings}


def test_drift_leak_and_ttft_per_instance_then_a_leak_and_a_quantized_restart_are_crit(
    host, models, start_sim, tmp_path: Path
) -> None:
    sim = start_sim(host, models["qwen3-8b"], "--no-sim-batch-noise")
    assert sim.wait_for(READY), sim.log
    store.save(
        drift_run.record(Endpoint.parse(sim.url), "qwen-a", prompts.load(ROOT / "checks/drift/basic.jsonl")), tmp_path
    )
    tgts = [Target("qwen-a", "gpu01", "qwen3-8b", sim.url), Target("other", "gpu02", "qwen3-8b", sim.url)]
    seen: list[str] = []
    out = run_active(tgts, ("drift", "leak", "bench"), thresholds=THRESHOLDS, state_dir=tmp_path, progress=seen.append)
    got = _by_check(out)
    assert got[("drift.check", "instance:qwen-a")].severity == Severity.OK
    assert ("drift.check", "instance:other") not in got and out.skipped[0].startswith("other: no drift baseline")
    assert got[("drift.leak", "instance:qwen-a")].severity == Severity.OK
    assert got[("bench.ttft", "instance:other")].severity == Severity.OK
    metrics = {(m.host, m.name): m.value for m in out.metrics}
    assert metrics[("gpu01", "drift_exact_match_ratio")] == 1.0 and metrics[("gpu01", "leak_sightings")] == 0
    assert 0 < metrics[("gpu01", "bench_ttft_p50_seconds")] <= metrics[("gpu01", "bench_ttft_p99_seconds")] < 5
    assert seen[:3] == [f"{k} qwen-a ({sim.url})" for k in ("drift", "leak", "bench")]

    assert sim.post("/sim/fault", {"fault": "leak"})[0] == 200
    leaky = _by_check(run_active(tgts[:1], ("leak",), thresholds=THRESHOLDS, state_dir=tmp_path))
    assert leaky[("drift.leak", "instance:qwen-a")].severity == Severity.CRIT
    assert sim.stop() == 0

    awq = tmp_path / "qwen3-8b-awq"
    synth.write_model("qwen3-8b", awq, sparse=True, quantization="awq")
    sim = start_sim(host, awq, "--no-sim-batch-noise", "--port", str(sim.port))
    assert sim.wait_for(READY), sim.log
    drifted = _by_check(run_active(tgts[:1], ("drift",), thresholds=THRESHOLDS, state_dir=tmp_path))
    f = drifted[("drift.check", "instance:qwen-a")]
    assert f.severity == Severity.CRIT and "exact match" in f.message and "baseline 'qwen-a'" in f.message
    assert sim.stop() == 0


def test_an_instance_that_does_not_answer_is_unknown_per_check_not_a_stalled_run(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store.save(store.Baseline("dead", {"model": "m"}, 8, 0, {"p": "hi"}, {"p": Output(" there", [" there"])}), tmp_path)
    out = run_active(
        [Target("dead", "gpu01", "m", f"http://127.0.0.1:{port}")],
        ("drift", "leak", "bench"),
        thresholds=THRESHOLDS,
        state_dir=tmp_path,
        timeout=2,
    )
    assert {(f.check, f.severity) for f in out.findings} == {
        ("drift.check", Severity.UNKNOWN),
        ("drift.leak", Severity.UNKNOWN),
        ("bench.ttft", Severity.UNKNOWN),
    }
    assert all("cannot check" in f.message for f in out.findings)


def test_active_runs_are_their_own_series_compared_with_the_previous_active_run(tmp_path: Path) -> None:
    from clusterctl.diagnose.findings import Finding

    leak = Finding("drift.leak", Severity.CRIT, "gpu01", "instance:qwen-a", "2 sightings")
    db, t = tmp_path / "r.db", time.time()
    report_run([leak], Options(db=db, pattern="all --active leak"), started=t)
    passive = report_run([], Options(db=db, pattern="all"), started=t + 1)
    again = report_run([leak], Options(db=db, pattern="all --active leak"), started=t + 2)
    assert passive.previous_id is None and again.previous_id == 1 and again.change.ongoing == [leak]


def test_kinds_and_targets_from_the_inventory() -> None:
    assert parse_kinds("leak, drift") == ("drift", "leak")
    with pytest.raises(ClusterctlError, match="drift, leak, bench"):
        parse_kinds("drift,latency")
    inv = load_inventory(ROOT / "inventories" / "example-16xh100-roce.yaml")
    all_targets = targets(inv)
    assert all_targets and all(t.url.startswith("http://") and ":" in t.url[7:] for t in all_targets)
    head = all_targets[0].host
    assert {t.host for t in targets(inv, {head})} == {head}


def test_a_protected_instance_is_checked_with_its_api_key(
    host, models, start_sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: ``--active`` sent no key, so every protected instance was "401 UNKNOWN"."""
    sim = start_sim(host, models["qwen3-8b"], "--no-sim-batch-noise", "--api-key", "sk-active-test")
    assert sim.wait_for(READY), sim.log
    inv_file = tmp_path / "site.yaml"
    inv_file.write_text(f"""\
version: 1
defaults:
  ssh: {{use_ssh_config: false}}
  gpus: {{count: 2, model: H100-SXM5-80GB, memory_gib: 80}}
hosts:
  gpu01: {{address: 127.0.0.1}}
engines:
  vllm: {{path: /opt/vllm/bin/vllm, version: 0.11.0}}
models:
  qwen3-8b: {{path: /models/qwen3-8b}}
instances:
  secret-ref: {{model: qwen3-8b, engine: vllm, placement: [gpu01:0], port: {sim.port},
               secrets: {{VLLM_API_KEY: {{env: T_ACTIVE_KEY}}}}}}
""")
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")
    monkeypatch.delenv("CLUSTERCTL_API_KEY", raising=False)
    monkeypatch.setenv("T_ACTIVE_KEY", "sk-active-test")
    tgts = targets(load_inventory(inv_file))
    assert "sk-active-test" not in repr(tgts)
    out = run_active(tgts, ("bench",), thresholds=THRESHOLDS, state_dir=tmp_path, timeout=20)
    assert [(f.check, f.severity) for f in out.findings] == [("bench.ttft", Severity.OK)], out.findings
    monkeypatch.setenv("T_ACTIVE_KEY", "wrong")
    out = run_active(
        targets(load_inventory(inv_file)), ("bench",), thresholds=THRESHOLDS, state_dir=tmp_path, timeout=20
    )
    assert [f.severity for f in out.findings] == [Severity.UNKNOWN] and "401" in out.findings[0].message
    monkeypatch.delenv("T_ACTIVE_KEY")
    with pytest.raises(ClusterctlError, match="T_ACTIVE_KEY is not set"):
        targets(load_inventory(inv_file))
    assert sim.stop() == 0
