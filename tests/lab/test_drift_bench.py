"""Drift, the leak check and bench against simulator instances on lab hosts, reached over the lab bridge.

Four transient ``systemd-run`` units (API key in their environment, batch
noise on, time scale 0.05; start-up at 0.05 for all four): full-precision Qwen3-8B on the first host's GPU 0
(``fp-a``) and the second host's GPU 0 (``fp-b``), an AWQ checkpoint on the
first host's GPU 1 (``awq``), and for bench a full-precision one at real
speed on the second host's GPU 1 (``bench``).  They are named as inventory instances in a
copy of the lab inventory, so TARGET resolution (address, port, API key from
the instance's secret) is exercised too.  Every unit is stopped afterwards.
"""

from __future__ import annotations

import json
import random
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.http import wait_healthy

from clusterctl.bench import runner, server_metrics
from clusterctl.bench.stats import aggregate
from clusterctl.bench.target import resolve
from clusterctl.diagnose.findings import Severity
from clusterctl.drift import doctor_checks, prompts, run, store, verdict
from clusterctl.drift.run import Background
from clusterctl.inventory.loader import load_inventory
from clusterctl.vllmclient import synthetic_prompt

KEY = "lab-drift-key-7d2e"
PROMPTS = Path(__file__).resolve().parents[2] / "checks" / "drift" / "basic.jsonl"
#: instance -> (host index, GPU, port, model dir, time scale); ``bench`` runs at real speed (scale 1), so
#: its TTFT and ITL are those of an H100, not fractions of a millisecond lost in the machine's noise
INSTANCES = {
    "fp-a": (0, 0, 8100, "/models/qwen3-8b", 0.05),
    "awq": (0, 1, 8101, "/models/qwen3-8b-awq", 0.05),
    "fp-b": (1, 0, 8100, "/models/qwen3-8b", 0.05),
    "bench": (1, 1, 8101, "/models/qwen3-8b", 1.0),
}
#: every instance's start-up (load, compile, CUDA graphs) at this scale: ``bench`` serves at real speed but
#: need not start at it (about 40 s of the fixture)
STARTUP_SCALE = 0.05


def _unit(name: str) -> str:
    return f"vllm-drift-{name}"


