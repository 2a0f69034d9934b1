"""``doctor --checks drift,leak`` core: one finding per inventory instance, severities a monitor can act on."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.diagnose.findings import Severity
from clusterctl.drift import doctor_checks, prompts, run, store
from clusterctl.inventory.loader import load_inventory
from clusterctl.lab.vllm_sim.serve import free_port

from .conftest import READY

PROMPTS = Path(__file__).resolve().parents[3] / "checks" / "drift" / "basic.jsonl"

INVENTORY = """\
version: 1
defaults:
  gpus: {{count: 2, model: H100-SXM5-80GB, memory_gib: 79.6, interconnect: nvlink}}
hosts:
  gpu01: {{address: 127.0.0.1}}
  gpu02: {{address: 127.0.0.1}}
engines:
  vllm-0.11: {{path: /opt/vllm-0.11/bin/vllm, version: 0.11.0}}
models:
  qwen: {{path: /models/qwen}}
instances:
  healthy: {{model: qwen, engine: vllm-0.11, placement: "gpu01:0", port: {healthy}}}
  leaky: {{model: qwen, engine: vllm-0.11, placement: "gpu01:1", port: {leaky}}}
  gone: {{model: qwen, engine: vllm-0.11, placement: "gpu02:0", port: {gone}}}
"""


def test_split_checks_takes_drift_and_leak_out_of_the_analyzer_words() -> None:
    assert doctor_checks.split_checks(["serving", " drift", "leak.context", "xid"]) == (
        ["serving", "xid"],
        ["drift.output", "leak.context"],
    )
    assert doctor_checks.split_checks(["gpu"]) == (["gpu"], [])


def test_drift_and_leak_findings_per_instance(
    host, models, start_sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    healthy = start_sim(host, models["qwen3-8b"], "--no-sim-batch-noise", scale="0")
    leaky = start_sim(host, models["qwen3-8b"], "--no-sim-batch-noise", scale="0", gpus="1")
    assert healthy.wait_for(READY) and leaky.wait_for(READY), healthy.log + leaky.log
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(
        INVENTORY.format(healthy=healthy.url.rsplit(":", 1)[1], leaky=leaky.url.rsplit(":", 1)[1], gone=free_port())
    )
    inv = load_inventory(str(inv_path))
    ps = prompts.load(PROMPTS)[:4]
    from clusterctl.vllmclient import Endpoint

    # a baseline named after the instance; the leaky one's found by its URL
    store.save(run.record(Endpoint.parse(healthy.url), "healthy", ps))
    store.save(run.record(Endpoint.parse(leaky.url), "leaky-reference", ps))
    leaky.post("/sim/fault", {"fault": "leak"})

    found = doctor_checks.run(inv, {"gpu01", "gpu02"}, ["drift.output", "leak.context"], timeout=5)
    rows = {(f.check, f.subject): f for f in found}
    assert len(found) == 6
    assert rows[("drift.output", "healthy")].severity == Severity.OK
    assert "'healthy'" in rows[("drift.output", "healthy")].message
    assert rows[("leak.context", "healthy")].severity == Severity.OK
    assert rows[("leak.context", "leaky")].severity == Severity.CRIT and rows[("leak.context", "leaky")].evidence
    assert "'leaky-reference'" in rows[("drift.output", "leaky")].message
    assert rows[("drift.output", "gone")].severity == Severity.UNKNOWN  # no baseline: said, not skipped
    assert rows[("leak.context", "gone")].severity == Severity.UNKNOWN  # unreachable: a row, not a stall
    assert all(f.host == ("gpu02" if f.subject == "gone" else "gpu01") for f in found)

    only_gpu02 = doctor_checks.run(inv, {"gpu02"}, ["leak.context"], timeout=5)
    assert [(f.check, f.subject) for f in only_gpu02] == [("leak.context", "gone")]
    assert healthy.stop() == 0 and leaky.stop() == 0


def test_doctor_refuses_request_checks_on_a_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from clusterctl.cli.main import main

    assert main(["doctor", "--from", str(tmp_path), "--checks", "serving,leak"]) == 3
    assert "cannot run on a bundle" in capsys.readouterr().err
