"""The autoscaler's decision: a pure function of (signals, state, policy, now).

:func:`decide` turns one measurement of a template's replicas into a
:class:`Decision` (``out`` / ``in`` / ``none``, the target count, the rule
that decided and the reasons with the numbers) and the next
:class:`ScalerState` (when the signal went above/below the band).
:func:`record_outcome` stamps an action that was carried out (cooldowns start,
a failed scale-out backs off).  No I/O, no clock: ``now`` is given.

The rules (docs/autoscale.md, "How a decision is made"), in order:

1. **Signal.** Over the replicas that are serving and were measured: the
   worth-weighted mean (``load``, ``kv``), waiting requests per unit of worth
   (``queue``), or the worst replica (``ttft_p90``).  A replica not serving or
   whose ``/metrics`` could not be read is *missing*: it never counts as idle.
2. **Hold.** ``above_since`` is when the signal went above ``high`` (reset
   when it is not above); ``below_since`` when it went below ``low`` with
   every replica measured (reset otherwise, also by one missing replica).
   A flapping signal keeps resetting both: no action (hysteresis).
3. **Cooldown.** No scale-out within ``cooldown_out_s`` of the last action,
   no scale-in within ``cooldown_in_s``; no scale-out before ``backoff_until``
   (after a failed one).  These win over everything below.
4. **Bounds.** Below ``min``: out to ``min``; above ``max``: in to ``max``.
5. **Out** when above ``high`` for ``scale_out_after_s``: enough replicas
   (of the preferred GPU's worth) to bring the signal to the middle of the
   band, at least 1, at most ``max_step``, never above ``max``.
6. **In** when below ``low`` for ``scale_in_after_s`` with nothing missing:
   as many as leave the signal (scaled by the worth left) at or under the
   middle of the band, at most ``max_step``, never below ``min``; none when
   even one fewer would cross it (it would scale right back out).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

from clusterctl.inventory.model import AutoscalePolicy

#: Longest back-off after repeated failed scale-outs, in seconds.
MAX_BACKOFF_S = 3600.0


@dataclass(frozen=True)
class ReplicaSignal:
    """One replica at measurement time: ``state`` as ``clusterctl status`` says (``serving``...);
    ``value``: the policy's signal for it, ``None`` when it could not be read; ``worth``: what
    one replica on its GPU model is worth; ``error``: why ``value`` is missing."""

    name: str
    state: str
    value: float | None
    worth: float = 1.0
    error: str | None = None

    @property
    def measured(self) -> bool:
        return self.state == "serving" and self.value is not None


@dataclass(frozen=True)
class Signals:
    """``current``: the replica count in force; ``replicas``: what was measured of them."""

    current: int
    replicas: tuple[ReplicaSignal, ...] = ()
    #: worth of one replica placed on the GPUs scale-out would use (the preferred model's)
    new_worth: float = 1.0


@dataclass
class ScalerState:
    """What the autoscaler remembers of one template between decisions (times: seconds, epoch)."""

    above_since: float | None = None
    below_since: float | None = None
    last_action_at: float | None = None
    last_action: str | None = None
    failures: int = 0
    backoff_until: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ScalerState":
        out = cls()
        for k in asdict(out):
            v = d.get(k)
            if k == "failures":
                setattr(out, k, int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0)
            elif k == "last_action":
                setattr(out, k, v if v in ("out", "in") else None)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                setattr(out, k, float(v))
        return out


@dataclass
class Decision:
    """``action``: ``out``, ``in`` or ``none``; ``target``: the count after it; ``rule``: which rule
    decided (``above-high``, ``below-low``, ``below-min``, ``above-max``, ``cooldown``, ``backoff``,
    ``holding``, ``missing-data``, ``no-data``, ``in-band``, ``at-max``, ``at-min``, ``would-flap``);
    ``value``: the aggregated signal (``None``: nothing measured); ``missing``: replicas not measured."""

    action: str
    current: int
    target: int
    rule: str
    reasons: list[str]
    value: float | None
    state: ScalerState
    missing: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "current": self.current,
            "target": self.target,
            "rule": self.rule,
            "reasons": self.reasons,
            "value": None if self.value is None else round(self.value, 4),
            "missing": self.missing,
        }


def aggregate(signal: str, replicas: Sequence[ReplicaSignal]) -> float | None:
    """The template's signal over the measured replicas (``None`` when none was measured)."""
    got = [r for r in replicas if r.measured]
    if not got:
        return None
    worth = sum(max(r.worth, 1e-9) for r in got)
    if signal == "ttft_p90":
        return max(float(r.value or 0.0) for r in got)
    if signal == "queue":
        return sum(float(r.value or 0.0) for r in got) / worth
    return sum(float(r.value or 0.0) * max(r.worth, 1e-9) for r in got) / worth


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def decide(signals: Signals, state: ScalerState, policy: AutoscalePolicy, now: float) -> Decision:
    """One decision (module doc); ``state`` is not changed, the next one is ``Decision.state``."""
    p = policy
    cur = signals.current
    value = aggregate(p.signal, signals.replicas)
    listed = {r.name for r in signals.replicas}
    missing = {r.name: (r.error or r.state) for r in signals.replicas if not r.measured}
    if len(listed) < cur:
        missing["(unlisted)"] = f"{cur - len(listed)} replica(s) of {cur} not measured"
    nxt = replace(state)
    what = f"{p.signal} {_fmt(value)}" if value is not None else f"{p.signal} unknown"
    # 2. hold timers
    above = value is not None and value > p.high
    below = value is not None and value < p.low and not missing
    nxt.above_since = (state.above_since if state.above_since is not None else now) if above else None
    nxt.below_since = (state.below_since if state.below_since is not None else now) if below else None

    def out(target: int, rule: str, *why: str) -> Decision:
        return Decision(
            "out" if target > cur else "in" if target < cur else "none",
            cur,
            target,
            rule,
            list(why),
            value,
            nxt,
            missing,
        )

    since_action = now - state.last_action_at if state.last_action_at is not None else math.inf
    out_blocked = since_action < p.cooldown_out_s
    in_blocked = since_action < p.cooldown_in_s
    backing_off = state.backoff_until is not None and now < state.backoff_until
    cool = (
        f"cooldown: last action ({state.last_action}) {_fmt(since_action)} s ago"
        if state.last_action_at is not None
        else ""
    )
    # 4. bounds (still behind cooldown and back-off)
    if cur < p.min_replicas:
        if backing_off:
            return out(
                cur,
                "backoff",
                f"{cur} replicas is below min {p.min_replicas}, but a failed scale-out "
                f"backs off for {_fmt(state.backoff_until - now)} s more",  # type: ignore[operator]
            )
        if out_blocked:
            return out(
                cur,
                "cooldown",
                f"{cur} replicas is below min {p.min_replicas}; {cool} < cooldown_out_s {_fmt(p.cooldown_out_s)}",
            )
        return out(min(p.min_replicas, cur + p.max_step), "below-min", f"{cur} replicas is below min {p.min_replicas}")
    if cur > p.max_replicas:
        if in_blocked:
            return out(
                cur,
                "cooldown",
                f"{cur} replicas is above max {p.max_replicas}; {cool} < cooldown_in_s {_fmt(p.cooldown_in_s)}",
            )
        return out(max(p.max_replicas, cur - p.max_step), "above-max", f"{cur} replicas is above max {p.max_replicas}")
    if value is None:
        return out(
            cur,
            "no-data",
            f"no replica of {cur} could be measured "
            f"({'; '.join(f'{k}: {v}' for k, v in sorted(missing.items())) or 'none listed'}): "
            "nothing is decided on missing data",
        )
    worth = sum(r.worth for r in signals.replicas if r.measured)
    mid = (p.high + p.low) / 2
    # 5. out
    if above:
        held = now - (nxt.above_since if nxt.above_since is not None else now)
        if cur >= p.max_replicas:
            return out(cur, "at-max", f"{what} > high {_fmt(p.high)}, but already at max {p.max_replicas}")
        if held < p.scale_out_after_s:
            return out(
                cur,
                "holding",
                f"{what} > high {_fmt(p.high)} for {_fmt(held)} s of scale_out_after_s {_fmt(p.scale_out_after_s)}",
            )
        if backing_off:
            return out(
                cur,
                "backoff",
                f"{what} > high {_fmt(p.high)}, but a failed scale-out backs off for "
                f"{_fmt(state.backoff_until - now)} s more",  # type: ignore[operator]
            )
        if out_blocked:
            return out(
                cur, "cooldown", f"{what} > high {_fmt(p.high)}; {cool} < cooldown_out_s {_fmt(p.cooldown_out_s)}"
            )
        # the worth of the measured replicas, scaled to the whole count (missing ones as average)
        total = worth * cur / max(1, len([r for r in signals.replicas if r.measured]))
        need = total * value / mid if mid > 0 else total
        add = math.ceil((need - total) / max(signals.new_worth, 1e-9) - 1e-9)
        add = max(1, min(p.max_step, add, p.max_replicas - cur))
        return out(
            cur + add,
            "above-high",
            f"{what} > high {_fmt(p.high)} for {_fmt(held)} s (>= {_fmt(p.scale_out_after_s)} s)",
            f"+{add}: worth {_fmt(total)} x {_fmt(value)} / band middle {_fmt(mid)} needs {_fmt(need)}"
            f" (new replicas worth {_fmt(signals.new_worth)}, max_step {p.max_step})",
        )
    # 6. in
    if value < p.low:
        if missing:
            return out(
                cur,
                "missing-data",
                f"{what} < low {_fmt(p.low)} over the measured replicas, but "
                + "; ".join(f"{k}: {v}" for k, v in sorted(missing.items()))
                + ": missing data never counts as idle",
            )
        held = now - (nxt.below_since if nxt.below_since is not None else now)
        if cur <= p.min_replicas:
            return out(cur, "at-min", f"{what} < low {_fmt(p.low)}, already at min {p.min_replicas}")
        if held < p.scale_in_after_s:
            return out(
                cur,
                "holding",
                f"{what} < low {_fmt(p.low)} for {_fmt(held)} s of scale_in_after_s {_fmt(p.scale_in_after_s)}",
            )
        if in_blocked:
            return out(cur, "cooldown", f"{what} < low {_fmt(p.low)}; {cool} < cooldown_in_s {_fmt(p.cooldown_in_s)}")
        # remove the highest-numbered first (placement's rule): predict with the worth that stays
        order = sorted(signals.replicas, key=lambda r: _number(r.name), reverse=True)
        remove, left = 0, worth
        for r in order[: min(p.max_step, cur - p.min_replicas)]:
            after = left - r.worth
            if after <= 0 or value * worth / after > mid:
                break
            remove, left = remove + 1, after
        if remove == 0:
            return out(
                cur,
                "would-flap",
                f"{what} < low {_fmt(p.low)}, but one replica fewer would put it above the band middle {_fmt(mid)}",
            )
        return out(
            cur - remove,
            "below-low",
            f"{what} < low {_fmt(p.low)} for {_fmt(held)} s (>= {_fmt(p.scale_in_after_s)} s), every replica measured",
            f"-{remove}: predicted {p.signal} {_fmt(value * worth / left)} <= band middle {_fmt(mid)}",
        )
    return out(cur, "in-band", f"{what} within low {_fmt(p.low)} .. high {_fmt(p.high)}")


def _number(name: str) -> int:
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def record_outcome(
    state: ScalerState, decision: Decision, outcome: str, policy: AutoscalePolicy, now: float
) -> ScalerState:
    """The state after ``decision`` was carried out with ``outcome``: ``ok``, ``failed`` (rolled back)
    or ``waited`` (the deploy lock was held: nothing happened, nothing stamped)."""
    nxt = replace(decision.state)
    if decision.action == "none" or outcome == "waited":
        return nxt
    nxt.last_action_at, nxt.last_action = now, decision.action
    nxt.above_since = nxt.below_since = None
    if outcome == "ok":
        nxt.failures, nxt.backoff_until = 0, None
    elif decision.action == "out":
        nxt.failures = state.failures + 1
        nxt.backoff_until = now + min(MAX_BACKOFF_S, policy.backoff_s * 2 ** (nxt.failures - 1))
    return nxt
