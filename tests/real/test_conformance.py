"""One conformance suite for the simulator (0.11, 0.33) and the real vLLM CPU engine (0.32).

Each test asserts what clusterctl relies on, the same way for every engine kind:
the start-up lines its parsers read (through those parsers), failure texts and
exit statuses, the HTTP endpoints' shapes and error bodies, and the metric
names and labels status/doctor/bench read.  Where the simulator and the real
engine differed, the simulator was fixed (docs/real-vllm.md lists each).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from clusterctl.deploy.preflight import kvcheck
from clusterctl.deploy.status.metrics import parse_sample
from clusterctl.diagnose import vllmlog
from clusterctl.diagnose.serving import parse_metrics
from support.engines import READY, EngineProc, burst, burst_prompts, preemptions_total

from clusterctl.drift.client import EndpointError, too_long

from .conftest import AUTH, KEY, KINDS, MAX_LEN, SIM_SMALL_KV


def sse(raw: bytes) -> list[dict]:
    text = raw.decode()
    events = [e for e in text.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events), text[:500]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: ") :]) for e in events[:-1]]


# ---- start-up: what deploy's KV check and the doctor read from the log -------------------------------


def test_startup_lines_the_product_reads(served: EngineProc) -> None:
    log = served.log
    tokens = kvcheck.logged_kv_tokens(log)
    assert tokens and all(t > 0 for t in tokens), log[-3000:]
    ev = vllmlog.parse_log(log)
    assert ev.ready and ev.max_model_len == MAX_LEN
    assert ev.kv_avail_gib is not None and ev.kv_avail_gib > 0
    assert ev.device == ("cpu" if served.real else "gpu")
    assert not ev.engine_dead and ev.kv_short is None
    assert KEY not in log  # the key came through VLLM_API_KEY, never on the command line


# ---- HTTP ------------------------------------------------------------------------------------------


def test_health_version_and_models(served: EngineProc) -> None:
    assert served.get("/health") == (200, b"")
    status, body = served.get("/version")
    assert status == 200 and json.loads(body)["version"].startswith(served.version)
    assert served.get("/v1/models")[0] == 401
    status, body = served.get("/v1/models", AUTH)
    data = json.loads(body)["data"]
    assert status == 200 and data[0]["id"] == "tiny" and data[0]["max_model_len"] == MAX_LEN
    assert data[0]["object"] == "model" and data[0]["owned_by"] == "vllm"


def test_unauthorized_body(served: EngineProc) -> None:
    status, body = served.post(
        "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 1}, {"Authorization": "Bearer wrong"}
    )
    assert status == 401 and json.loads(body) == {"error": "Unauthorized"}


def test_completion(served: EngineProc) -> None:
    status, body = served.post(
        "/v1/completions",
        {
            "model": "tiny",
            "prompt": "The GNU General Public License",
            "max_tokens": 5,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 3,
        },
        AUTH,
    )
    assert status == 200, body
    doc = json.loads(body)
    assert doc["object"] == "text_completion" and doc["id"].startswith("cmpl-") and doc["model"] == "tiny"
    ch = doc["choices"][0]
    assert isinstance(ch["text"], str) and ch["finish_reason"] == "length" and ch["index"] == 0
    lp = ch["logprobs"]  # drift reads these (tokens and top-k per position)
    assert len(lp["tokens"]) == 5 and len(lp["top_logprobs"]) == 5 and all(len(t) >= 3 for t in lp["top_logprobs"])
    u = doc["usage"]
    assert u["completion_tokens"] == 5 and u["prompt_tokens"] > 0
    assert u["total_tokens"] == u["prompt_tokens"] + 5


def test_streaming_chunk_shape(served: EngineProc) -> None:
    body = {
        "model": "tiny",
        "prompt": "Everyone is permitted to copy",
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, raw = served.post("/v1/completions", body, AUTH)
    assert status == 200
    chunks = sse(raw)
    *tokens, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 4
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "text_completion" for c in chunks)
    texts = [c["choices"][0] for c in tokens if c["choices"]]
    assert texts and texts[-1]["finish_reason"] == "length"
    assert all("prompt_token_ids" in c and "token_ids" in c for c in texts)


def test_chat_streaming(served: EngineProc) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 3,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, raw = served.post("/v1/chat/completions", body, AUTH)
    assert status == 200
    chunks = sse(raw)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-") for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_error_bodies(served: EngineProc) -> None:
    status, body = served.post("/v1/completions", {"model": "other", "prompt": "x"}, AUTH)
    assert status == 404
    err = json.loads(body)["error"]
    assert err["message"].startswith("The model `other` does not exist.") and err["type"] == "NotFoundError"
    assert err["code"] == 404 and err["param"] == "model"
    long_prompt = " ".join(["word"] * (MAX_LEN + 100))
    status, body = served.post("/v1/completions", {"model": "tiny", "prompt": long_prompt, "max_tokens": 4}, AUTH)
    assert status == 400
    err = json.loads(body)["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400
    assert f"maximum context length is {MAX_LEN} tokens" in err["message"], err
    assert too_long(EndpointError("", 400, err["message"]))  # drift baseline skips such a prompt
    status, body = served.post("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 5000}, AUTH)
    assert status == 400
    assert too_long(EndpointError("", 400, json.loads(body)["error"]["message"])), body
    assert served.get("/nope")[0] == 404


def test_metrics_names_and_labels(served: EngineProc) -> None:
    served.post("/v1/completions", {"model": "tiny", "prompt": "a b c", "max_tokens": 3, "ignore_eos": True}, AUTH)
    status, body = served.get("/metrics")
    assert status == 200
    text = body.decode()
    m = parse_metrics(text)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:cache_config_info",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:prefix_cache_queries_total",
    ):
        assert name in m, name
    labels, _ = m["vllm:num_requests_running"][0]
    assert labels.get("model_name") == "tiny" and labels.get("engine") == "0"
    info = dict(m["vllm:cache_config_info"][0][0])
    assert int(info["num_gpu_blocks"]) > 0 and info["block_size"]
    s = parse_sample(text, 0.0)
    assert s.kv_usage is not None and s.running == 0 and s.generation_tokens and s.generation_tokens >= 3
    assert s.num_gpu_blocks and s.num_gpu_blocks > 0


# ---- the KV cache running out: preemptions, as vLLM 0.32 reports them ----------------------------------

PREEMPT_STREAMS, PREEMPT_PROMPT, PREEMPT_OUT = 16, 720, 80


def test_preemptions_when_the_kv_cache_runs_out(served: EngineProc, launch, tiny_model) -> None:
    """16 streams of 800 tokens on 96 KV blocks of 128 tokens (they need 112): the engine preempts some
    (recompute) and every stream still completes whole.  The count is in /metrics
    (``vllm:num_preemptions_total``) only: real vLLM 0.32 prints no "Preemptions: N" in its stats line
    (its logger resets the interval's count before testing it) and no per-request warning, and neither
    does the simulator.  The simulator runs an instance of its own with the real engine's KV size, block
    size and the ``cpu-1core`` profile at time scale 0.1 (the counts side by side: docs/real-vllm.md)."""
    ep = served
    if not served.real:
        ep = launch(
            served.kind,
            "--served-model-name",
            "tiny",
            "--max-model-len",
            str(MAX_LEN),
            *SIM_SMALL_KV,
            env={"VLLM_API_KEY": KEY, "VLLM_LOG_STATS_INTERVAL": "1", "VLLM_SIM_TIME_SCALE": "0.1"},
        )
        assert ep.wait_for(READY, 120), ep.log[-3000:]
    prompts = burst_prompts(tiny_model, PREEMPT_STREAMS, PREEMPT_PROMPT, salt="kv-")
    before, mark = preemptions_total(ep), len(ep.lines)
    results = burst(ep, prompts, PREEMPT_OUT, headers=AUTH)
    assert all(
        r["status"] == 200
        and r["finish_reason"] == "length"
        and r["usage"]
        and r["usage"]["completion_tokens"] == PREEMPT_OUT
        for r in results
    ), results
    n = preemptions_total(ep) - before
    assert n >= 1, "16 streams of 800 tokens on 96 blocks of 128 preempted nothing"
    deadline = time.monotonic() + 20  # the stats lines (every second here) while the burst ran
    while time.monotonic() < deadline and not any("Waiting: 0 reqs" in x for x in ep.lines[mark:]):
        time.sleep(0.2)
    stats = [x for x in ep.lines[mark:] if "KV cache usage" in x]
    assert stats, "".join(ep.lines[mark:])[-3000:]
    assert any(re.search(r"Running: \d+ reqs, Waiting: [1-9]\d* reqs, ", x) for x in stats), stats  # requeued
    assert not any("Preemptions" in x or "preempted" in x for x in ep.lines[mark:]), stats


def test_sigterm_exits_0(served: EngineProc) -> None:
    """Last in the module on purpose: it stops the shared engine."""
    served.proc.send_signal(signal.SIGTERM)
    assert served.wait(90) == 0
    assert "Application shutdown complete." in served.log


# ---- failures: texts the doctor keys on, exit statuses ------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_bad_flag_is_argparse_exit_2(launch, kind: str) -> None:
    ep = launch(kind, "--tensor-paralel-size", "2")
    assert ep.wait(120) == 2
    assert "unrecognized arguments: --tensor-paralel-size 2" in ep.log or "unrecognized arguments" in ep.log, ep.log[
        -2000:
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_kv_cache_too_small_for_max_len(launch, kind: str) -> None:
    """An explicit KV size too small for --max-model-len: vLLM's estimate, exit 1; the doctor's parser
    reads the length, the estimate and that the KV size was explicit."""
    ep = launch(kind, "--max-model-len", "4096", "--kv-cache-memory-bytes", str(2**20), kv_bytes=None)
    assert ep.wait(240) == 1, ep.log[-3000:]
    ev = vllmlog.parse_log(ep.log)
    assert ev.kv_short is not None, ep.log[-3000:]
    assert ev.kv_short["len"] == 4096 and 0 < ev.kv_short["est"] < 4096
    assert ev.kv_bytes_arg == 2**20
    assert kvcheck.logged_max_len_estimate(ep.log) == ev.kv_short["est"]


@pytest.mark.parametrize("kind", KINDS)
def test_max_len_above_the_model_limit(launch, kind: str) -> None:
    ep = launch(kind, "--max-model-len", "8192")
    assert ep.wait(240) == 1, ep.log[-3000:]
    assert "max_position_embeddings" in ep.log and "8192" in ep.log
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in ep.log


@pytest.mark.parametrize("kind", KINDS)
def test_engine_death_health_503_then_exit_0(launch, kind: str) -> None:
    """The engine core dies: /health answers 503, the doctor's parser sees the death, and the server
    exits by itself with status 0 -- so only Restart=always brings a unit back."""
    ep = launch(kind, env={"VLLM_SIM_TIME_SCALE": "0.2"})  # the simulator's 5 s watchdog: 1 s
    assert ep.wait_for(READY, 240), ep.log[-3000:]
    if ep.real:
        core = ep.children()
        assert core, "no engine core child process"
        for pid in core:
            os.kill(pid, signal.SIGKILL)
    else:
        ep.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 30
    saw_503 = False
    while time.monotonic() < deadline and ep.proc.poll() is None:
        try:
            saw_503 = saw_503 or ep.get("/health")[0] == 503
        except OSError:
            pass
        time.sleep(0.2)
    assert ep.wait(60) == 0, ep.log[-3000:]
    assert vllmlog.parse_log(ep.log).engine_dead, ep.log[-3000:]
    assert saw_503, "/health never answered 503 before the server exited"


# ---- the tiny real model ------------------------------------------------------------------------------


def test_tiny_model_is_byte_identical_on_a_second_run(tiny_model, tmp_path) -> None:
    from clusterctl.lab import realmodel

    again = realmodel.make(out=tmp_path / "again")
    assert realmodel.file_hashes(again) == realmodel.file_hashes(tiny_model)
    assert sorted(realmodel.file_hashes(again)) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