@pytest.fixture(scope="module")
def instances(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The three units up and healthy; yields the inventory naming them as instances."""
    hosts = lab.names[:2]
    lab.run(
        hosts[0],
        "vllm-sim make-model qwen3-8b /models/qwen3-8b --sparse && "
        "vllm-sim make-model qwen3-8b /models/qwen3-8b-awq --sparse --quantization awq",
        check=True,
        timeout=120,
    )
    lab.run(hosts[1], "vllm-sim make-model qwen3-8b /models/qwen3-8b --sparse", check=True, timeout=120)
    try:
        for name, (h, gpu, port, model, scale) in INSTANCES.items():
            lab.run(
                hosts[h],
                f"systemd-run --unit={_unit(name)} --collect --property=Type=exec "
                f"--setenv=VLLM_API_KEY={KEY} --setenv=VLLM_SIM_TIME_SCALE={scale} "
                f"--setenv=VLLM_SIM_STARTUP_SCALE={STARTUP_SCALE} "
                f"--setenv=CUDA_VISIBLE_DEVICES={gpu} /opt/vllm-0.11/bin/vllm serve {model} "
                f"--port {port} --max-model-len 8192 --max-num-seqs 256 --served-model-name qwen3-8b",
                check=True,
            )
        for name, (h, _gpu, port, _m, _s) in INSTANCES.items():
            addr = lab.host(hosts[h]).address
            wait_healthy(lab, hosts[h], f"http://{addr}:{port}/health", _unit(name), timeout=120)
        inv = tmp_path_factory.mktemp("inv") / "inventory.yaml"
        text = Path(lab.inventory).read_text() + "models:\n  qwen3-8b: {path: /models/qwen3-8b}\ninstances:\n"
        for name, (h, gpu, port, _m, _s) in INSTANCES.items():
            text += (
                f"  {name}:\n    model: qwen3-8b\n    engine: vllm-0.11\n    placement: '{hosts[h]}:{gpu}'\n"
                f"    port: {port}\n    secrets: {{VLLM_API_KEY: {{env: LAB_DRIFT_KEY}}}}\n"
            )
        inv.write_text(text)
        yield load_inventory(str(inv))
    finally:
        for name, (h, _g, _p, _m, _s) in INSTANCES.items():
            lab.run(hosts[h], f"systemctl stop {_unit(name)}; systemctl reset-failed {_unit(name)}", timeout=60)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))  # baselines and calibrations stay in the test
    monkeypatch.setenv("LAB_DRIFT_KEY", KEY)
    for var in ("VLLM_API_KEY", "OPENAI_API_KEY", "CLUSTERCTL_API_KEY"):
        monkeypatch.delenv(var, raising=False)


def _ep(inv: Any, name: str) -> Any:
    return resolve(name, lambda: inv)


def test_quantized_instance_drifts_and_a_twin_stays_within_the_calibrated_floor(lab, instances, env) -> None:
    ps = prompts.load(PROMPTS)
    ref = _ep(instances, "fp-a")
    assert ref.api_key == KEY and ref.url.startswith("http://10.")
    store.save(run.record(ref, "reference", ps, extra_env={"quantization": None}))
    cal = run.calibrate(ref, ps, runs=2, background=4)
    store.save_calibration(cal["env"]["model"], cal)

    twin = verdict.check(_ep(instances, "fp-b"), "reference")
    assert twin.calibrated and twin.passed, (twin.summary, twin.reasons, cal["floor"])
    awq = verdict.check(_ep(instances, "awq"), "reference")
    assert not awq.passed, awq.summary
    assert awq.summary["exact_match"] < twin.summary["exact_match"]
    # the calibrated limits never go below the floor the twin was measured against
    assert twin.limits.min_exact_match <= cal["floor"]["exact_match"]

    # the same through doctor's request checks: a baseline named after the instance is found for it
    store.save(run.record(ref, "fp-a", ps[:4]))
    found = {f.subject: f for f in doctor_checks.run(instances, set(lab.names[:2]), ["drift.output"], timeout=20)}
    assert found["fp-a"].severity == Severity.OK, found["fp-a"]
    assert found["fp-b"].severity == Severity.UNKNOWN  # no baseline of its own or from its URL


def _fault(lab: Any, host: str, port: int, body: dict[str, Any]) -> None:
    """POST /sim/fault from the host's own loopback (the simulator refuses other addresses)."""
    script = (
        "import json,sys,urllib.request as u; r=u.Request(sys.argv[1], data=sys.argv[2].encode(), "
        "method='POST'); print(u.urlopen(r, timeout=10).read().decode())"
    )
    lab.run(
        host,
        f"python3 -c {shlex.quote(script)} http://127.0.0.1:{port}/sim/fault {shlex.quote(json.dumps(body))}",
        check=True,
    )


def test_leak_check_catches_the_fault_and_is_quiet_under_load(lab, instances, env) -> None:
    host_a = lab.names[0]
    port = INSTANCES["fp-a"][2]
    with Background(_ep(instances, "fp-b"), 6):
        quiet = doctor_checks.run(instances, {lab.names[1]}, ["leak.context"], timeout=20)
    assert {f.subject: f.severity for f in quiet} == {"fp-b": Severity.OK, "bench": Severity.OK}, quiet
    _fault(lab, host_a, port, {"fault": "leak"})
    try:
        found = {f.subject: f for f in doctor_checks.run(instances, {host_a}, ["leak.context"], timeout=20)}
    finally:
        _fault(lab, host_a, port, {"fault": "clear"})
    assert found["fp-a"].severity == Severity.CRIT and found["fp-a"].evidence, found["fp-a"]
    assert found["awq"].severity == Severity.OK  # the fault is fp-a's alone


def test_bench_agrees_with_the_server_timings(lab, instances, env) -> None:
    """Client TTFT and ITL against the simulator's own histograms (at time scale 1 they are wall times)."""
    ep = _ep(instances, "bench")
    rng = random.Random(2)
    seen = {}
    for level in (1, 8):
        ps = [synthetic_prompt(128, rng) for _ in range(2 * level)]
        before = server_metrics.scrape(ep)
        res = runner.run(ep, ps, level, 16)
        after = server_metrics.scrape(ep)
        rep = aggregate(res.results, res.duration, level)
        assert rep["completed"] == len(ps) and rep["failed"] == 0, rep["errors"]
        assert all(len(r.itl) == 15 and r.output_tokens == 16 for r in res.results)
        server = {
            m: 1000 * (server_metrics.histogram_mean(before, after, f"vllm:{m}_seconds") or 0)
            for m in ("time_to_first_token", "inter_token_latency")
        }
        client = {"time_to_first_token": rep["ttft_ms"]["mean"], "inter_token_latency": rep["itl_ms"]["mean"]}
        seen[level] = (client, server)
    print(seen)
    (c1, s1), (c8, s8) = seen[1], seen[8]
    assert abs(c1["time_to_first_token"] - s1["time_to_first_token"]) < 5, seen
    # 8 requests at once: the simulator's HTTP front end (Python threads, before its histogram starts) queues
    # them, so the client sees up to 25 ms more on 2 shared cores; hardly less than the server's (5 ms slack:
    # the simulator's histogram is its simulated step time, which its wall-clock pacing follows closely, not
    # exactly; measured down to -1.9 ms)
    assert -5 < c8["time_to_first_token"] - s8["time_to_first_token"] < 25, seen
    for c, s in ((c1, s1), (c8, s8)):
        assert abs(c["inter_token_latency"] - s["inter_token_latency"]) < 2, seen
