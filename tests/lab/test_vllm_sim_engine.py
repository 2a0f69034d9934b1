"""The step engine on a lab host under systemd: TTFT rising with concurrent streams, faults from outside.

One ``vllm serve`` (0.11 launcher, the 48 GB card's profile ``l40s-48g``,
time scale 0.1) in a transient unit; from the control machine over the lab
bridge: one stream, then eight concurrent streams with 1400-token prompts;
the engine's TTFT histogram (simulated seconds) must rise, and so must the
output tokens per second the clients see.  The fault endpoint refuses the
bridge address (403) and accepts the host's loopback; a hang leaves /health
at 200 while a request times out, until the execute timeout stops the unit.

Run with a separate lab, e.g.:
CLUSTERCTL_LAB_DIR=/var/lib/clusterctl-lab-sim2 CLUSTERCTL_LAB_BRIDGE=labsimb0 CLUSTERCTL_LAB_NET=10.85
CLUSTERCTL_LAB_PREFIX=simb CLUSTERCTL_LAB_HOSTS=1 pytest tests/lab/test_vllm_sim_engine.py
"""

from __future__ import annotations

import threading
import time

import pytest

from support.http import http, wait_healthy
from unit.vllm_sim.promparse import parse
from unit.vllm_sim.test_engine_http import words

MODEL = "/models/qwen3-8b"
UNIT = "vllm-sim-engine"
PORT = 8000


def _http(url: str, body: dict | None = None, timeout: float = 30) -> tuple[int, bytes]:
    return http(url, body, timeout)


def _ttft(addr: str) -> tuple[float, float]:
    status, body = _http(f"http://{addr}:{PORT}/metrics")
    assert status == 200
    fams = parse(body.decode())
    return (
        sum(fams["vllm:time_to_first_token_seconds_sum"].values()),
        sum(fams["vllm:time_to_first_token_seconds_count"].values()),
    )


@pytest.fixture
def served(lab):
    name = lab.names[0]
    lab.run(name, f"vllm-sim make-model qwen3-8b {MODEL} --sparse", check=True, timeout=60)
    lab.run(
        name,
        f"systemd-run --unit={UNIT} --collect --property=Type=exec --setenv=VLLM_SIM_TIME_SCALE=0.1 "
        "--setenv=VLLM_SIM_STARTUP_SCALE=0 "  # the engine's serving is under test, not its start-up
        "--setenv=VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=30 --setenv=CUDA_VISIBLE_DEVICES=0 "
        f"/opt/vllm-0.11/bin/vllm serve {MODEL} --port {PORT} --max-model-len 8192 "
        "--sim-profile l40s-48g",
        check=True,
    )
    addr = lab.host(name).address
    wait_healthy(lab, name, f"http://{addr}:{PORT}/health", UNIT, timeout=120)
    yield name, addr
    lab.run(name, f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}", timeout=60)


def test_ttft_rises_with_concurrent_streams_and_faults_are_seen_from_outside(lab, served):
    name, addr = served

    def stream(tag: str) -> None:
        status, body = _http(
            f"http://{addr}:{PORT}/v1/completions",
            {"prompt": words(tag, 1400), "max_tokens": 16, "stream": True, "ignore_eos": True, "temperature": 0},
            timeout=120,
        )
        assert status == 200 and body.rstrip().endswith(b"data: [DONE]")

    t0 = time.monotonic()
    stream("one")
    wall1 = time.monotonic() - t0
    s1, c1 = _ttft(addr)
    assert c1 == 1 and 0.15 < s1 < 0.4  # ~0.2 s simulated for 1400 tokens on the 48 GB profile
    threads = [threading.Thread(target=stream, args=(f"u{chr(97 + i)}",)) for i in range(8)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    wall8 = time.monotonic() - t0
    s8, c8 = _ttft(addr)
    assert c8 == 9
    assert (s8 - s1) / 8 > 3 * s1  # eight prompts queue behind each other's prefill
    assert 8 * 16 / wall8 > 2 * (16 / wall1)  # yet the output throughput rises with the streams

    # The fault endpoint is loopback-only: the bridge address is refused, the host itself may switch.
    assert _http(f"http://{addr}:{PORT}/sim/fault", {"fault": "hang"})[0] == 403
    ctl = (
        "python3 -c \"import urllib.request as u; print(u.urlopen(u.Request('http://127.0.0.1:8000/sim/fault',"
        " data=b'{\\\"fault\\\": \\\"hang\\\"}', headers={'Content-Type': 'application/json'})).read().decode())\""
    )
    res = lab.run(name, ctl, check=True)
    assert '"hang":true' in res.stdout
    with pytest.raises(OSError):  # urllib's timeout (socket.timeout is an OSError)
        _http(f"http://{addr}:{PORT}/v1/completions", {"prompt": "stuck", "max_tokens": 4}, timeout=1.0)
    assert _http(f"http://{addr}:{PORT}/health", timeout=5)[0] == 200
    # 30 s execute timeout at scale 0.1: the unit ends within seconds (status 0, as real vLLM).
    deadline = time.monotonic() + 30
    while lab.run(name, f"systemctl is-active {UNIT}").stdout.strip() == "active":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    journal = lab.run(name, f"journalctl -u {UNIT} --no-pager -o cat", check=True).stdout
    assert "RPC call to execute_model timed out." in journal
    assert "Engine core proc EngineCore_DP0 died unexpectedly" in journal
