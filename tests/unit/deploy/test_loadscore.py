"""The load score: health decisive, KV and queue weighted high, throughput medium."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.deploy.status.loadscore import DEFAULT_QUEUE_CAP, InstanceLoad, components, load_score
from clusterctl.deploy.status.metrics import parse_sample

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"

CASES = [
    # (what, sample, expected score)
    ("idle", InstanceLoad(True, kv_usage=0.0, running=0, waiting=0, tokens_per_s=0.0, capacity_tokens_per_s=500), 0.0),
    ("unhealthy wins over idle metrics", InstanceLoad(False, kv_usage=0.0, running=0, waiting=0), 1.0),
    ("healthy but no metric at all", InstanceLoad(True), 1.0),
    ("KV half full only", InstanceLoad(True, kv_usage=0.5, running=4, waiting=0), 0.2),
    (
        "KV full, seats full, at peak",
        InstanceLoad(
            True, kv_usage=1.0, running=256, waiting=256, queue_cap=256, tokens_per_s=900, capacity_tokens_per_s=900
        ),
        1.0,
    ),
    ("queue of one batch (max-num-seqs 64)", InstanceLoad(True, kv_usage=0.0, waiting=64, queue_cap=64), 0.4),
    ("queue beyond the cap counts as full", InstanceLoad(True, kv_usage=0.0, waiting=1000, queue_cap=64), 0.4),
    ("default cap 128 without max-num-seqs", InstanceLoad(True, kv_usage=0.0, waiting=32), 0.1),
    (
        "throughput at half the peak",
        InstanceLoad(True, kv_usage=0.0, waiting=0, tokens_per_s=250, capacity_tokens_per_s=500),
        0.1,
    ),
    (
        "throughput unknown adds nothing",
        InstanceLoad(True, kv_usage=0.25, waiting=0, tokens_per_s=None, capacity_tokens_per_s=500),
        0.1,
    ),
    ("KV above 1 is clamped", InstanceLoad(True, kv_usage=1.3, waiting=0), 0.4),
]


@pytest.mark.parametrize("what,sample,expected", CASES, ids=[c[0] for c in CASES])
def test_score(what: str, sample: InstanceLoad, expected: float) -> None:
    assert load_score(sample) == pytest.approx(expected, abs=1e-4)


def test_score_orders_instances_as_a_dispatcher_should() -> None:
    idle = InstanceLoad(True, kv_usage=0.05, running=1, waiting=0, tokens_per_s=40, capacity_tokens_per_s=900)
    busy = InstanceLoad(True, kv_usage=0.6, running=40, waiting=0, tokens_per_s=700, capacity_tokens_per_s=900)
    queued = InstanceLoad(True, kv_usage=0.6, running=40, waiting=30, tokens_per_s=700, capacity_tokens_per_s=900)
    dead = InstanceLoad(False, kv_usage=0.0, running=0, waiting=0)
    scores = [load_score(s) for s in (idle, busy, queued, dead)]
    assert scores == sorted(scores) and len(set(scores)) == 4
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_the_recorded_vllm_sample() -> None:
    """vLLM 0.11's own /metrics: KV 64.7 %, 18 running, 3 waiting."""
    s = parse_sample((FIXTURES / "metrics_v0.11.0.prom").read_text(), at=0.0)
    assert (s.running, s.waiting, s.num_gpu_blocks) == (18.0, 3.0, 19440)
    load = InstanceLoad(True, kv_usage=s.kv_usage, running=s.running, waiting=s.waiting)
    c = components(load)
    assert c["kv"] == pytest.approx(0.6473, abs=1e-4) and c["queue"] == pytest.approx(3 / DEFAULT_QUEUE_CAP)
    assert c["busy"] is None
    assert load_score(load) == pytest.approx(0.4 * 0.6473251 + 0.4 * 3 / 128, abs=1e-4)
