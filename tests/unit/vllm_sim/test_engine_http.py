"""The step engine seen from outside: drift between instances, preemptions, TTFT under load, prefix cache."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from clusterctl.lab.vllm_sim import synth

from .conftest import READY
from .promparse import parse
from .test_faults import complete


def words(tag: str, n: int) -> str:
    """n distinct letter-only words (one token each for the simulator's tokenizer)."""
    tag = "".join(c if c.isalpha() else "abcdefghij"[int(c)] for c in tag)
    out = []
    for i in range(n):
        w, k = "", i
        for _ in range(4):
            w, k = w + "abcdefghijklmnopqrstuvwxyz"[k % 26], k // 26
        out.append(tag + w)
    return " ".join(out)


def metrics(sim: Any) -> dict[str, float]:
    status, body = sim.get("/metrics")
    assert status == 200
    return {k: sum(v.values()) for k, v in parse(body.decode()).items()}


def greedy_texts(sim: Any, n: int = 40) -> list[str]:
    out = []
    for i in range(n):
        status, body = complete(sim, f"question {words('q', 3)} number {i}", max_tokens=16, seed=7)
        assert status == 200, body
        out.append(body["choices"][0]["text"])
    return out


def test_quantized_instance_drifts_while_two_unquantized_agree(host: Path, models, start_sim, tmp_path: Path) -> None:
    awq = tmp_path / "qwen3-8b-awq"
    synth.write_model("qwen3-8b", awq, sparse=True, quantization="awq")
    runs = []
    for model in (models["qwen3-8b"], models["qwen3-8b"], awq):
        sim = start_sim(host, model)
        assert sim.wait_for(READY), sim.log
        runs.append(greedy_texts(sim))
        assert sim.stop() == 0
    base, again, quant = runs
    assert base == again
    differ = sum(a != b for a, b in zip(base, quant))
    assert 5 <= differ < len(base)  # measurable drift, not a different model


def test_preemptions_when_kv_blocks_run_out(host: Path, models, start_sim) -> None:
    # 64 KV blocks (1024 tokens) for six requests growing to 400 tokens each.
    sim = start_sim(
        host,
        models["qwen3-8b"],
        "--max-model-len",
        "1024",
        "--kv-cache-memory-bytes",
        str(1024 * 147456),
        scale="0.2",
        startup="0",
    )
    assert sim.wait_for(READY), sim.log
    results: list[int] = []

    def client(i: int) -> None:
        status, body = complete(sim, words(f"p{i}", 100), max_tokens=300, timeout=60)
        results.append(len(body["choices"][0]["text"].split()) if status == 200 else -1)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert len(results) == 6 and min(results) > 0
    m = metrics(sim)
    assert m["vllm:num_preemptions_total"] > 0
    assert m["vllm:generation_tokens_total"] == 6 * 300
    assert sim.stop() == 0


def test_ttft_rises_with_concurrent_requests(host: Path, models, start_sim) -> None:
    # At scale 0.05 a few ms of thread-start jitter is 100 ms simulated and the 8 arrivals stop batching
    # (failed 2 of 4 runs on an idle machine); 0.25 keeps the test about the engine.
    sim = start_sim(host, models["qwen3-8b"], "--sim-profile", "l40s-48g", scale="0.25", startup="0")
    assert sim.wait_for(READY), sim.log

    def burst(n: int, tag: str) -> float:
        before = metrics(sim)
        threads = [
            threading.Thread(
                target=complete, args=(sim, words(f"{tag}{i}", 1500)), kwargs={"max_tokens": 4, "timeout": 60}
            )
            for i in range(n)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        after = metrics(sim)
        count = after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"]
        assert count == n
        return (after["vllm:time_to_first_token_seconds_sum"] - before["vllm:time_to_first_token_seconds_sum"]) / n

    one, eight = burst(1, "a"), burst(8, "b")
    assert 0.1 < one < 0.5  # ~0.21 s simulated for 1500 tokens on the 48 GB profile
    assert eight > 2.5 * one
    assert sim.stop() == 0


def test_prefix_cache_hits_are_counted_and_logged(host: Path, models, start_sim) -> None:
    sim = start_sim(host, models["qwen3-8b"], scale="0.05", startup="0")
    assert sim.wait_for(READY), sim.log
    system = words("sys", 160)
    for q in ("first question", "second question"):
        assert complete(sim, f"{system} {q}")[0] == 200
    m = metrics(sim)
    assert m["vllm:prefix_cache_hits_total"] == 160
    assert m["vllm:prefix_cache_queries_total"] == 2 * 162
    assert sim.wait_for("Prefix cache hit rate: 49.4%", timeout=5), sim.log[-2000:]
    assert sim.stop() == 0
