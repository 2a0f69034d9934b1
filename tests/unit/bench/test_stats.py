"""vLLM's latency definitions and aggregates on hand-made request timings."""

from __future__ import annotations

import math

import pytest

from clusterctl.bench.stats import RequestResult, Slo, aggregate, percentile
from clusterctl.errors import ClusterctlError
from clusterctl.vllmclient import Endpoint


def test_tpot_excludes_the_first_token_and_is_undefined_for_one_token() -> None:
    r = RequestResult(ok=True, ttft=0.1, e2e=0.5, output_tokens=5)
    assert r.tpot == pytest.approx(0.1)  # (0.5 - 0.1) / 4
    assert RequestResult(ok=True, ttft=0.1, e2e=0.1, output_tokens=1).tpot is None


def test_percentiles_interpolate_like_numpy() -> None:
    v = [1.0, 2.0, 3.0, 4.0]
    assert percentile(v, 50) == 2.5 and percentile(v, 90) == pytest.approx(3.7) and percentile(v, 100) == 4.0
    assert math.isnan(percentile([], 50))


def test_aggregate_throughput_goodput_and_failures() -> None:
    rs = [
        RequestResult(ok=True, ttft=0.05, e2e=0.35, itl=[0.1, 0.1, 0.1], output_tokens=4, input_tokens=10),
        RequestResult(ok=True, ttft=0.30, e2e=0.60, itl=[0.1, 0.1, 0.1], output_tokens=4, input_tokens=10),
        RequestResult(ok=False, error="HTTP 500: boom"),
    ]
    rep = aggregate(rs, duration=2.0, concurrency=2, slo=Slo(ttft_ms=100))
    assert rep["completed"] == 2 and rep["failed"] == 1 and rep["errors"] == ["HTTP 500: boom"]
    assert rep["output_throughput"] == 4.0 and rep["total_token_throughput"] == 14.0
    assert rep["request_throughput"] == 1.0
    assert rep["goodput"] == 0.5  # only the first meets TTFT <= 100 ms
    assert rep["ttft_ms"]["mean"] == pytest.approx(175)  # type: ignore[index]
    assert rep["tpot_ms"]["median"] == pytest.approx(100)  # type: ignore[index]
    assert rep["itl_ms"]["p99"] == pytest.approx(100)  # type: ignore[index]


def test_slo_on_tpot_and_e2e() -> None:
    r = RequestResult(ok=True, ttft=0.01, e2e=1.01, output_tokens=11)  # tpot 100 ms
    assert Slo(tpot_ms=100).met(r) and not Slo(tpot_ms=99).met(r)
    assert not Slo(e2e_ms=1000).met(r) and not Slo().met(RequestResult(ok=False))


def test_endpoint_urls() -> None:
    assert Endpoint.parse("http://127.0.0.1:8000/v1/") == Endpoint("127.0.0.1", 8000, "")
    assert Endpoint.parse("127.0.0.1:9000").port == 9000
    with pytest.raises(ClusterctlError, match="not an endpoint URL"):
        Endpoint.parse("ftp://x")
    with pytest.raises(ClusterctlError, match="bad port"):
        Endpoint.parse("http://h:99999")


def test_poisson_arrivals_have_the_requested_mean_rate_and_are_reproducible() -> None:
    from clusterctl.bench.loadgen import arrival_times

    t = arrival_times(2000, 50.0, seed=3)
    assert t[0] == 0.0 and t == sorted(t) and t == arrival_times(2000, 50.0, seed=3)
    assert 2000 / t[-1] == pytest.approx(50.0, rel=0.1)
    assert arrival_times(3, None) == [0.0, 0.0, 0.0]
    with pytest.raises(ClusterctlError, match="above 0"):
        arrival_times(3, 0.0)


def test_sse_timer_follows_vllm_bench_serve() -> None:
    """TTFT at the first chunk with choices even if its text is empty (a byte-fallback piece); E2E at the last
    chunk with choices, not at the usage chunk or [DONE]; usage read wherever it comes."""
    from clusterctl.vllmclient import SseTimer

    t = SseTimer()
    t.data(b'{"choices": [{"index": 0, "text": ""}], "usage": null}', 0.010)  # byte-fallback: empty text
    t.data(rb'{"choices": [{"index": 0, "text": "\u4e2d"}]}', 0.015)
    t.data(b'{"choices": [{"index": 0, "text": "!"}], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}', 0.020)
    t.data(b'{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}', 0.030)
    assert t.data(b"[DONE]", 0.031)
    r = t.finish()
    assert r.ok and r.ttft == 0.010 and r.e2e == 0.020 and r.itl == pytest.approx([0.005, 0.005])
    assert (r.output_tokens, r.input_tokens) == (3, 5) and r.tpot == pytest.approx(0.005)
    none = SseTimer()
    none.data(b'{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 0}}', 0.01)
    none.data(b"[DONE]", 0.02)
    assert not none.finish().ok  # no chunk with choices: failed, as vLLM's client fails it
    for bad in (
        b'{"choices": [{"text": 5}]}',
        b'{"choices": {}}',
        b"[1]",
        b'{"choices": [], "usage": {"completion_tokens": 1e308}}',
        b'{"choices": [], "usage": {"completion_tokens": true}}',
        b'{"choices": [], "usage": []}',
    ):
        with pytest.raises(ValueError):
            SseTimer().data(bad, 0.0)
