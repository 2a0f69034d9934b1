"""Release gates in the rollout: ``deploy --gate drift[:BASELINE]`` and ``--gate bench:REFERENCE``.

After a batch's health gates pass, :class:`ReleaseDeploy` runs
:func:`clusterctl.drift.release.release_gates` on the batch's instances
(through the engine's ``extra_gates`` hook); a failed release gate fails its
host exactly like a failed health gate, so the batch is rolled back and the
rollout stops.  Both gates fail closed (a missing baseline, an unreachable
instance or reference fails them).

- drift: each started instance's greedy outputs against the named baseline
  (default ``previous``), with ``drift check``'s limits.
- bench: each started instance against REFERENCE (an inventory instance,
  template replicas included, or a URL) still on the previous version, same
  workload, within ``tolerance``.  Once the reference instance itself has been
  applied by this run it no longer serves the previous version: the bench
  gate is then skipped (with a warning) for the remaining batches.

``record_baseline``: before anything is applied, the named baseline is
recorded from one running instance this run is about to change (the version
being replaced), so ``--gate drift:NAME`` compares against it.  One baseline
serves one model: changing instances of several models with it is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from clusterctl.bench.target import is_url
from clusterctl.deploy.rollout import gates
from clusterctl.deploy.rollout.engine import Deploy, api_key, instance_served_name, render_all
from clusterctl.diagnose.thresholds import check_file
from clusterctl.drift import prompts as drift_prompts
from clusterctl.drift import release as drift_release
from clusterctl.drift import run as drift_run
from clusterctl.drift import store as drift_store
from clusterctl.drift.store import store_path
from clusterctl.errors import ClusterctlError
from clusterctl.vllmclient import Endpoint
from clusterctl.fleet.fleet import Fleet
from clusterctl.deploy.rollout.plan import Plan
from clusterctl.deploy.preflight.report import PreflightReport

#: ``record(url, api_key, name)`` records baseline ``name`` from ``url``; returns a one-line summary.
Recorder = Callable[[str, Optional[str], str], str]


@dataclass(frozen=True)
class ReleaseGates:
    """What ``--gate`` / ``--bench-tolerance`` / ``--record-baseline`` asked for.

    ``drift_baseline``: baseline name, None for no drift gate; ``bench_reference``:
    instance name or URL, None for no bench gate; ``bench_tolerance``: relative
    regression allowed (0.1 = 10 %); ``record_baseline``: baseline to record
    before applying, or None; ``state_dir``: where baselines live (None: the
    drift default, ``$XDG_STATE_HOME/clusterctl``).
    """

    drift_baseline: str | None = None
    bench_reference: str | None = None
    bench_tolerance: float = 0.1
    record_baseline: str | None = None
    state_dir: Path | None = None

    @property
    def any(self) -> bool:
        return bool(self.drift_baseline or self.bench_reference or self.record_baseline)


def parse_gates(
    values: Sequence[str],
    *,
    bench_tolerance: float = 0.1,
    record_baseline: str | None = None,
    state_dir: Path | None = None,
) -> ReleaseGates:
    """``--gate`` values (``drift``, ``drift:NAME``, ``bench:REFERENCE``), each kind at most once.
    Raises ClusterctlError naming the bad value."""
    drift: str | None = None
    bench: str | None = None
    for v in values:
        kind, sep, arg = v.partition(":")
        kind, arg = kind.strip(), arg.strip()
        if kind == "drift":
            if drift is not None:
                raise ClusterctlError(f"--gate {v!r}: a drift gate is already given ({drift!r})")
            drift = arg or "previous"
            store_path("baselines", drift, state_dir)  # validates the name
        elif kind == "bench":
            if bench is not None:
                raise ClusterctlError(f"--gate {v!r}: a bench gate is already given ({bench!r})")
            if not arg:
                raise ClusterctlError(
                    f"--gate {v!r}: bench needs a reference: bench:INSTANCE or bench:http://HOST:PORT"
                )
            bench = arg
            _check_url(arg)
        else:
            raise ClusterctlError(f"--gate {v!r}: expected drift, drift:BASELINE or bench:REFERENCE")
    if record_baseline is not None:
        store_path("baselines", record_baseline, state_dir)
    if not 0 <= bench_tolerance <= 10:
        raise ClusterctlError(f"--bench-tolerance {bench_tolerance:g}: expected a fraction such as 0.1 (10 %)")
    return ReleaseGates(drift, bench, bench_tolerance, record_baseline, state_dir)


def _check_url(ref: str) -> None:
    """A URL reference must be plain ``http://HOST:PORT`` (the gate sends requests to HOST:PORT)."""
    if is_url(ref):
        ep = Endpoint.parse(ref)
        if ep.https or ep.base_path.strip("/"):
            raise ClusterctlError(f"--gate bench:{ref}: a reference URL is http://HOST:PORT (no https, no path)")


