"""HTTP endpoints of a running simulator (real sockets on 127.0.0.1, fake NVML GPUs)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import FIXTURES, READY, gpu_processes
from .promparse import ParseError, parse

KEY = {"Authorization": "Bearer k1"}


@pytest.fixture
def sim(host: Path, models, start_sim):
    s = start_sim(host, models["tiny"], "--api-key", "k1", "--served-model-name", "tiny", "tiny-alias")
    assert s.wait_for(READY), s.log
    yield s
    s.stop()


def sse_events(raw: bytes) -> list[str]:
    text = raw.decode()
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def test_health_version_and_models_auth(sim) -> None:
    assert sim.get("/health") == (200, b"")
    assert json.loads(sim.get("/version")[1]) == {"version": "0.11.0"}
    assert sim.get("/v1/models") == (401, b'{"error":"Unauthorized"}')
    assert sim.get("/v1/models", {"Authorization": "Bearer wrong"})[0] == 401
    status, body = sim.get("/v1/models", KEY)
    data = json.loads(body)["data"]
    assert status == 200 and [m["id"] for m in data] == ["tiny", "tiny-alias"]
    assert data[0]["owned_by"] == "vllm" and data[0]["max_model_len"] == 4096
    assert sim.get("/metrics")[0] == 200  # /metrics stays open


def test_streamed_completion_with_logprobs_like_the_sample(sim) -> None:
    body = {
        "model": "tiny",
        "prompt": "The capital of France is",
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    status, raw = sim.post("/v1/completions", body, KEY)
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    sample = [json.loads(e) for e in sse_events(_sample_body())[:-1]]
    assert [sorted(c) for c in chunks] == [sorted(c) for c in sample]
    assert [sorted(c["choices"][0]) for c in chunks[:-1]] == [sorted(c["choices"][0]) for c in sample[:-1]]
    tokens = chunks[:-1]
    assert len(tokens) == 6 and tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert tokens[0]["choices"][0]["prompt_token_ids"] and all(
        c["choices"][0]["prompt_token_ids"] is None for c in tokens[1:]
    )
    offset = 0
    for c in tokens:
        ch = c["choices"][0]
        lp = ch["logprobs"]
        assert lp["tokens"] == [ch["text"]] and lp["text_offset"] == [offset]
        top = lp["top_logprobs"][0]
        assert ch["text"] in top and len(top) in (2, 3)  # top-2, plus the sampled token if not among them
        assert top[ch["text"]] == lp["token_logprobs"][0] <= 0
        offset += len(ch["text"])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 5,
        "total_tokens": 11,
        "completion_tokens": 6,
    }
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")


def _sample_body() -> bytes:
    text = (FIXTURES / "sse_v1_completions_stream_logprobs_v0.11.0.txt").read_text()
    return text[text.index("data: ") :].encode()


def test_greedy_and_seeded_generation_is_deterministic(sim) -> None:
    def text(body: dict) -> str:
        return json.loads(sim.post("/v1/completions", {"prompt": "hello world", "max_tokens": 12, **body}, KEY)[1])[
            "choices"
        ][0]["text"]

    assert text({"temperature": 0}) == text({"temperature": 0})
    assert text({"temperature": 1.0, "seed": 7}) == text({"temperature": 1.0, "seed": 7})


def test_stop_string_and_usage_non_streaming(sim) -> None:
    full = json.loads(
        sim.post("/v1/completions", {"prompt": "abc", "max_tokens": 30, "temperature": 0, "ignore_eos": True}, KEY)[1]
    )
    text = full["choices"][0]["text"]
    assert full["usage"]["completion_tokens"] == 30 and full["choices"][0]["finish_reason"] == "length"
    stop = text.split()[3]
    cut = json.loads(
        sim.post(
            "/v1/completions",
            {"prompt": "abc", "max_tokens": 30, "temperature": 0, "ignore_eos": True, "stop": [stop]},
            KEY,
        )[1]
    )
    ch = cut["choices"][0]
    assert ch["finish_reason"] == "stop" and ch["stop_reason"] == stop and stop not in ch["text"]
    assert text.startswith(ch["text"])


def test_errors_per_vllm(sim) -> None:
    status, body = sim.post("/v1/completions", {"model": "other", "prompt": "x"}, KEY)
    assert status == 404 and json.loads(body) == {
        "error": {
            "message": "The model `other` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    status, body = sim.post("/v1/completions", {"prompt": "one two three", "max_tokens": 5000}, KEY)
    assert status == 400
    assert json.loads(body)["error"]["message"] == (
        "'max_tokens' or 'max_completion_tokens' is too large: 5000. This model's maximum context length is "
        "4096 tokens and your request has 3 input tokens (5000 > 4096 - 3)."
    )
    status, body = sim.post("/v1/completions", {"prompt": "x", "logprobs": 21}, KEY)
    assert status == 400 and "greater than max allowed: 20" in json.loads(body)["error"]["message"]
    assert sim.get("/nope")[0] == 404


def test_chat_streaming_and_logprobs(sim) -> None:
    body = {
        "model": "tiny-alias",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 3,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    status, raw = sim.post("/v1/chat/completions", body, KEY)
    chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
    assert status == 200 and chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-") for c in chunks)
    content = [c["choices"][0] for c in chunks[1:-1]]
    assert len(content) == 4 and content[-1]["finish_reason"] == "length"
    for ch in content:
        lp = ch["logprobs"]["content"][0]
        assert lp["token"] == ch["delta"]["content"] and lp["bytes"] == list(lp["token"].encode())
        assert 3 <= len(lp["top_logprobs"]) <= 4
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    status, body = sim.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "ignore_eos": True},
        KEY,
    )
    msg = json.loads(body)["choices"][0]["message"]
    assert status == 200 and msg["role"] == "assistant" and msg["content"]


def test_metrics_parse_and_count_requests(sim) -> None:
    sim.post("/v1/completions", {"prompt": "a b c", "max_tokens": 5, "ignore_eos": True}, KEY)
    text = sim.get("/metrics")[1].decode()
    m = parse(text)
    lab = (("engine", "0"), ("model_name", "tiny"))
    assert m["vllm:prompt_tokens_total"][lab] == 3.0
    assert m["vllm:generation_tokens_total"][lab] == 5.0
    assert m["vllm:request_success_total"][tuple(sorted(lab + (("finished_reason", "length"),)))] == 1.0
    assert m["vllm:e2e_request_latency_seconds_count"][lab] == 1.0
    assert lab in m["vllm:kv_cache_usage_perc"] and "vllm:gpu_cache_usage_perc" not in m
    info = dict(next(iter(m["vllm:cache_config_info"])))
    assert info["block_size"] == "16" and int(info["num_gpu_blocks"]) > 0 and info["engine"] == "0"
    assert "vllm:time_per_output_token_seconds_bucket" in m  # still there (deprecated) in 0.11
    assert "vllm:num_requests_waiting_by_reason" not in m


def test_the_strict_parser_accepts_the_real_sample_and_rejects_garbage() -> None:
    parse((FIXTURES / "metrics_v0.11.0.prom").read_text())
    with pytest.raises(ParseError):
        parse("vllm:x 1.0\n")  # no TYPE
    with pytest.raises(ParseError):
        parse("# TYPE a gauge\na{b=\"1\" 2\n")


def test_metrics_0_33_and_hidden_names(host: Path, models, start_sim) -> None:
    s33 = start_sim(host, models["tiny"], version="0.33")
    s11 = start_sim(host, models["tiny"], "--show-hidden-metrics-for-version", "0.10", gpus="1")
    assert s33.wait_for(READY) and s11.wait_for(READY), s33.log + s11.log
    m33 = parse(s33.get("/metrics")[1].decode())
    m11 = parse(s11.get("/metrics")[1].decode())
    assert "vllm:num_requests_waiting_by_reason" in m33 and "vllm:time_per_output_token_seconds_count" not in m33
    assert "vllm:gpu_cache_usage_perc" not in m33
    assert "vllm:gpu_cache_usage_perc" in m11 and "vllm:kv_cache_usage_perc" in m11  # both names
    assert "vllm:gpu_prefix_cache_queries_total" in m11
    assert dict(next(iter(m33["vllm:cache_config_info"]))).get("swap_space") is None
    s33.stop()
    s11.stop()


def test_port_is_bound_but_refuses_connections_until_ready(host: Path, models, start_sim) -> None:
    s = start_sim(host, models["tiny"], "--enforce-eager", scale="0.5")  # ~5 s of simulated loading
    assert s.wait_for("Resolved architecture"), s.log
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", s.port), timeout=2).close()
    other = socket.socket()
    with pytest.raises(OSError):  # bound: a plain bind (no SO_REUSEPORT) fails
        other.bind(("127.0.0.1", s.port))
    other.close()
    assert s.wait_for(READY, timeout=30), s.log
    assert s.get("/health")[0] == 200
    s.stop()


def test_second_instance_binds_the_same_port_and_fails_on_gpu_memory(host: Path, models, start_sim) -> None:
    first = start_sim(host, models["qwen3-8b"], "--max-model-len", "8192")
    assert first.wait_for(READY), first.log
    second = start_sim(host, models["qwen3-8b"], "--max-model-len", "8192", port=first.port)
    assert second.wait() == 1
    assert "Address already in use" not in second.log
    assert "ValueError: Free memory on device (" in second.log
    assert [p["pid"] for p in gpu_processes(host)[0]] == [first.proc.pid]
    assert first.get("/health")[0] == 200
    first.stop()


def test_memory_visible_through_real_pynvml_then_released(host: Path, models, start_sim, nvml_lib: Path) -> None:
    s = start_sim(host, models["qwen3-8b"], "--max-model-len", "8192", gpus="1")
    assert s.wait_for(READY), s.log
    code = (
        "import json, pynvml as N; N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(1); "
        "print(json.dumps([[p.pid, p.usedGpuMemory] for p in N.nvmlDeviceGetComputeRunningProcesses(h)]"
        " + [N.nvmlDeviceGetMemoryInfo(h).used]))"
    )
    env = {"LD_LIBRARY_PATH": str(nvml_lib), "FAKE_NVML_STATE": str(host)}

    def nv() -> list:
        cp = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
        assert cp.returncode == 0, cp.stderr
        return json.loads(cp.stdout)

    running = nv()
    assert running[0][0] == s.proc.pid and running[0][1] > 70 * 2**30
    assert s.stop() == 0
    assert nv() == [4 * 2**20 + 512 * 2**20]  # only the driver's share and the reserved memory remain


def test_killed_simulator_is_cleaned_up_by_the_next_start(host: Path, models, start_sim) -> None:
    s = start_sim(host, models["tiny"])
    assert s.wait_for(READY), s.log
    s.proc.kill()
    s.wait()
    assert [p["pid"] for p in gpu_processes(host)[0]] == [s.proc.pid]  # SIGKILL: nothing released
    t = start_sim(host, models["tiny"])
    assert t.wait_for(READY), t.log
    assert [p["pid"] for p in gpu_processes(host)[0]] == [t.proc.pid]
    t.stop()


def test_engine_death_turns_health_503_then_exits(host: Path, models, start_sim) -> None:
    s = start_sim(host, models["tiny"], scale="0.2")
    assert s.wait_for(READY, timeout=60), s.log
    s.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while s.get("/health")[0] != 503:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert s.wait(timeout=30) == 0  # the watchdog stops the server gracefully, as real vLLM (status 0)
    assert "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client." in s.log
    assert gpu_processes(host)[0] == []


def test_connection_stays_usable_after_an_early_401(sim) -> None:
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
    c.request(
        "POST", "/v1/completions", body=json.dumps({"prompt": "x" * 5000}), headers={"Content-Type": "application/json"}
    )
    r = c.getresponse()
    assert (r.status, r.read()) == (401, b'{"error":"Unauthorized"}')
    c.request("GET", "/health")
    assert c.getresponse().status == 200
    c.close()


def test_sigterm_while_loading_kills_it_and_frees_the_gpu(host: Path, models, start_sim) -> None:
    s = start_sim(host, models["qwen3-8b"], "--max-model-len", "8192", scale="1")  # 15 s of loading
    assert s.wait_for("Loading safetensors checkpoint shards:   0%"), s.log
    assert gpu_processes(host)[0][0]["pid"] == s.proc.pid
    s.proc.send_signal(signal.SIGTERM)
    assert s.wait(timeout=10) == -signal.SIGTERM
    assert gpu_processes(host)[0] == []
