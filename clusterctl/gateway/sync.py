"""``clusterctl gateway sync``: the gateway follows the instances' state.

:func:`decide` (pure) turns deploy's status rows, the marked-down set and the
TP groups doctor finds UNAVAILABLE into one :class:`ServerState` per
instance:

* down: marked down (drain, operator), TP group UNAVAILABLE, or not serving
  (``clusterctl status`` state other than ``serving``: starting, unhealthy,
  failed, stopped, absent, ...);
* up otherwise, with the least-connections weight
  ``100 x (1 - load) x capacity`` rounded to a multiple of 10 (at least 1): ``load`` the load score
  (0 when unknown), ``capacity`` 1 unless the model's instances run on
  different GPU models, then the instance's peak generation throughput over
  the model's best (``clusterctl.deploy.peaks``; 1 while a peak is unknown).

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

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.gateway import state as gwstate
from clusterctl.gateway.deploy import GatewayHostResult, apply_gateway, secret_inputs
from clusterctl.gateway.render import MAX_WEIGHT, ServerState, render_gateway
from clusterctl.inventory.model import Instance, Inventory

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

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "changed": self.changed, "skipped": self.skipped,
                "next_allowed_s": round(self.next_allowed_s, 1),
                "servers": {n: {"down": s.down, "weight": s.weight, "reason": s.reason}
                            for n, s in sorted(self.servers.items())},
                "hosts": [h.to_json() for h in self.hosts]}


def tp_unavailable(findings: Iterable[Finding]) -> set[str]:
    """Instances whose TP group doctor's ``tp.group`` check marks UNAVAILABLE (CRIT)."""
    return {f.subject.removeprefix("tp-group:") for f in findings
            if f.check == "tp.group" and f.severity == Severity.CRIT and f.subject.startswith("tp-group:")}


def _capacity(inv: Inventory, instances: Mapping[str, Instance],
              observed: Mapping[str, Observed]) -> dict[str, float]:
    """Per instance its throughput relative to its model's best, where GPU models are mixed."""
    out: dict[str, float] = {}
    by_model: dict[str, list[str]] = {}
    for name, inst in instances.items():
        by_model.setdefault(inst.model, []).append(name)
    for names in by_model.values():
        gpu_models = {inv.hosts[instances[n].placement[0].host].gpus.model
                      for n in names if instances[n].placement and instances[n].placement[0].host in inv.hosts}
        peaks = {n: observed[n].peak_tokens_per_s for n in names if n in observed}
        known = [p for p in peaks.values() if p]
        if len(gpu_models) < 2 or not known:
            continue
        best = max(known)
        for n, p in peaks.items():
            if p:
                out[n] = p / best
    return out


def decide(inv: Inventory, instances: Mapping[str, Instance], observed: Mapping[str, Observed], *,
           marked_down: Mapping[str, Mapping[str, str]] = {}, unavailable: Iterable[str] = ()) -> dict[str, ServerState]:
    """One :class:`ServerState` per instance of ``instances`` (rules in the module doc)."""
    bad_tp = set(unavailable)
    capacity = _capacity(inv, instances, observed)
    out: dict[str, ServerState] = {}
    for name in instances:
        obs = observed.get(name)
        if name in marked_down:
            out[name] = ServerState(True, 1, "marked down" + (f": {marked_down[name].get('reason')}"
                                                              if marked_down[name].get("reason") else ""))
        elif name in bad_tp:
            out[name] = ServerState(True, 1, "TP group UNAVAILABLE")
        elif obs is None:
            out[name] = ServerState(True, 1, "no status")
        elif obs.state != "serving" and obs.healthy is not True:
            out[name] = ServerState(True, 1, f"{obs.state}: {obs.reason}" if obs.reason else obs.state)
        else:
            load = min(1.0, max(0.0, obs.load or 0.0))
            weight = MAX_WEIGHT * (1.0 - load) * capacity.get(name, 1.0)
            # Steps of WEIGHT_STEP: load that wobbles a little does not change the config (no reload).
            out[name] = ServerState(False, max(1, min(MAX_WEIGHT, round(weight / WEIGHT_STEP) * WEIGHT_STEP)))
    return out


def sync_gateway(inv: Inventory, fleet: Any, instances: Mapping[str, Instance],
                 servers: Mapping[str, ServerState], *, state_dir: Path, force: bool = False,
                 dry_run: bool = False, now: Callable[[], float] = time.time,
                 on_event: Callable[[str], None] | None = None) -> SyncResult:
    """Render with ``servers`` and apply to every gateway host when the config changed.

    ``fleet`` must hold the gateway hosts.  Applies at most once per
    ``sync_interval_s`` (``force`` ignores it); ``dry_run`` applies nothing and
    stores nothing.  The decided states are stored even when the reload waits
    for the interval, so the next sync or mark-down starts from them.
    """
    gw = inv.gateway
    assert gw is not None
    say = on_event or (lambda s: None)
    rendered = render_gateway(inv, instances, servers, **secret_inputs(inv, state_dir))
    if dry_run:
        st = gwstate.load(state_dir)
        return SyncResult(rendered.digest, rendered.servers, rendered.digest != st.digest, "dry-run")
    with gwstate.locked(state_dir) as st:
        st.servers = dict(rendered.servers)
        result = SyncResult(rendered.digest, rendered.servers, rendered.digest != st.digest)
        if not result.changed:
            result.skipped = "unchanged"
            return result
        wait = st.last_reload + gw.sync_interval_s - now()
        if wait > 0 and not force:
            result.skipped, result.next_allowed_s = "interval", wait
            say(f"gateway: config changed; next reload allowed in {wait:.1f} s")
            return result
        say(f"gateway: applying config {rendered.digest[:16]} to {', '.join(gw.hosts)}")
        result.hosts = apply_gateway(fleet, rendered, port=gw.admin_port, hosts=list(gw.hosts))
        if result.ok:
            st.digest, st.config = rendered.digest, rendered.config
            if not all(h.action == "updated" for h in result.hosts):  # "updated": the key file alone
                st.last_reload = now()
        return result
