"""Faults of a running simulator, switched via /sim/fault and observed from outside over HTTP."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from clusterctl.deploy.status.metrics import parse_sample
from clusterctl.diagnose.serving import engine_hung
from clusterctl.lab.vllm_sim.faults import FaultError, Faults, is_loopback

from .conftest import READY
from .promparse import parse


def post(url: str, body: Any, timeout: float = 10.0) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def complete(sim: Any, prompt: str, timeout: float = 10.0, **kw: Any) -> tuple[int, Any]:
    return post(
        sim.url + "/v1/completions",
        {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **kw},
        timeout,
    )


def metric(sim: Any, name: str) -> float:
    status, body = sim.get("/metrics")
    assert status == 200
    return sum(parse(body.decode()).get(name, {}).values())


def started(start_sim: Any, host: Path, model: Path, *flags: str, **kw: Any) -> Any:
    sim = start_sim(host, model, *flags, **kw)
    assert sim.wait_for(READY), sim.log
    return sim


def test_control_endpoint_reports_state_and_rejects_bad_requests(host, models, start_sim) -> None:
    sim = started(start_sim, host, models["qwen3-8b"])
    status, state = post(sim.url + "/sim/fault", {"fault": "slowdown", "factor": 3})
    assert status == 200 and state["slowdown"] == 3.0 and not state["dead"]
    assert post(sim.url + "/sim/fault", {"fault": "slowdown", "factor": "x"})[0] == 400
    status, body = post(sim.url + "/sim/fault", {"fault": "melt"})
    assert status == 400 and "'fault' must be one of" in body["error"]
    assert post(sim.url + "/sim/fault", {"fault": "clear"}) == (
        200,
        {"dead": False, "hang": False, "lost_rank": None, "slowdown": 1.0, "leak": False},
    )
    assert sim.stop() == 0


def test_only_loopback_may_switch_faults() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.8.9.1") and is_loopback("::1")
    assert is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("10.77.0.3") and not is_loopback("::ffff:10.0.0.1") and not is_loopback("bogus")
    f = Faults()
    with pytest.raises(FaultError, match="'rank' must be an integer in 0..1"):
        f.apply({"fault": "tp_rank_lost", "rank": 2}, tp=2)


def test_engine_death_answers_503_and_exits_0(host, models, start_sim) -> None:
    sim = started(start_sim, host, models["qwen3-8b"])
    assert complete(sim, "before")[0] == 200
    assert post(sim.url + "/sim/fault", {"fault": "death"})[0] == 200
    try:
        assert sim.get("/health")[0] == 503 or sim.proc.poll() is not None
    except (ConnectionError, urllib.error.URLError):
        pass  # the server closed its socket between accept and answer: it is exiting, checked next
    assert sim.wait(15) == 0  # as real vLLM: the watchdog's graceful stop
    assert "Engine core proc EngineCore_DP0 died unexpectedly" in sim.log


def test_hang_stalls_requests_with_health_200_until_the_execute_timeout(host, models, start_sim) -> None:
    # scale 0.01: the 300 s execute timeout is 3 s of wall time; set to 200 s here -> 2 s.
    sim = started(start_sim, host, models["qwen3-8b"], scale="0.01", env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "200"})
    assert complete(sim, "warm up")[0] == 200
    assert post(sim.url + "/sim/fault", {"fault": "hang"})[0] == 200
    t0 = time.monotonic()
    with pytest.raises((socket.timeout, TimeoutError, urllib.error.URLError)):
        complete(sim, "stuck", timeout=0.8)
    assert sim.get("/health")[0] == 200  # the blind spot: /health does not see a hung collective
    tokens = metric(sim, "vllm:generation_tokens_total")
    assert metric(sim, "vllm:num_requests_running") + metric(sim, "vllm:num_requests_waiting") == 1
    first = parse_sample(sim.get("/metrics")[1].decode(), at=0.0)
    time.sleep(0.3)
    assert metric(sim, "vllm:generation_tokens_total") == tokens  # nothing moves
    # the request sent after the hang is only waiting (none running): doctor's and status's rule
    # still calls the engine hung (serving.engine_hung, "waiting")
    last = parse_sample(sim.get("/metrics")[1].decode(), at=0.3)
    assert (first.running, first.waiting, last.running, last.waiting) == (0.0, 1.0, 0.0, 1.0)
    assert (
        engine_hung(
            first.running,
            last.running,
            first.generation_tokens,
            last.generation_tokens,
            first.waiting,
            last.waiting,
            first.prompt_tokens,
            last.prompt_tokens,
        )
        == "waiting"
    )
    assert sim.wait(20) == 0  # the execute timeout killed the engine, the watchdog stopped the server
    assert time.monotonic() - t0 >= 1.5
    assert "RPC call to execute_model timed out." in sim.log
    assert "Engine core proc EngineCore_DP0 died unexpectedly" in sim.log


def test_losing_one_tp_rank_hangs_the_group_then_kills_it(host, models, start_sim) -> None:
    sim = started(
        start_sim,
        host,
        models["qwen3-8b"],
        "--tensor-parallel-size",
        "2",
        gpus="0,1",
        scale="0.01",
        env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "150"},
    )
    status, state = post(sim.url + "/sim/fault", {"fault": "tp_rank_lost", "rank": 1})
    assert status == 200 and state["lost_rank"] == 1
    with pytest.raises((socket.timeout, TimeoutError, urllib.error.URLError)):
        complete(sim, "stuck", timeout=0.5)
    assert sim.get("/health")[0] == 200
    assert sim.wait(20) == 0
    assert "Worker_TP1 died unexpectedly" in sim.log and "RPC call to execute_model timed out." in sim.log


def test_slowdown_multiplies_simulated_latency(host, models, start_sim) -> None:
    sim = started(start_sim, host, models["qwen3-8b"])
    assert complete(sim, "x " * 500)[0] == 200
    e2e_1 = metric(sim, "vllm:e2e_request_latency_seconds_sum")
    post(sim.url + "/sim/fault", {"fault": "slowdown", "factor": 4})
    assert complete(sim, "y " * 500)[0] == 200
    e2e_4 = metric(sim, "vllm:e2e_request_latency_seconds_sum") - e2e_1
    assert e2e_4 == pytest.approx(4 * e2e_1, rel=0.1)
    assert sim.stop() == 0


def test_context_leak_shows_another_sessions_prompt(host, models, start_sim) -> None:
    sim = started(start_sim, host, models["qwen3-8b"])
    secret = "zebra okapi narwhal"
    assert complete(sim, f"{secret} is my password", user="alice")[0] == 200
    status, clean = complete(sim, "tell me a story", user="bob")
    assert status == 200 and "zebra" not in clean["choices"][0]["text"]
    post(sim.url + "/sim/fault", {"fault": "leak"})
    assert complete(sim, f"{secret} is my password", user="alice")[0] == 200
    status, leaked = complete(sim, "tell me a story", user="bob")
    assert status == 200 and leaked["choices"][0]["text"].startswith("zebra okapi narwhal is my password")
    post(sim.url + "/sim/fault", {"fault": "clear"})
    assert complete(sim, f"{secret} again", user="alice")[0] == 200
    assert "zebra" not in complete(sim, "tell me a story", user="bob")[1]["choices"][0]["text"]
    assert sim.stop() == 0


def test_engine_death_ends_a_running_stream_without_done(host, models, start_sim) -> None:
    sim = started(start_sim, host, models["qwen3-8b"], scale="0.05", env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"})
    req = urllib.request.Request(
        sim.url + "/v1/completions",
        method="POST",
        data=json.dumps({"prompt": "long story", "max_tokens": 2000, "stream": True, "ignore_eos": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    got = b""
    with urllib.request.urlopen(req, timeout=20) as r:
        got += r.read1(200)  # the stream is running
        assert post(sim.url + "/sim/fault", {"fault": "death"})[0] == 200
        try:
            while chunk := r.read1(65536):
                got += chunk
        except Exception:  # the chunked body ends abruptly (http.client.IncompleteRead)
            pass
    assert b"data: " in got and b"[DONE]" not in got
    assert sim.get("/health")[0] == 503
    assert complete(sim, "after")[0] == 500  # kept alive (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1), but dead
    sim.stop()
