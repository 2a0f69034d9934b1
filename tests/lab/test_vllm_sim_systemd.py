"""The vLLM simulator on a real lab host, under systemd, seen through real NVML facts.

Runs ``/opt/vllm-0.11/bin/vllm serve`` (installed by the lab template) as a
transient ``systemd-run`` unit with the API key in its environment, not on
its command line; hits /health, a streamed completion with logprobs and
/metrics from the control machine over the lab bridge; checks that the probe
(clusterctl facts) sees the process on GPU 0 with its unit and that a second
instance (0.33) fails for lack of free memory; everything is stopped after.
"""

from __future__ import annotations

import json
import time

import pytest

from clusterctl.fleet import Fleet
from clusterctl.inventory.loader import load_inventory
from clusterctl.probe.run import collect_facts

from support.http import http, wait_healthy
from unit.vllm_sim.promparse import parse

MODEL = "/models/qwen3-8b"
KEY = "lab-key-4f1c"
UNITS = ("vllm-sim-a", "vllm-sim-b")


def _http(url: str, body: dict | None = None, timeout: float = 10) -> tuple[int, bytes]:
    return http(url, body, timeout, headers={"Authorization": f"Bearer {KEY}"})


def _gpu0_processes(lab, name: str) -> list:
    inv = load_inventory(str(lab.inventory))
    with Fleet([inv.hosts[name]], connect_timeout=10, command_timeout=60) as fleet:
        res = collect_facts(fleet, timeout=60)[name]
    assert res.ok, res.reason
    return list(res.facts.gpus.devices[0].processes)


def _start(lab, name: str, unit: str, launcher: str, port: int) -> None:
    cmd = (
        f"systemd-run --unit={unit} --collect --property=Type=exec "
        f"--setenv=VLLM_API_KEY={KEY} --setenv=VLLM_SIM_TIME_SCALE=0.05 --setenv=CUDA_VISIBLE_DEVICES=0 "
        f"{launcher} serve {MODEL} --port {port} --max-model-len 8192 --served-model-name qwen3-8b"
    )
    lab.run(name, cmd, check=True)


@pytest.fixture
def host(lab):
    name = lab.names[0]
    lab.run(name, f"vllm-sim make-model qwen3-8b {MODEL} --sparse", check=True, timeout=60)
    yield name
    for unit in UNITS:
        lab.run(name, f"systemctl stop {unit}; systemctl reset-failed {unit}", timeout=60)


def test_simulator_under_systemd_serves_and_holds_gpu_memory(lab, host):
    addr = lab.host(host).address
    _start(lab, host, UNITS[0], "/opt/vllm-0.11/bin/vllm", 8000)
    wait_healthy(lab, host, f"http://{addr}:8000/health", UNITS[0], timeout=90)
    journal = lab.run(host, f"journalctl -u {UNITS[0]} --no-pager -o cat", check=True).stdout
    assert "Application startup complete." in journal and "GPU KV cache size:" in journal
    ps = lab.run(host, "ps -eo args", check=True).stdout
    assert KEY not in ps and f"/opt/vllm-0.11/bin/vllm serve {MODEL}" in ps

    status, raw = _http(
        f"http://{addr}:8000/v1/completions",
        {
            "model": "qwen3-8b",
            "prompt": "The capital of France is",
            "max_tokens": 5,
            "temperature": 0,
            "logprobs": 2,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = [e[len("data: ") :] for e in raw.decode().split("\n\n") if e]
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["choices"][0]["logprobs"]["top_logprobs"] for c in chunks[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    metrics = parse(_http(f"http://{addr}:8000/metrics")[1].decode())
    assert metrics["vllm:generation_tokens_total"][(("engine", "0"), ("model_name", "qwen3-8b"))] == 5.0

    main_pid = int(lab.run(host, f"systemctl show -p MainPID --value {UNITS[0]}", check=True).stdout)
    procs = _gpu0_processes(lab, host)
    assert [(p.pid, p.unit) for p in procs] == [(main_pid, f"{UNITS[0]}.service")]
    assert procs[0].used_memory > 70 * 2**30

    # A second instance (0.33) on the same GPU: the start-up check fails, nothing is left on the GPU.
    _start(lab, host, UNITS[1], "/opt/vllm-0.33/bin/vllm", 8001)
    deadline = time.monotonic() + 90
    while lab.run(host, f"systemctl is-active {UNITS[1]}").stdout.strip() in ("active", "activating"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    second = lab.run(host, f"journalctl -u {UNITS[1]} --no-pager -o cat").stdout
    assert "ValueError: Free memory on device cuda:0 (" in second
    assert "on startup is less than desired GPU memory utilization (0.92," in second
    assert [p.pid for p in _gpu0_processes(lab, host)] == [main_pid]

    lab.run(host, f"systemctl stop {UNITS[0]}", check=True, timeout=60)
    assert _gpu0_processes(lab, host) == []
