"""The autoscaler on the lab: a load ramp through the real gateway scales a template out, then in,
and no request of the ramp is lost.

A template of TP-1 simulator replicas (time scale 5, --enforce-eager, --max-num-seqs 2: one replica
serves about 1.5 requests per second of 200 tokens each; start-up at scale 1, about 10 s, not 50 s)
behind nginx, ``clusterctl autoscale daemon --interval 1`` running with the
``queue`` signal (high 1.5, low 0.3 waiting requests per replica; out after 2 s, in after 8 s and no
sooner than 20 s after the scale-out: the high phase lasts 20 s, so whenever the new replica is up, the
scale-in can only come in the low phase).
``clusterctl bench --request-rate`` through the gateway: 3 req/s (twice one replica's capacity) for
20 s, then (once the scale-out is done) 0.4 req/s for 25 s while the second replica is drained and
removed: the scale-in comes about 10 s into it (the cooldown's end, or the low phase's start plus the
8 s hold, whichever is later; the earlier 35 s + 40 s phases only waited longer for the same events). Every request
of both phases completes (the bench's own counts). Only this test's units, model and nginx are
touched (tests/support/autoscale_ramp.py).
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from support.autoscale_ramp import Ramp

HIGH_S, LOW_S = 20, 25  # the phases' lengths (s); the scale-in cooldown is HIGH_S (module doc)


@pytest.fixture(scope="module")
def ramp(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ramp]:
    assert len(lab.names) >= 2, "the autoscale ramp needs 2 lab hosts"
    r = Ramp(lab, tmp_path_factory.mktemp("autoscale"), startup_scale=1.0, policy={"cooldown_in_s": HIGH_S})
    r.cleanup()
    try:
        r.start()
        yield r
    finally:
        r.cleanup()


def test_a_load_ramp_scales_out_then_in_without_losing_a_request(ramp: Ramp) -> None:
    name = ramp.name
    assert ramp.units() == [f"{name}-1"]
    ramp.start_daemon()
    t_high = time.time()
    high = ramp.bench(rate=3.0, duration=HIGH_S)
    out = ramp.wait_for("out", t_high, timeout=180)
    assert out is not None, ramp.history()[-5:]
    # it acted on the measured queue, above the band, after the hold
    assert out["rule"] == "above-high" and out["value"] > 1.5 and out["added"] == [f"{name}-2"], out
    assert ramp.units() == [f"{name}-1", f"{name}-2"]
    t_low = time.time()
    low = ramp.bench(rate=0.4, duration=LOW_S)
    inn = ramp.wait_for("in", t_low, timeout=180)
    assert inn is not None, ramp.history()[-5:]
    assert inn["rule"] == "below-low" and inn["removed"] == [f"{name}-2"] and inn["value"] < 0.3, inn
    assert ramp.stop_daemon() == 0
    assert ramp.units() == [f"{name}-1"]

    # no request of the ramp was lost: every one sent completed, through both changes
    for phase in (high, low):
        res = phase["results"][0]
        assert res["failed"] == 0 and res["completed"] > 0, res
    assert high["results"][0]["completed"] >= 0.5 * 3 * HIGH_S  # ~3 req/s for HIGH_S (as before: 50 of ~105)
    # the new replica got traffic only once it served: no decision ever saw it before its gates
    hist = ramp.history()
    assert all(h["outcome"] in ("none", "ok") for h in hist), [h for h in hist if h["outcome"] not in ("none", "ok")]
    assert (
        ramp.cli("autoscale", "history", "-i", str(ramp.inv_path), "--state-dir", str(ramp.state_dir)).returncode == 0
    )
