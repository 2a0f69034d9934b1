"""The doctor's log parser on real vLLM 0.32 (CPU backend) output and on 0.32's message formats."""

from __future__ import annotations

from pathlib import Path

from clusterctl.deploy.preflight import kvcheck
from clusterctl.diagnose import vllmlog

VLLM = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


def test_real_032_cpu_startup_and_engine_death() -> None:
    text = (VLLM / "startup_and_engine_death_v0.32.0_cpu.log").read_text()
    ev = vllmlog.parse_log(text)
    assert ev.ready and ev.device == "cpu" and ev.max_model_len == 2048
    assert ev.kv_explicit is True and ev.kv_avail_gib == 0.06 and ev.kv_bytes_arg == 64 * 2**20
    assert any("MPClient: engine core exited unexpectedly" in line for line in ev.engine_dead)
    assert any("EngineDeadError" in line for line in ev.engine_dead)
    # "CPU KV cache size: 65,536 tokens" is the deploy KV check's value; the start marker is the
    # "non-default args" line (0.32 prints no "vLLM API server version" line).
    assert kvcheck.logged_kv_tokens(text) == (65536,)
    assert kvcheck.logged_kv_tokens(text + text) == (65536,)


def test_stats_line_with_032_fields() -> None:
    """The format of vLLM 0.32's v1/metrics/loggers.py (LoggingStatLogger.log): optional fields between
    "Waiting" and the device's KV usage; "Preemptions" only when non-zero."""
    lines = [
        "(APIServer pid=1) INFO 12-01 16:32:15 [loggers.py:259] Engine 000: Avg prompt throughput: 12.3 tokens/s, "
        "Avg generation throughput: 45.6 tokens/s, Running: 4 reqs, Waiting: 2 reqs, Deferred: 1 reqs, "
        "Preemptions: 3, CPU KV cache usage: 87.5%, Prefix cache hit rate: 10.0%",
        "(APIServer pid=1) INFO 12-01 16:32:20 [loggers.py:259] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 9.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.5%",
        "INFO 11-30 09:12:00 [loggers.py:127] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
        "throughput: 9.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.5%, Prefix cache hit "
        "rate: 0.0%",
    ]
    stats = vllmlog.parse_log("\n".join(lines)).stats
    assert stats[0] == {"running": 4.0, "waiting": 2.0, "kv": 0.875, "preemptions": 3.0, "deferred": 1.0}
    assert stats[1] == {"running": 1.0, "waiting": 0.0, "kv": 0.015}
    assert stats[2] == {"running": 1.0, "waiting": 0.0, "kv": 0.015}


def test_free_memory_wordings_of_032() -> None:
    """vLLM 0.32 v1/worker/utils.py has two GPU wordings; v1/worker/cpu_worker.py two for host RAM."""
    external = (
        "ValueError: Free memory on device cuda:0 (10.5/79.15 GiB) on startup is less than the engine's "
        "budget after excluding external process's weights (0.9, 40.2 GiB). Decrease GPU memory "
        "utilization or reduce GPU memory used by other processes."
    )
    ev = vllmlog.parse_log(external)
    assert ev.free_mem == {"free": 10.5, "total": 79.15, "util": 0.9, "req": 40.2}
    cpu_start = (
        "ValueError: Available memory on node 0 (20.1/23.4 GiB) on startup is less than desired CPU memory "
        "utilization (0.92, 21.53 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls "
        "the fraction of CPU memory reserved (despite its name)."
    )
    ev = vllmlog.parse_log(cpu_start)
    assert ev.device == "cpu" and ev.free_mem is None
    assert ev.host_mem == {"node": 0.0, "free": 20.1, "total": 23.4, "util": 0.92, "req": 21.53}
    cpu_kv = (
        "ValueError: Available memory on node 0 (3.2/23.4 GiB) on kv cache allocation is less than requested "
        "memory for kv (8.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU "
        "memory used by other processes."
    )
    ev = vllmlog.parse_log(cpu_kv)
    assert ev.host_mem == {"node": 0.0, "free": 3.2, "total": 23.4, "kv": 8.0}
