"""``clusterctl gateway sync``: the gateway follows the instances' state.

:func:`decide` (pure) turns deploy's status rows, the marked-down set and the
TP groups doctor finds UNAVAILABLE into one :class:`ServerState` per
instance:

* down: marked down (drain, operator; a pool's router ``router-P`` too: a sync while deploy
  or ``stop``/``restart`` has it drained keeps it down), TP group UNAVAILABLE, hung (``/health``
  answers but requests run and no token comes: doctor's hung-engine rule, in
  ``clusterctl status``), or not serving (``clusterctl status`` state other than
  ``serving``: starting, unhealthy, failed, stopped, absent, ...); up again as
  soon as a sync sees it serving;
* up otherwise, with the least-connections weight
  ``100 x (1 - load) x capacity`` rounded to a multiple of 10 (at least 1): ``load`` the load score
  (0 when unknown), ``capacity`` 1 unless the model's instances run on
  different GPU models, then the instance's peak generation throughput over
  the model's best (``clusterctl.deploy.status.peaks``; 1 while a peak is unknown).

:func:`sync_gateway` renders with those states and applies only when the
rendered digest differs from the last one applied, and not sooner than
``gateway.sync_interval_s`` after the last reload unless ``force`` (a
mark-down is forced: a drain must not wait).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.deploy.units.pdrouter import gateway_servers
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.gateway import state as gwstate
from clusterctl.gateway.deploy import GatewayHostResult, apply_gateway, push_scores, secret_inputs
from clusterctl.gateway.render import DEFAULT_SEATS, MAX_WEIGHT, ServerState, render_gateway
from clusterctl.fleet.fleet import Fleet
from clusterctl.inventory.model import Instance, Inventory

#: Why a hung instance is down (fixed words: a reason that changed every round would reload nginx).
HUNG_REASON = "hung: requests running, no token generated"
HUNG_WAITING_REASON = "hung: requests waiting, none running, no token generated"
#: Weights are multiples of this, so small load changes cause no reload.
WEIGHT_STEP = 10


@dataclass(frozen=True)
class Observed:
    """What sync knows of one instance: deploy's status ``state``, load score, peak tokens/s."""

    state: str
    load: float | None = None
    peak_tokens_per_s: float | None = None
    healthy: bool | None = None
    #: status's message for an instance that is not serving (a unit down: the reason from its journal)
    reason: str = ""
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    seats: int | None = None  # --max-num-seqs when known


@dataclass
class SyncResult:
    """One sync: the states decided, whether the config changed, what each host did.

    ``skipped``: why nothing was applied (``unchanged``, ``interval``,
    ``dry-run``), else ``None``; ``next_allowed_s``: seconds until a reload
    is allowed again (``interval`` only).
    """

    digest: str
    servers: dict[str, ServerState]
    changed: bool
    skipped: str | None = None
    next_allowed_s: float = 0.0
    hosts: list[GatewayHostResult] = field(default_factory=list)
    scores: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "changed": self.changed,
            "skipped": self.skipped,
            "next_allowed_s": round(self.next_allowed_s, 1),
            "servers": {
                n: {"down": s.down, "weight": s.weight, "reason": s.reason} for n, s in sorted(self.servers.items())
            },
            "hosts": [h.to_json() for h in self.hosts],
            "scores": self.scores,
        }


def tp_unavailable(findings: Iterable[Finding]) -> set[str]:
    """Instances whose TP group doctor's ``tp.group`` check marks UNAVAILABLE (CRIT)."""
    return {
        f.subject.removeprefix("tp-group:")
        for f in findings
        if f.check == "tp.group" and f.severity == Severity.CRIT and f.subject.startswith("tp-group:")
    }


