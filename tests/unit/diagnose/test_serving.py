"""serving.metrics over one or two /metrics samples; serving.engine on vLLM logs."""

from __future__ import annotations

import re

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.serving import check_engine, check_metrics, histogram_quantile, parse_metrics

import gpu_facts as G

BASE = G.fixture("vllm/metrics_v0.11.0.prom")


def later(
    text: str = BASE,
    *,
    preemptions: float | None = None,
    waiting: float | None = None,
    kv: float | None = None,
    slow_ttft: int = 0,
    tokens: float = 100.0,
) -> str:
    """The recorded sample advanced as a later scrape would show it (``tokens`` more generated)."""

    def put(name: str, value: float | None, t: str) -> str:
        if value is None:
            return t
        return re.sub(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}", t, flags=re.M)

    text = re.sub(
        r"^(vllm:generation_tokens_total\{[^}]*\}) (\S+)$", lambda m: f"{m[1]} {float(m[2]) + tokens}", text, flags=re.M
    )
    text = put("vllm:num_preemptions_total", preemptions, text)
    text = put("vllm:num_requests_waiting", waiting, text)
    text = put("vllm:kv_cache_usage_perc", kv, text)
    if slow_ttft:  # slow_ttft more requests, all in the buckets above 10 s

        def bump(m: re.Match[str]) -> str:
            le = float(m[2].replace("+Inf", "inf"))
            return f"{m[1]}{float(m[3]) + (slow_ttft if le > 10 else 0)}"

        text = re.sub(
            r'^(vllm:time_to_first_token_seconds_bucket\{engine="0",le="([^"]+)",[^}]*\} )(\S+)$',
            bump,
            text,
            flags=re.M,
        )
    return text


def findings(first: str, second: str | None = None, interval: float = 2.0):
    raw = {"gpu01": {"qwen-a.metrics": first, **({"qwen-a.metrics.2": second} if second else {})}}
    return check_metrics(G.ctx(G.healthy(), raw=raw, interval_s=interval))


def test_parse_prometheus_text_by_name_and_labels():
    m = parse_metrics(BASE)
    assert m["vllm:num_requests_waiting"] == [({"engine": "0", "model_name": "Qwen/Qwen3-32B"}, 3.0)]
    assert histogram_quantile([(0.1, 50.0), (1.0, 100.0), (float("inf"), 100.0)], 0.5) == 0.1
    assert histogram_quantile([(1.0, 0.0), (2.0, 10.0)], 0.99) == 1.99


def test_recorded_sample_alone_is_ok():
    (f,) = findings(BASE)
    assert f.severity == Severity.OK and f.subject == "instance:qwen-a"


def test_preemptions_and_queue_rising_between_two_samples():
    found = findings(BASE, later(preemptions=40.0, waiting=25.0), interval=2.0)
    msgs = {f.message: f for f in found}
    assert any(m.startswith("preemptions rising: +28 in 2 s") for m in msgs)
    assert any(m.startswith("waiting queue growing: 3 -> 25") for m in msgs)
    assert all(f.severity == Severity.WARN for f in found)


def test_preemption_advice_names_the_knob_that_sizes_that_instances_kv_cache():
    gpu = {f.message.split(":")[0]: f for f in findings(BASE, later(preemptions=40.0), interval=2.0)}
    assert "--gpu-memory-utilization" in gpu["preemptions rising"].action
    cpu_inv = G.INVENTORY.replace(
        "vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}",
        "vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}\n"
        "  vllm-cpu: {path: /opt/vllm-cpu/bin/vllm, version: 0.32.0, device: cpu}",
    )
    explicit = cpu_inv.replace(
        """    engine: vllm
    placement: gpu01:[0-1]
    port: 8000
    args: {max-model-len: 32768, gpu-memory-utilization: 0.9}""",
        """    engine: vllm-cpu
    placement: gpu01:cpu
    port: 8000
    args: {max-model-len: 2048, kv-cache-memory-bytes: 67108864}""",
    )
    assert explicit != cpu_inv
    raw = {"gpu01": {"qwen-a.metrics": BASE, "qwen-a.metrics.2": later(preemptions=40.0)}}
    (f,) = [
        f
        for f in check_metrics(G.ctx(G.healthy(), raw=raw, interval_s=2.0, inv=G.inventory(explicit)))
        if f.message.startswith("preemptions rising")
    ]
    assert "raise --kv-cache-memory-bytes" in f.action and "--gpu-memory-utilization does not set it" in f.action
    env = explicit.replace(
        "args: {max-model-len: 2048, kv-cache-memory-bytes: 67108864}",
        "args: {max-model-len: 2048}\n    env: {VLLM_CPU_KVCACHE_SPACE: '1'}",
    )
    (f,) = [
        f
        for f in check_metrics(G.ctx(G.healthy(), raw=raw, interval_s=2.0, inv=G.inventory(env)))
        if f.message.startswith("preemptions rising")
    ]
    assert f.action.startswith("raise VLLM_CPU_KVCACHE_SPACE") and "--gpu-memory-utilization" not in f.action