def record_previous(url: str, key: str | None, name: str, state_dir: Path | None = None) -> str:
    """Record baseline ``name`` from ``url`` with the shipped prompt set; a one-line summary.
    Raises ClusterctlError when the endpoint does not answer."""
    ps = drift_prompts.load(check_file("drift/basic.jsonl"))
    b = drift_run.record(Endpoint.parse(url).with_key(key), name, ps)
    path = drift_store.save(b, state_dir)
    return f"baseline {name!r}: {len(b.outputs)} prompts from {url} (model {b.env.get('model')}) -> {path}"


class ReleaseDeploy(Deploy):
    """The deploy engine with release gates after each batch's health gates (see the module doc)."""

    def __init__(self, *args: Any, release: ReleaseGates, recorder: Recorder | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.release = release
        self.recorder: Recorder = recorder or (lambda u, k, n: record_previous(u, k, n, release.state_dir))
        self.applied: set[str] = set()  # instances started by batches gated so far (their version is new)

    def preflight(self, fleet: Fleet, plan: Plan) -> PreflightReport | None:
        rep = super().preflight(fleet, plan)
        if self.release.record_baseline:
            self._record(plan, self.release.record_baseline)
        return rep

    def _record(self, plan: Plan, name: str) -> None:
        """Record ``name`` from one running instance about to change; ClusterctlError when that is ambiguous
        (instances of several models) or impossible (an instance does not answer)."""
        changing = [i for hp in plan.hosts for i in hp.items if i.action == "changed" and i.instance in self.rendered]
        models = sorted({self.rendered[i.instance].model for i in changing})
        if len(models) > 1:
            raise ClusterctlError(
                f"--record-baseline {name}: this deploy changes instances of {len(models)} models "
                f"({', '.join(models)}); one baseline serves one model: narrow it with --instances"
            )
        running = [i for i in changing if i.state == "active"]
        if not running:
            self.event(
                "warn",
                f"--record-baseline {name}: no running instance is about to change; baseline not recorded",
                ok=False,
            )
            return
        t = self._target(running[0].instance)
        self.event("phase", f"recording baseline {name!r} from {t.instance} (the version being replaced)")
        try:
            self.event("phase", self.recorder(t.url, t.api_key, name), t.host)
        except ClusterctlError as e:
            raise ClusterctlError(f"--record-baseline {name}: {t.instance} at {t.url}: {e}") from e

    def _target(self, name: str) -> gates.GateTarget:
        """A gate target for instance ``name``: one this run renders, else any of the inventory (placed
        template replicas included).  Raises ClusterctlError for an unknown name."""
        r = self.rendered.get(name)
        if r is None:
            inst = self.instances.get(name)
            if inst is None:
                known = ", ".join(sorted(self.instances)) or "none"
                raise ClusterctlError(f"bench gate reference {name!r}: no such instance (instances: {known})")
            [r] = render_all(self.inv, {name: inst})
        return gates.GateTarget(
            name,
            r.host,
            self.inv.hosts[r.host].address,
            r.port,
            instance_served_name(self.inv, self.instances.get(name), r),
            api_key(r),
        )

    def _reference(self, canary: gates.GateTarget) -> gates.GateTarget | None:
        ref = self.release.bench_reference
        if ref is None:
            return None
        if is_url(ref):
            ep = Endpoint.parse(ref)
            key = os.environ.get("CLUSTERCTL_API_KEY") or canary.api_key
            return gates.GateTarget(ref, "-", ep.host, ep.port, canary.served_name, key)
        if ref in self.applied:
            return None
        return self._target(ref)

    def extra_gates(self, fleet: Fleet, passed: list[gates.GateTarget]) -> list[gates.GateResult]:
        out = super().extra_gates(fleet, passed)
        failed = {g.instance for g in out if not g.ok}
        todo = [t for t in passed if t.instance not in failed]
        ref = self.release.bench_reference
        self.applied.update(t.instance for t in passed)
        bench_skipped = ref is not None and ref in self.applied
        if bench_skipped and todo:
            self.event("warn", f"bench gate skipped: reference {ref} has been upgraded by this run", ok=False)
        if not todo or not (self.release.drift_baseline or (ref and not bench_skipped)):
            return out
        try:
            reference = self._reference(todo[0]) if ref else None
        except ClusterctlError as e:
            return out + [gates.GateResult(t.instance, t.host, False, "bench", str(e), 0.0) for t in todo]
        return out + drift_release.release_gates(
            todo,
            drift_baseline=self.release.drift_baseline,
            bench_reference=(lambda t: reference) if reference is not None else None,
            drift_options={"state_dir": self.release.state_dir},
            bench_options={"tolerance": self.release.bench_tolerance},
            on_result=self.gate_event,
        )
