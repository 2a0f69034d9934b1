"""Counter rates: 32-bit wrap, resets, missing counters, and where the samples come from."""

from __future__ import annotations

import copy

from clusterctl.diagnose.counters import WRAP_32, delta, nic_rates, rates_between
from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import run_analyzers

import roce_facts as R


def test_a_32_bit_counter_that_wrapped_gives_the_wrapped_delta():
    assert delta("out_of_sequence", WRAP_32 - 10, 5, wide32=True) == 15


def test_a_counter_that_went_down_far_from_the_top_was_reset_not_wrapped():
    assert delta("link_down_events_phy", 5, 0, wide32=True) is None
    assert delta("np_cnp_sent", 2418907, 12, wide32=False) is None  # 64-bit: never wraps


def test_missing_is_unknown_not_zero():
    assert delta("x", None, 5, wide32=False) is None
    s0 = {"t": 1.0, "ethtool_stats": {"a": 1}, "hw_counters": None, "counters": {}}
    s1 = {"t": 3.0, "ethtool_stats": {"a": 5, "b": 7}, "hw_counters": {"np_cnp_sent": 9}, "counters": {}}
    r = rates_between(s0, s1)
    assert r is not None and r.ethtool == {"a": 2.0}
    assert r.get("b") is None and r.get("np_cnp_sent") is None


def test_rates_need_a_positive_interval():
    s = {"t": 4.0, "ethtool_stats": {"a": 1}}
    assert rates_between(s, dict(s)) is None


def test_hw_counter_wrap_is_a_rate_and_a_reset_is_not_reported():
    # out_of_sequence wraps (a real loss signal: 30 in 3 s); np_cnp_sent goes
    # back to 0 (driver reload): no CNP finding, certainly not a negative rate.
    bad = R.nic(
        first={"out_of_sequence": WRAP_32 - 15, "np_cnp_sent": 10**9}, second={"out_of_sequence": 15, "np_cnp_sent": 0}
    )
    ctx = R.cluster(4, {"gpu02": R.doc("gpu02", [bad, R.nic("eth3", "mlx5_1")])}, per_leaf=2)
    r, src = nic_rates(bad)
    assert src == "node-timed samples" and r is not None
    assert r.hw["out_of_sequence"] == 10.0 and "hw:np_cnp_sent" in r.resets
    fs = run_analyzers(ctx, ["roce.transport", "roce.congestion"])
    seq = [f for f in fs if f.host == "gpu02" and f.check == "roce.transport" and f.severity != Severity.OK]
    assert len(seq) == 1 and seq[0].severity == Severity.CRIT and "out_of_sequence 10/s" in seq[0].message
    assert all(f.severity == Severity.OK for f in fs if f.check == "roce.congestion")


def test_two_facts_runs_stand_in_for_node_samples():
    n = R.nic()
    n.pop("samples")
    later = copy.deepcopy(n)
    later["ethtool_stats"]["rx_prio3_pause_duration"] += 2_700_000
    docs = {
        "a": {"collected_at": "2026-11-30T12:00:00+00:00", "nics": [n]},
        "b": {"collected_at": "2026-11-30T12:00:03+00:00", "nics": [later]},
    }
    r, src = nic_rates(n, docs["b"], docs["a"])
    assert src == "two facts runs" and r is not None
    assert r.ethtool["rx_prio3_pause_duration"] == 900_000.0


def test_no_samples_is_unknown_with_the_reason():
    n = R.nic()
    n["samples"] = None
    ctx = R.cluster(2, {"gpu01": R.doc("gpu01", [n])}, per_leaf=2)
    fs = [f for f in run_analyzers(ctx, ["roce.pfc"]) if f.host == "gpu01"]
    assert [f.severity for f in fs] == [Severity.UNKNOWN]
    assert "no counter samples" in fs[0].message


def test_sysfs_counters_use_their_own_read_times():
    s0 = {"t": 10.0, "t_sysfs": 10.5, "ethtool_stats": {"a": 0}, "hw_counters": {"np_cnp_sent": 0}}
    s1 = {"t": 12.0, "t_sysfs": 14.5, "ethtool_stats": {"a": 20}, "hw_counters": {"np_cnp_sent": 400}}
    r = rates_between(s0, s1)
    assert r is not None and r.ethtool["a"] == 10.0 and r.hw["np_cnp_sent"] == 100.0


def test_one_nic_without_samples_is_unknown_and_the_other_still_checked():
    eth3 = R.nic("eth3", "mlx5_1")
    eth3["samples"] = [eth3["samples"][0]]  # the second read did not finish
    storm = R.nic("eth2", rates={"rx_prio3_pause_duration": 900_000, "rx_prio3_pause": 20000})
    ctx = R.cluster(2, {"gpu01": R.doc("gpu01", [storm, eth3])}, per_leaf=2)
    fs = [(f.severity, f.subject) for f in run_analyzers(ctx, ["roce.pfc"]) if f.host == "gpu01"]
    assert sorted(fs) == [(Severity.CRIT, "nic:eth2"), (Severity.UNKNOWN, "nic:eth3")]
