"""Start-up against fake GPUs: the log sequence and each failure's exact text, per emulated version."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from clusterctl.lab.hardware import faults
from clusterctl.lab.vllm_sim import memory as M

from .conftest import FIXTURES, READY, gpu_processes


def messages(log: str) -> list[str]:
    """The message part of vLLM log lines (after ``[file:line] ``)."""
    return [m[1] for m in re.finditer(r"^\(\S+ pid=\d+\) [A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]+\] (.*)$", log, re.M)]


def sample_line(name: str, needle: str) -> str:
    return next(ln for ln in (FIXTURES / name).read_text().splitlines() if needle in ln)


def test_kv_cache_too_small_matches_the_sample_0_11(host: Path, models, start_sim) -> None:
    sim = start_sim(host, models["qwen3-8b"], "--gpu-memory-utilization", "0.25")
    assert sim.wait() == 1
    want = sample_line("startup_fail_kv_cache_exhaustion_v0.11.0.log", "ERROR").split("] ", 1)[0]
    assert want.startswith("(EngineCore_DP0 pid=")
    exc = sample_line("startup_fail_kv_cache_exhaustion_v0.11.0.log", "ValueError: To serve")
    exc_text = exc.split("[core.py:708] ", 1)[1]
    assert exc_text in messages(sim.log)
    assert "Available KV cache memory: 2.87 GiB" in messages(sim.log)
    assert sim.log.rstrip().endswith(
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    )
    assert gpu_processes(host) == {0: [], 1: []}  # memory released after the failure


def test_kv_cache_too_small_0_33_wording(host: Path, models, start_sim) -> None:
    sim = start_sim(host, models["qwen3-8b"], "--gpu-memory-utilization", "0.25", version="0.33")
    assert sim.wait() == 1
    assert "(EngineCore pid=" in sim.log and "EngineCore_DP0" not in sim.log
    assert sim.log.rstrip().endswith("Failed core proc(s): {'EngineCore': 1}")
    assert re.search(
        r"ValueError: To serve at least one request with the model's max seq len \(40960\), "
        r"\(5\.62 GiB KV cache is needed, .* \(which also controls CPU memory on the CPU backend\)"
        r" .*conserving_memory/ for more details\.",
        sim.log,
    )


@pytest.mark.parametrize("version,device", [("0.11", "device"), ("0.33", "device cuda:0")])
def test_not_enough_free_memory_when_another_process_holds_the_gpu(
    host: Path, models, start_sim, version: str, device: str
) -> None:
    faults.gpu_mem(host.parent.parent, gpu=0, gib=20.0, pid=4242)
    sim = start_sim(host, models["qwen3-8b"], "--max-model-len", "8192", version=version)
    assert sim.wait() == 1
    util = "0.9" if version == "0.11" else "0.92"
    req = M.requested_bytes((81559 - 512) * M.MiB, float(util), version) / M.GiB
    free = (81559 - 512 - 4 - 20 * 1024 - 512) / 1024  # total - driver - foreign - our CUDA context
    want = (
        f"ValueError: Free memory on {device} ({free:.2f}/79.15 GiB) on startup is less than desired GPU "
        f"memory utilization ({util}, {req:.2f} GiB). Decrease GPU memory utilization or reduce GPU "
        "memory used by other processes."
    )
    assert want in sim.log
    assert gpu_processes(host)[0] == [{"pid": 4242, "used_mib": 20480, "foreign": True}]


@pytest.mark.parametrize("version", ["0.11", "0.33"])
def test_weights_that_do_not_fit_fail_with_cuda_oom(host: Path, models, start_sim, version: str) -> None:
    sim = start_sim(
        host, models["llama-3-70b"], "--max-model-len", "4096", "--gpu-memory-utilization", "0.5", version=version
    )
    assert sim.wait() == 1
    assert re.search(
        r"\[linear\.py:210\] Failed to create unquantized linear weights: CUDA out of memory\. "
        r"Tried to allocate \d+\.\d\d MiB\. GPU 0 has a total capacity of 79\.15 GiB of which "
        r"\d+\.\d\d MiB is free\. Including non-PyTorch memory, this process has \d+\.\d\d GiB "
        r"memory in use\.",
        sim.log,
    )
    assert (
        "RuntimeError: Failed to create unquantized linear weights. This may be caused by insufficient "
        "memory to allocate the weight."
    ) in sim.log
    assert ("Failed to load model - not enough GPU memory." in sim.log) == (version == "0.33")
    assert "Loading safetensors checkpoint shards" not in sim.log  # OOM comes before loading


def test_successful_start_tp2_prints_the_sample_sequence(host: Path, models, start_sim) -> None:
    sim = start_sim(
        host,
        models["qwen3-32b"],
        "--max-model-len",
        "32768",
        "-tp",
        "2",
        "--served-model-name",
        "qwen3-32b",
        gpus="0,1",
    )
    assert sim.wait_for(READY), sim.log
    got = messages(sim.log)
    sample = messages((FIXTURES / "startup_success_v0.11.0.log").read_text())
    for msg in (
        "Available KV cache memory: 37.97 GiB",
        "Available KV cache memory: 38.04 GiB",
        "GPU KV cache size: 311,040 tokens",
        "GPU KV cache size: 311,616 tokens",
        "Maximum concurrency for 32,768 tokens per request: 9.49x",
        "Model loading took 30.51",
        "Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 19440",
        "Resolved architecture: Qwen3ForCausalLM",
        "Using max model len 32768",
        "Chunked prefill is enabled with max_num_batched_tokens=8192.",
    ):
        assert any(m.startswith(msg) for m in got), msg
        assert any(m.startswith(msg) for m in sample), msg
    order = [
        next(i for i, m in enumerate(got) if m.startswith(k))
        for k in (
            "vLLM API server version 0.11.0",
            "non-default args",
            "Starting to load model",
            "Model loading took",
            "Available KV cache memory",
            "GPU KV cache size",
            "Graph capturing finished",
            "Starting vLLM API server 0 on http://127.0.0.1:",
        )
    ]
    assert order == sorted(order)
    assert sim.log.index("Application startup complete.") > sim.log.index("Route: /metrics")
    assert "(Worker_TP1 pid=" in sim.log
    procs = gpu_processes(host)
    assert [p["pid"] for p in procs[0]] == [sim.proc.pid] == [p["pid"] for p in procs[1]]
    # requested (0.9 x total) + graphs + CUDA context, as NVML would show it
    assert 0.9 * 81047 < procs[0][0]["used_mib"] < 81047
    assert sim.stop() == 0
    assert gpu_processes(host) == {0: [], 1: []}


def test_0_33_start_logs_one_capacity_line_and_redacts_the_api_key(host: Path, models, start_sim) -> None:
    sim = start_sim(
        host, models["qwen3-8b"], "--max-model-len", "8192", "--api-key", "s3cret", "--enforce-eager", version="0.33"
    )
    assert sim.wait_for(READY), sim.log
    assert "s3cret" not in sim.log and "'api_key': '***'" in sim.log
    line = [m for m in messages(sim.log) if m.startswith("GPU KV cache size")]
    assert len(line) == 1 and re.fullmatch(
        r"GPU KV cache size: [\d,]+ tokens, Maximum concurrency for 8,192 "
        r"tokens per request: \d+\.\d\dx",
        line[0],
    )
    assert "Graph capturing" not in sim.log and "torch.compile" not in sim.log  # --enforce-eager
    assert "Starting vLLM server on http://127.0.0.1:" in sim.log
    sim.stop()


def test_0_11_prints_the_api_key_in_clear(host: Path, models, start_sim) -> None:
    sim = start_sim(host, models["tiny"], "--api-key", "s3cret")
    assert sim.wait_for(READY), sim.log
    assert "'api_key': ['s3cret']" in sim.log
    sim.stop()


def test_tensor_parallel_must_divide_heads(host: Path, models, start_sim) -> None:
    sim = start_sim(host, models["tiny"], "-tp", "3", gpus="0,1")
    assert sim.wait() == 1
    assert "ValueError: Total number of attention heads (4) must be divisible by tensor parallel size (3)." in sim.log


def test_missing_model_dir_is_vllm_s_error(host: Path, start_sim, tmp_path: Path) -> None:
    sim = start_sim(host, tmp_path / "nope")
    assert sim.wait() == 1
    assert f"ValueError: Invalid repository ID or local directory specified: '{tmp_path / 'nope'}'." in sim.log


def test_loading_time_depends_on_page_cache_residency(host: Path, models, start_sim, tmp_path: Path) -> None:
    """Sparse files are cold (1 GiB/s simulated); a real-byte model read once is hot."""
    sim = start_sim(host, models["qwen3-8b"], "--max-model-len", "4096", "--enforce-eager")
    assert sim.wait_for(READY), sim.log
    took = float(re.search(r"Loading weights took ([\d.]+) seconds", sim.log)[1])
    assert took == pytest.approx(16_381_470_720 / M.GiB / 1.0, rel=0.01)
    sim.stop()


def test_time_scale_stretches_the_start(host: Path, models, start_sim) -> None:
    t0 = time.monotonic()
    sim = start_sim(host, models["tiny"], "--enforce-eager", scale="0.1")
    assert sim.wait_for(READY, timeout=30), sim.log
    elapsed = time.monotonic() - t0
    assert 0.9 < elapsed < 10  # 6 + 2 + 2 simulated seconds (+ load) at 0.1x
    sim.stop()


def _kv_tokens(log: str) -> int:
    return int(re.search(r"GPU KV cache size: ([\d,]+) tokens", log)[1].replace(",", ""))


def test_fp8_kv_cache_doubles_the_tokens(host: Path, models, start_sim) -> None:
    a = start_sim(host, models["qwen3-8b"], "--max-model-len", "8192", "--enforce-eager")
    assert a.wait_for(READY), a.log
    a.stop()
    b = start_sim(host, models["qwen3-8b"], "--max-model-len", "8192", "--enforce-eager", "--kv-cache-dtype", "fp8")
    assert b.wait_for(READY), b.log
    b.stop()
    assert abs(_kv_tokens(b.log) - 2 * _kv_tokens(a.log)) <= 16


def test_kv_cache_memory_bytes_bypasses_utilisation(host: Path, models, start_sim) -> None:
    s = start_sim(host, models["qwen3-8b"], "--max-model-len", "8192", "--kv-cache-memory-bytes", "4g")
    assert s.wait_for(READY), s.log
    assert "Available KV cache memory: 3.73 GiB" in s.log  # 4e9 bytes
    assert _kv_tokens(s.log) == 4_000_000_000 // (147_456 * 16) * 16
    s.stop()


def test_awq_llama_70b_fits_one_gpu_where_bf16_does_not(host: Path, start_sim, tmp_path: Path) -> None:
    from clusterctl.lab.vllm_sim import synth

    synth.write_model("llama-3-70b", tmp_path / "awq", sparse=True, quantization="awq")
    s = start_sim(host, tmp_path / "awq", "--max-model-len", "8192", "--enforce-eager")
    assert s.wait_for(READY), s.log
    gib = float(re.search(r"Model loading took ([\d.]+) GiB", s.log)[1])
    assert 36 < gib < 40 and "quantization=awq" in s.log
    s.stop()


def test_stats_line_while_busy(host: Path, models, start_sim) -> None:
    s = start_sim(host, models["tiny"], "--enforce-eager", scale="0.02")
    assert s.wait_for(READY), s.log
    s.post("/v1/completions", {"prompt": "a b", "max_tokens": 8, "ignore_eos": True})
    assert s.wait_for("Engine 000: Avg prompt throughput:", timeout=10), s.log
    line = next(ln for ln in s.log.splitlines() if "Avg prompt throughput" in ln)
    assert re.search(
        r"\[loggers\.py:127\] Engine 000: Avg prompt throughput: [\d.]+ tokens/s, Avg generation "
        r"throughput: [\d.]+ tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: "
        r"0\.0%, Prefix cache hit rate: 0\.0%$",
        line,
    )
    s.stop()


@pytest.mark.parametrize(
    "flags,text",
    [
        (["-tp", "0"], "ValueError: tensor_parallel_size must be a positive integer, got 0"),
        (["--gpu-memory-utilization", "1.5"], "ValueError: GPU memory utilization must be less than 1.0. Got 1.5."),
        (["--port", "70000"], "OverflowError: bind(): port must be 0-65535."),
    ],
)
def test_bad_settings_are_errors_not_tracebacks_of_the_simulator(host: Path, models, start_sim, flags, text) -> None:
    sim = start_sim(host, models["tiny"], *flags, port=None if "--port" not in flags else 70000)
    assert sim.wait() == 1
    assert text in sim.log and "vllm_sim" not in sim.log


def test_broken_config_json_names_the_file(host: Path, start_sim, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m/config.json").write_text('{"hidden_size": 64}')
    sim = start_sim(host, tmp_path / "m")
    assert sim.wait() == 1
    assert f"ValueError: {tmp_path / 'm/config.json'}: missing or invalid field 'num_attention_heads'" in sim.log


def test_startup_scale_defaults_to_the_time_scale_and_can_be_set_alone() -> None:
    from clusterctl.lab.vllm_sim.serve import _startup_scale

    assert _startup_scale(5.0, {}) == 5.0
    assert _startup_scale(5.0, {"VLLM_SIM_STARTUP_SCALE": "1"}) == 1.0
    assert _startup_scale(5.0, {"VLLM_SIM_STARTUP_SCALE": "0"}) == 0.0
    assert _startup_scale(5.0, {"VLLM_SIM_STARTUP_SCALE": "-2"}) == 0.0
    assert _startup_scale(0.05, {"VLLM_SIM_STARTUP_SCALE": "fast"}) == 0.05  # not a number: the time scale