def test_kv_cache_pinned_near_full_in_both_samples_is_critical():
    full = later(kv=0.99)
    (f,) = findings(full, later(full))
    assert f.severity == Severity.CRIT and "99 % full in both samples" in f.message
    (one,) = findings(full)
    assert one.severity == Severity.WARN


def test_old_kv_metric_name_is_read_too():
    old = later(kv=0.95).replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    (f,) = findings(old)
    assert "95 % full" in f.message


def test_ttft_p99_over_the_interval_above_the_slo():
    found = findings(BASE, later(slow_ttft=200))
    (f,) = [x for x in found if x.message.startswith("TTFT p99")]
    assert f.severity == Severity.WARN and "over the interval" in f.message


def test_body_without_vllm_metrics_is_unknown():
    (f,) = findings("# HELP up\nup 1\n")
    assert f.severity == Severity.UNKNOWN


def test_engine_death_and_nccl_watchdog_after_serving():
    c = G.ctx(G.healthy(), raw={"gpu01": {"qwen-a.log": G.fixture("vllm/runtime_engine_dead_nccl_v0.11.0.log")}})
    found = {f.message: f for f in check_engine(c)}
    # qwen-a is TP 2 on gpu01:[0-1]: the dead worker's rank and GPU are named, not a bare "engine died".
    assert (
        "TP worker rank 1 (VllmWorker-1, GPU gpu01:1 (0000:2a:00.0)) died after it was serving: the TP group of 2 is "
        "UNAVAILABLE"
    ) in found
    nccl = found["NCCL collective timed out or failed in the TP group"]
    assert nccl.severity == Severity.CRIT and "Watchdog caught collective operation timeout" in nccl.evidence[0]


def test_v0_preemption_warning_and_healthy_log():
    c = G.ctx(
        G.healthy(),
        raw={
            "gpu01": {
                "qwen-a.log": G.fixture("vllm/runtime_preemption_v0.6.6.log"),
                "qwen-b.log": G.fixture("vllm/startup_success_v0.11.0.log"),
            }
        },
    )
    found = {f.subject: f for f in check_engine(c)}
    assert found["instance:qwen-a"].severity == Severity.WARN and "51 so far" in found["instance:qwen-a"].message
    assert found["instance:qwen-b"].severity == Severity.OK


def test_requests_running_but_no_token_generated_is_a_hung_engine():
    frozen = later(BASE, tokens=0)  # the same counters seconds later: nothing generated
    found = [f for f in findings(BASE, frozen, interval=5.0) if f.message.startswith("engine hung")]
    assert len(found) == 1 and found[0].severity == Severity.CRIT
    assert "18 requests running but no token generated in 5 s" in found[0].message
    assert not [f for f in findings(BASE, later(BASE)) if f.message.startswith("engine hung")]


def _queue_only(text: str, waiting: float, prompt_more: float = 0.0) -> str:
    """The recorded page with nothing running and ``waiting`` queued (prompt tokens moved by ``prompt_more``)."""
    text = re.sub(r"(?m)^(vllm:num_requests_running\{[^}]*\}) \S+$", r"\g<1> 0.0", text)
    text = re.sub(r"(?m)^(vllm:num_requests_waiting\{[^}]*\}) \S+$", rf"\g<1> {waiting}", text)
    return re.sub(
        r"(?m)^(vllm:prompt_tokens_total\{[^}]*\}) (\S+)$", lambda m: f"{m[1]} {float(m[2]) + prompt_more}", text
    )


def test_requests_only_waiting_and_nothing_admitted_is_a_hung_engine():
    # vLLM admits a waiting request at its next step when a seat is free; with none running all are
    # free: a queue that stays with nothing running and no token is an engine whose steps stopped
    first = _queue_only(BASE, 4.0)
    hung = [f for f in findings(first, _queue_only(first, 5.0), interval=5.0) if f.message.startswith("engine hung")]
    assert len(hung) == 1 and hung[0].severity == Severity.CRIT
    assert "5 request(s) waiting, none running or admitted, no token generated in 5 s" in hung[0].message
    assert "waiting 4 -> 5" in hung[0].evidence[0]


def test_a_queue_that_moves_or_an_idle_engine_is_not_hung():
    first = _queue_only(BASE, 4.0)

    def hung(second: str) -> list[str]:
        return [f.message for f in findings(first, second, interval=5.0) if f.message.startswith("engine hung")]

    assert not hung(later(first, tokens=10.0))  # requests came and went between the samples
    assert not hung(_queue_only(first, 4.0, prompt_more=512.0))  # a prefill completed
    assert not hung(_queue_only(first, 0.0))  # the queue drained
    assert not hung(re.sub(r"(?m)^(vllm:num_requests_running\{[^}]*\}) \S+$", r"\g<1> 2.0", first))  # admitted, busy
    idle = _queue_only(BASE, 0.0)
    assert not [f for f in findings(idle, idle, interval=5.0) if f.message.startswith("engine hung")]