def _capacity(inv: Inventory, instances: Mapping[str, Instance], observed: Mapping[str, Observed]) -> dict[str, float]:
    """Per instance its throughput relative to its model's best, where GPU models are mixed."""
    out: dict[str, float] = {}
    by_model: dict[str, list[str]] = {}
    for name, inst in instances.items():
        by_model.setdefault(inst.model, []).append(name)
    for names in by_model.values():
        gpu_models = {
            inv.hosts[instances[n].placement[0].host].gpus.model
            for n in names
            if instances[n].placement and instances[n].placement[0].host in inv.hosts
        }
        peaks = {n: observed[n].peak_tokens_per_s for n in names if n in observed}
        known = [p for p in peaks.values() if p]
        if len(gpu_models) < 2 or not known:
            continue
        best = max(known)
        for n, p in peaks.items():
            if p:
                out[n] = p / best
    return out


def dispatch_scores(
    inv: Inventory,
    instances: Mapping[str, Instance],
    observed: Mapping[str, Observed],
    servers: Mapping[str, ServerState],
    now: float,
) -> dict[str, Any]:
    """What ``gateway sync`` posts for least_score dispatch (docs/gateway.md):
    ``{"at", "instances": {NAME: {"load", "step", "down", "reason"}}}``; ``at`` (``now``) is when the
    engines were measured: the gateway counts the requests it sent after it on top.

    The gateway counts the requests it has in flight per instance itself (exact,
    live); the score njs compares is ``max(load, in flight x step) + (1 - cap) x
    step / 2``.  ``step`` = 1 / seats (--max-num-seqs): 1.0 is a full batch, so a
    free seat wins (the request starts at once, at whatever speed).  ``cap`` is
    the instance's measured throughput relative to its model's best (1 unless GPU
    models are mixed): at equal occupancy the faster GPU wins.  ``load`` = KV
    cache use: what request counts do not show (long prompts fill the cache).
    ``down``: not serving or TP group UNAVAILABLE (a drain's mark-down is
    in the rendered config instead, so marking up needs no new scores).
    """
    capacity = _capacity(inv, instances, observed)
    out: dict[str, Any] = {}
    for name in sorted(instances):
        obs = observed.get(name)
        st = servers.get(name, ServerState())
        cap = capacity.get(name, 1.0) or 1.0
        seats = obs.seats if obs is not None and obs.seats else DEFAULT_SEATS
        step = round(1.0 / seats, 6)
        if st.down and not st.reason.startswith("marked down"):
            out[name] = {"down": True, "reason": st.reason, "load": 1.0, "step": step, "cap": round(cap, 3)}
            continue
        kv = (obs.kv_usage or 0.0) if obs is not None else 0.0
        out[name] = {"down": False, "load": round(kv, 4), "step": step, "cap": round(cap, 3)}
    return {"at": round(now, 3), "instances": out}


def decide(
    inv: Inventory,
    instances: Mapping[str, Instance],
    observed: Mapping[str, Observed],
    *,
    marked_down: Mapping[str, Mapping[str, str]] = {},
    unavailable: Iterable[str] = (),
) -> dict[str, ServerState]:
    """One :class:`ServerState` per instance of ``instances`` (rules in the module doc)."""
    bad_tp = set(unavailable)
    capacity = _capacity(inv, instances, observed)
    out: dict[str, ServerState] = {}
    for name in instances:
        obs = observed.get(name)
        if name in marked_down:
            out[name] = _marked(marked_down[name])
        elif name in bad_tp:
            out[name] = ServerState(True, 1, "TP group UNAVAILABLE")
        elif obs is None:
            out[name] = ServerState(True, 1, "no status")
        elif obs.state == "hung":  # /health answers 200: the rule below would keep it up
            out[name] = ServerState(True, 1, HUNG_WAITING_REASON if obs.running == 0 and obs.waiting else HUNG_REASON)
        elif obs.state != "serving" and obs.healthy is not True:
            out[name] = ServerState(True, 1, f"{obs.state}: {obs.reason}" if obs.reason else obs.state)
        else:
            load = min(1.0, max(0.0, obs.load or 0.0))
            weight = MAX_WEIGHT * (1.0 - load) * capacity.get(name, 1.0)
            # Steps of WEIGHT_STEP: load that wobbles a little does not change the config (no reload).
            out[name] = ServerState(False, max(1, min(MAX_WEIGHT, round(weight / WEIGHT_STEP) * WEIGHT_STEP)))
    # A pool's router (router-P) is no instance sync measures, but a drain marks it down like one (deploy
    # before it restarts the router, stop|restart router-P): a sync meanwhile keeps it down.
    for name in gateway_servers(inv, instances):
        if name not in out and name in marked_down:
            out[name] = _marked(marked_down[name])
    return out


