"""The autoscaler's decision as a pure function: worked examples with the numbers, and properties
(hypothesis) an operator relies on when leaving it running at night."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.autoscale.decide import ReplicaSignal, ScalerState, Signals, decide, record_outcome
from clusterctl.inventory.model import AutoscalePolicy

POLICY = AutoscalePolicy(
    min_replicas=1,
    max_replicas=6,
    signal="load",
    high=0.7,
    low=0.3,
    scale_out_after_s=30,
    scale_in_after_s=300,
    cooldown_out_s=60,
    cooldown_in_s=120,
    max_step=2,
    backoff_s=100,
)


def sig(*values: float | None, state: str = "serving", worth: float = 1.0) -> Signals:
    return Signals(
        len(values),
        tuple(
            ReplicaSignal(
                f"p-{i}",
                state if v is not None else "serving",
                v,
                worth,
                None if v is not None else "metrics: timed out",
            )
            for i, v in enumerate(values, 1)
        ),
    )


def test_scale_out_waits_for_the_hold_then_adds_enough_for_the_band_middle() -> None:
    d = decide(sig(0.9, 0.9), ScalerState(), POLICY, 1000.0)
    assert (d.action, d.rule, d.state.above_since) == ("none", "holding", 1000.0)
    assert "load 0.9 > high 0.7 for 0 s of scale_out_after_s 30" in d.reasons[0]
    d = decide(sig(0.9, 0.9), d.state, POLICY, 1030.0)
    # worth 2 x 0.9 / 0.5 = 3.6 -> 2 more (max_step 2)
    assert (d.action, d.target, d.rule) == ("out", 4, "above-high")
    assert "needs 3.6" in d.reasons[1]


def test_scale_in_only_with_every_replica_measured_and_after_the_long_hold() -> None:
    s = ScalerState(below_since=0.0)
    d = decide(sig(0.05, 0.05, 0.05), s, POLICY, 299.0)
    assert (d.action, d.rule) == ("none", "holding")
    d = decide(sig(0.05, 0.05, 0.05), s, POLICY, 300.0)
    assert (d.action, d.target, d.rule) == ("in", 1, "below-low")
    d = decide(sig(0.05, None, 0.05), s, POLICY, 900.0)
    assert (d.action, d.rule, d.state.below_since) == ("none", "missing-data", None)
    assert "p-2: metrics: timed out" in d.reasons[0] and "never counts as idle" in d.reasons[0]
    starting = Signals(
        3,
        (
            ReplicaSignal("p-1", "serving", 0.0),
            ReplicaSignal("p-2", "serving", 0.0),
            ReplicaSignal("p-3", "starting", None),
        ),
    )
    assert decide(starting, s, POLICY, 900.0).rule == "missing-data"
    # a replica not even listed (2 of 3 measured) is missing too
    assert decide(Signals(3, sig(0.0, 0.0).replicas), s, POLICY, 900.0).rule == "missing-data"


def test_scale_in_stops_before_the_band_middle() -> None:
    d = decide(sig(0.28, 0.28), ScalerState(below_since=0.0), POLICY, 1000.0)
    # one fewer: 0.28 x 2 / 1 = 0.56 > 0.5 -> it would scale right back out
    assert (d.action, d.rule) == ("none", "would-flap")


def test_bounds_cooldown_backoff_and_no_data() -> None:
    assert decide(Signals(0), ScalerState(), POLICY, 0.0).target == 1
    assert decide(sig(*[0.5] * 8), ScalerState(), POLICY, 0.0).target == 6
    assert decide(Signals(2), ScalerState(), POLICY, 0.0).rule == "no-data"
    cooling = ScalerState(above_since=0.0, last_action_at=950.0, last_action="out")
    d = decide(sig(0.95, 0.95), cooling, POLICY, 1000.0)
    assert (d.action, d.rule) == ("none", "cooldown") and "cooldown_out_s 60" in d.reasons[0]
    backing = ScalerState(above_since=0.0, backoff_until=1050.0, failures=1)
    assert decide(sig(0.95), backing, POLICY, 1000.0).rule == "backoff"
    assert decide(sig(0.95), backing, POLICY, 1050.0).action == "out"


def test_a_failed_scale_out_backs_off_longer_each_time() -> None:
    d = decide(sig(0.95), ScalerState(above_since=0.0), POLICY, 100.0)
    s1 = record_outcome(ScalerState(), d, "failed", POLICY, 100.0)
    assert (s1.failures, s1.backoff_until) == (1, 200.0)
    s2 = record_outcome(s1, d, "failed", POLICY, 300.0)
    assert (s2.failures, s2.backoff_until) == (2, 500.0)
    assert record_outcome(s2, d, "ok", POLICY, 600.0).failures == 0
    waited = record_outcome(ScalerState(), d, "waited", POLICY, 100.0)
    assert waited.last_action_at is None  # the deploy lock was held: nothing happened, no cooldown


def test_worth_weights_heterogeneous_gpus() -> None:
    mixed = Signals(
        2, (ReplicaSignal("p-1", "serving", 0.9, 1.0), ReplicaSignal("p-2", "serving", 0.1, 0.25)), new_worth=1.0
    )
    d = decide(mixed, ScalerState(), POLICY, 0.0)
    assert d.value is not None and abs(d.value - (0.9 + 0.025) / 1.25) < 1e-9  # the big GPU's load dominates
    cheap = Signals(1, sig(0.95).replicas, new_worth=0.25)
    d = decide(cheap, ScalerState(above_since=0.0), POLICY, 100.0)
    assert d.target == 3  # worth 1 x 0.95 / 0.5 = 1.9 -> 0.9 more = 4 small replicas, max_step 2


# ---------------------------------------------------------------- properties

values = st.one_of(st.none(), st.floats(0.0, 1.0, allow_nan=False))
policies = st.builds(
    lambda lo, gap, mn, span, step, out_s, extra_in, cd_out, cd_in: AutoscalePolicy(
        min_replicas=mn,
        max_replicas=mn + span,
        high=min(1.0, lo + gap),
        low=lo,
        max_step=step,
        scale_out_after_s=out_s,
        scale_in_after_s=out_s + extra_in,
        cooldown_out_s=cd_out,
        cooldown_in_s=cd_in,
    ),
    st.floats(0.0, 0.8),
    st.floats(0.05, 0.5),
    st.integers(1, 4),
    st.integers(0, 6),
    st.integers(1, 4),
    st.floats(0, 60),
    st.floats(0, 600),
    st.floats(0, 120),
    st.floats(0, 600),
)
states = st.builds(
    ScalerState,
    st.one_of(st.none(), st.floats(0, 2000)),
    st.one_of(st.none(), st.floats(0, 2000)),
    st.one_of(st.none(), st.floats(0, 2000)),
    st.sampled_from([None, "out", "in"]),
    st.integers(0, 5),
    st.one_of(st.none(), st.floats(0, 3000)),
)


@settings(max_examples=400, deadline=None)
@given(policies, states, st.lists(values, min_size=0, max_size=10), st.floats(0, 3000))
def test_never_outside_min_max_never_during_cooldown_never_in_on_missing(
    policy: AutoscalePolicy, state: ScalerState, vals: list[float | None], now: float
) -> None:
    signals = sig(*vals)
    d = decide(signals, state, policy, now)
    cur = signals.current
    if policy.min_replicas <= cur <= policy.max_replicas:
        assert policy.min_replicas <= d.target <= policy.max_replicas
    if d.action == "out":
        assert d.target <= max(policy.max_replicas, cur) and d.target - cur <= policy.max_step
        assert state.backoff_until is None or now >= state.backoff_until
    if d.action == "in":
        assert d.target >= min(policy.min_replicas, cur) and cur - d.target <= policy.max_step
    if state.last_action_at is not None:
        since = now - state.last_action_at
        if since < policy.cooldown_out_s:
            assert d.action != "out"
        if since < policy.cooldown_in_s:
            assert d.action != "in"
    if d.action == "in" and cur <= policy.max_replicas:
        assert None not in vals  # unreachable metrics never count as idle
        assert d.value is not None and d.value < policy.low


@settings(max_examples=200, deadline=None)
@given(policies, st.integers(1, 6), st.floats(1, 30), st.integers(20, 200))
def test_a_flapping_signal_does_not_oscillate(policy: AutoscalePolicy, n: int, tick: float, rounds: int) -> None:
    """The signal jumps from under low to over high every tick: with a hold longer than a tick,
    nothing ever happens; the replica count never goes up then down."""
    if policy.scale_out_after_s <= tick:
        policy = replace(policy, scale_out_after_s=tick * 1.5, scale_in_after_s=tick * 1.5 + policy.scale_in_after_s)
    n = min(max(n, policy.min_replicas), policy.max_replicas)
    state, now, counts = ScalerState(), 0.0, [n]
    hi, lo = min(1.0, policy.high + 0.05), max(0.0, policy.low - 0.05)
    for i in range(rounds):
        v = hi if i % 2 else lo
        d = decide(sig(*[v] * counts[-1]), state, policy, now)
        state = record_outcome(state, d, "ok", policy, now)
        counts.append(d.target)
        now += tick
    assert counts == [n] * (rounds + 1)


@settings(max_examples=150, deadline=None)
@given(policies, st.integers(1, 6), st.lists(st.floats(0, 1), min_size=10, max_size=80), st.floats(1, 30))
def test_direction_changes_are_separated_by_the_holds(
    policy: AutoscalePolicy, n: int, trace: list[float], tick: float
) -> None:
    """Any signal trace: between a scale-out and a later scale-in at least scale_in_after_s passes
    (and cooldown_in_s), so the count cannot oscillate faster than the policy allows."""
    n = min(max(n, policy.min_replicas), policy.max_replicas)
    state, now, cur, last_out = ScalerState(), 0.0, n, None
    for v in trace:
        d = decide(sig(*[v] * cur), state, policy, now)
        if d.action == "in" and last_out is not None:
            assert now - last_out >= max(policy.scale_in_after_s, policy.cooldown_in_s) - 1e-6
        if d.action == "out":
            last_out = now
        state = record_outcome(state, d, "ok", policy, now)
        cur = d.target
        now += tick