def _marked(mark: Mapping[str, str]) -> ServerState:
    return ServerState(True, 1, "marked down" + (f": {mark.get('reason')}" if mark.get("reason") else ""))


def render_states(inv: Inventory, servers: Mapping[str, ServerState]) -> dict[str, ServerState]:
    """What goes into the rendered config.  least_score: only a drain's mark-down (health and
    load travel as scores, without a reload); least_conn: everything (weights, every down)."""
    gw = inv.gateway
    if gw is None or gw.dispatch != "least_score":
        return dict(servers)
    return {
        n: (s if s.down and s.reason.startswith("marked down") else ServerState(reason="")) for n, s in servers.items()
    }


def sync_gateway(
    inv: Inventory,
    fleet: Fleet,
    instances: Mapping[str, Instance],
    servers: Mapping[str, ServerState],
    *,
    state_dir: Path,
    force: bool = False,
    dry_run: bool = False,
    now: Callable[[], float] = time.time,
    on_event: Callable[[str], None] | None = None,
    observed: Mapping[str, Observed] | None = None,
    measured_at: float | None = None,
) -> SyncResult:
    """Render with ``servers`` and apply to every gateway host when the config changed.

    ``fleet`` must hold the gateway hosts.  Applies at most once per
    ``sync_interval_s`` (``force`` ignores it); ``dry_run`` applies nothing and
    stores nothing.  The decided states are stored even when the reload waits
    for the interval, so the next sync or mark-down starts from them.
    """
    gw = inv.gateway
    assert gw is not None
    say = on_event or (lambda s: None)
    rendered = render_gateway(inv, instances, render_states(inv, servers), **secret_inputs(inv, state_dir))
    if dry_run:
        st = gwstate.load(state_dir)
        return SyncResult(rendered.digest, dict(servers), rendered.digest != st.digest, "dry-run")
    scores = (
        dispatch_scores(inv, instances, observed, servers, measured_at if measured_at is not None else now())
        if observed is not None and gw.dispatch == "least_score"
        else None
    )
    with gwstate.locked(state_dir) as st:
        st.servers = dict(servers)
        result = SyncResult(rendered.digest, dict(servers), rendered.digest != st.digest)
        result.scores = scores
        if not result.changed:
            result.skipped = "unchanged"
            if scores is not None:  # the load moves every round: scores without a reload
                result.hosts = push_scores(fleet, rendered, scores, port=gw.admin_port, hosts=list(gw.hosts))
            return result
        wait = st.last_reload + gw.sync_interval_s - now()
        if wait > 0 and not force:
            result.skipped, result.next_allowed_s = "interval", wait
            say(f"gateway: config changed; next reload allowed in {wait:.1f} s")
            return result
        say(f"gateway: applying config {rendered.digest[:16]} to {', '.join(gw.hosts)}")
        result.hosts = apply_gateway(fleet, rendered, port=gw.admin_port, hosts=list(gw.hosts))
        if result.ok and scores is not None:
            pushed = push_scores(fleet, rendered, scores, port=gw.admin_port, hosts=list(gw.hosts))
            result.hosts = [h if p.ok else p for h, p in zip(result.hosts, pushed)]  # a failed push is the host's row
        if result.ok:
            st.digest, st.config = rendered.digest, rendered.config
            if not all(h.action == "updated" for h in result.hosts):  # "updated": the key file alone
                st.last_reload = now()
        return result
