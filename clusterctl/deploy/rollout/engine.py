"""The deploy pipeline: render → read → plan → (pre-flight) → lock → batches of
stage + drain + apply + gates → rollback of a failed batch → audit → unlock.

Nothing here prints; progress goes to ``on_event(Event)``, which the CLI
renders.  See docs/deploy.md for the semantics the operator sees.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from clusterctl.deploy.rollout import apply as ap
from clusterctl.deploy.rollout import audit, gates, lock, prestage, batches as rollout
from clusterctl.deploy.units import multinode, pdrouter
from clusterctl.deploy import remote, spec
from clusterctl.deploy.rollout.drain import GatewayHook
from clusterctl.deploy.rollout.journal import first_error
from clusterctl.deploy.rollout.plan import HostPlan, Plan, make_plan, matches
from clusterctl.deploy.rollout.rollback_order import rollback_in_order
from clusterctl.deploy.state import StateStore, utc_now
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.fleet import Fleet
from clusterctl.inventory.model import Host, Instance, Inventory
from clusterctl.deploy.preflight.kvcheck import read_kv_checks
from clusterctl.deploy.rollout.drain import put_back
from clusterctl.deploy.units.render import policy_for_systemd, render_instance
from clusterctl.deploy.units.secrets import resolve_secrets
from clusterctl.stage import plan as sp, run as sr
from clusterctl.deploy.preflight import checks as preflight_checks
from clusterctl.deploy.placement import topology

if TYPE_CHECKING:  # imported where used, after start-up (INLINE_IMPORTS)
    from clusterctl.deploy.placement.place import PlacementResult
    from clusterctl.deploy.preflight.report import PreflightReport

#: ``make_fleet(hosts)`` returns a fresh Fleet (a context manager) for those hosts.
FleetFactory = Callable[[Sequence[Host]], Fleet]


@dataclass
class Event:
    """One progress line: ``kind`` is ``phase``, ``batch``, ``host``, ``gate`` or ``warn``.

    Batch events carry ``step`` (1-based) of ``steps``: the start of a batch,
    then its end (``done``).  ``bytes`` events (staging, from worker threads, every
    0.5 s per host) carry the bytes verified on ``host`` so far in ``step`` of ``steps``."""

    kind: str
    message: str
    host: str | None = None
    ok: bool = True
    step: int | None = None
    steps: int | None = None
    done: bool = False


@dataclass
class DeployOptions:
    """What the operator asked for (the CLI flags).

    ``serial``: parsed ``--serial`` values; ``gate_timeout_s``: seconds an
    instance may take to pass its gate; ``drain_timeout_s``: seconds to wait
    for requests in flight before a restart or removal; ``lock_ttl_s``: age
    after which another run's lock is stale.
    """

    instances: str | None = None
    serial: list[str] = field(default_factory=list)
    max_fail_percentage: float = 0.0
    force: bool = False
    gate_timeout_s: float = 600.0
    drain_timeout_s: float = 120.0
    break_lock: bool = False
    lock_ttl_s: float = lock.DEFAULT_TTL_S
    plan_only: bool = False
    #: ``--prestage``: stage (without switching) and warm the next version on every target host
    #: before the first batch; ``warm_budget``: page-cache bytes per host (None: the whole version).
    prestage: bool = False
    warm_budget: int | None = None
    #: ``deploy --surge`` (``auto``) / ``--surge-strict`` (``strict``); empty: in place (deploy/rollout/surge.py).
    surge: str = ""


@dataclass
class HostOutcome:
    """``status``: ``applied``, ``failed`` (kept: within max-fail-percentage, rolled back alone),
    ``held`` (applied and kept, but a release gate was inconclusive: the rollout paused there),
    ``rolled_back`` (its batch failed), ``not_reached``, ``unreadable`` or ``unchanged``."""

    host: str
    status: str
    batch: int | None = None
    error: str | None = None
    gates: list[gates.GateResult] = field(default_factory=list)
    drained: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "status": self.status,
            "batch": self.batch,
            "error": self.error,
            "drained": self.drained,
            "gates": [g.to_dict() for g in self.gates],
        }


@dataclass
class DeployReport:
    """``result``: ``ok`` (all applied), ``nothing`` (nothing to change), ``planned`` (--plan),
    ``rolled_back`` (a batch failed its gate and was restored; later hosts untouched),
    ``partial`` (some hosts failed within max-fail-percentage or could not be read),
    ``paused`` (a release gate of a batch could not decide: the batch keeps the change, later hosts
    untouched; measure again and run the deploy again to go on, or roll back)."""

    run_id: str
    plan: Plan
    result: str
    hosts: dict[str, HostOutcome] = field(default_factory=dict)
    batches: list[list[str]] = field(default_factory=list)
    recovered_locks: dict[str, dict[str, Any]] = field(default_factory=dict)
    preflight: PreflightReport | None = None
    #: instance -> the KV capacity vLLM logged against pre-flight's prediction (``KvCheck.to_json``),
    #: or why it could not be read; for instances started by this run on hosts that kept the change.
    kv_checks: dict[str, Any] = field(default_factory=dict)
    #: instance -> what happened at the gateway once it passed its gates ("up at the gateway", or why not).
    gateway: dict[str, str] = field(default_factory=dict)
    #: ``--prestage``: what was staged where before the first batch (``prestage.Prestaged.to_dict``).
    prestage: dict[str, Any] | None = None
    seconds: float = 0.0
    #: ``deploy --surge``: per changed instance, surge or in place and why, and how it went (deploy/rollout/surge.py).
    surge: list[dict[str, Any]] | None = None
    #: seconds per phase (wall clock, rounded to ms): ``prepare_s`` (read and plan), ``preflight_s``,
    #: ``lock_s``, ``reread_s`` (read and plan again under the lock), ``prestage_s``, ``unlock_s``,
    #: ``kv_checks_s``; ``batches``: per batch ``stage_s``, ``drain_s`` (mark-down and the wait for
    #: requests in flight), ``mark_down_s`` (the gateway's part of it; ``mark_downs``: its applies that
    #: reached the gateway hosts),
    #: ``apply_s`` (stop and start), ``gate_s`` (model load and gates), ``mark_up_s``, ``seconds``.
    timings: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.result in ("ok", "nothing", "planned")

    def to_dict(self) -> dict[str, Any]:
        pre = self.preflight
        return {
            "run_id": self.run_id,
            "result": self.result,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "batches": self.batches,
            "recovered_locks": self.recovered_locks,
            "preflight": pre.to_json() if pre is not None else None,
            "kv_checks": self.kv_checks,
            "gateway": self.gateway,
            "prestage": self.prestage,
            **({"surge": self.surge} if self.surge is not None else {}),
            "timings": self.timings,
            "plan": self.plan.to_dict(),
            "hosts": [h.to_dict() for h in self.hosts.values()],
        }


def _since(t0: float) -> float:
    """Seconds since ``t0`` (``time.monotonic``), rounded to ms (the report's timings)."""
    return round(time.monotonic() - t0, 3)


class PreflightRefused(ClusterctlError):
    """Pre-flight found instances that cannot work (``report`` says which, with the numbers)."""

    def __init__(self, message: str, report: PreflightReport):
        super().__init__(message)
        self.report = report


def desired(
    inv: Inventory,
    state_dir: str,
    make_fleet: FleetFactory | None = None,
    on_event: Callable[[Event], None] = lambda e: None,
) -> tuple[dict[str, Instance], PlacementResult]:
    """Every instance that should run (explicit + placed template replicas) and the placement result.

    With ``make_fleet``, replicas that need a place are placed with the GPU
    topology of their candidate hosts (probed only then; see topology.py).
    """
    res, missing = topology.place(
        inv, StateStore(state_dir).load(), topology.fleet_reader(make_fleet, inv) if make_fleet else None
    )
    if missing:
        on_event(
            Event(
                "warn",
                f"no GPU topology from {', '.join(missing)}: new replicas there placed by contiguous GPU indexes",
                ok=False,
            )
        )
    for name, why in getattr(res, "unplaced", {}).items():
        on_event(Event("warn", f"{name} has no place: {why}", ok=False))
    return dict(res.instances), res


def render_all(
    inv: Inventory,
    instances: Mapping[str, Instance],
    systemd: Mapping[str, int | None] | None = None,
    gpu_uuids: Mapping[str, list[str]] | None = None,
    gids: multinode.GidTables | None = None,
) -> list[spec.RenderedInstance]:
    """Render every instance with its secrets (:mod:`clusterctl.deploy.units.render`).

    ``systemd``: host -> its systemd version (``HostState.systemd_version``); a
    host's units use the restart directives its systemd has
    (:func:`clusterctl.deploy.units.render.policy_for_systemd`); unknown: the baseline.
    ``gpu_uuids``: instance -> its placement's GPU UUIDs (:func:`pinned_uuids`);
    those units pin their GPUs by UUID.  ``gids``: the hosts' RoCE GID tables (``HostState.gids``);
    a multi-node replica's units get ``NCCL_IB_GID_INDEX`` from them (None: left out, a render only
    to learn the model paths; :func:`clusterctl.deploy.units.multinode.members` refuses a host without one).
    """
    versions, uuids = systemd or {}, gpu_uuids or {}
    # a replica across hosts is one unit per host (deploy/units/multinode.py): the head, then headless workers
    each = [
        m
        for inst in instances.values()
        for m in (multinode.members(inv, inst, gids) if multinode.is_multinode(inst) else [inst])
    ]
    return [
        render_instance(
            inv,
            inst,
            secrets=resolve_secrets(inv, inst),
            policy=policy_for_systemd(versions.get(inst.hosts[0]) if inst.hosts else None),
            gpu_uuids=uuids.get(inst.name),
        )
        for inst in each
    ]


def pinned_uuids(inst: Instance, st: remote.HostState | None) -> list[str] | None:
    """The GPU UUIDs an instance's unit pins, in placement order; None: pin by index.

    Recorded at placement: when the host's unit already runs this placement
    (``[X-Clusterctl] GPUs`` = the same indexes) with ``GPUUUIDs``, those stay,
    so an index that now names another GPU (one was lost, the host rebooted)
    does not move the instance; its ``check-gpus`` refuses to start instead.
    Otherwise the UUIDs the host's NVML gives those indexes now.
    """
    idx = [g.index for g in inst.placement if not g.is_cpu]
    if st is None or not idx:
        return None
    have = st.instances.get(inst.name)
    if have is not None and have.x.get("GPUs") == ",".join(map(str, idx)) and have.x.get("GPUUUIDs"):
        recorded = have.x["GPUUUIDs"].split(",")
        if len(recorded) == len(idx):
            return recorded
    if st.gpu_uuids and all(i in st.gpu_uuids for i in idx):
        return [st.gpu_uuids[i] for i in idx]
    return None


def served_name(inv: Inventory, r: spec.RenderedInstance) -> str:
    """The name /v1/models lists for an instance: the model's ``served_name``, else its name."""
    m = inv.models.get(r.model)
    return m.served_name if m and m.served_name else r.model


def api_key(r: spec.RenderedInstance) -> str | None:
    """``VLLM_API_KEY`` from an instance's env text (``KEY="value"`` as sdquote writes it, unescaped)."""
    for line in r.env_text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip() == "VLLM_API_KEY":
            v = v.strip()
            if len(v) >= 2 and v[0] == v[-1] == '"':
                v = re.sub(r'\\(.)', r'\1', v[1:-1])
            return v
    return None


def instance_served_name(inv: Inventory, inst: Instance | None, r: spec.RenderedInstance) -> str:
    """The first ``--served-model-name`` the unit passes: the instance's own, else the model's."""
    own = inst.args.get("served-model-name") if inst is not None else None
    if isinstance(own, (list, tuple)) and own:
        return str(own[0])
    if own:
        return str(own).split()[0]
    return served_name(inv, r)


# --- one deploy ---------------------------------------------------------------------


class Deploy:
    """One ``clusterctl deploy`` run over ``hosts`` of ``inv`` (see module docstring)."""

    def __init__(
        self,
        inv: Inventory,
        hosts: Sequence[Host],
        make_fleet: FleetFactory,
        state_dir: str,
        opts: DeployOptions,
        on_event: Callable[[Event], None] = lambda e: None,
        gateway: GatewayHook | None = None,
    ):
        self.inv, self.hosts, self.make_fleet, self.state_dir = inv, list(hosts), make_fleet, state_dir
        self.opts, self.on_event = opts, on_event
        #: the gateway's drain hook, given by the caller (``ops.deploy.drain_hook``); None: no gateway
        self._gateway = gateway
        self.me = lock.LockInfo()
        self.started = utc_now()
        self.rendered: dict[str, spec.RenderedInstance] = {}
        self.instances: dict[str, Instance] = {}
        self.report: DeployReport | None = None
        #: host -> model path -> link target before this run staged anything (what rollback restores).
        self.links_before: dict[str, dict[str, str | None]] = {}
        #: ``--prestage``: what the pre-stage run staged where (None: no pre-stage run).
        self.prestaged: prestage.Prestaged | None = None
        #: host -> the model links its next apply switches (``relink`` entries of the node job: a
        #: version pre-staged and verified there, switched without a staging run).
        self.switches: dict[str, list[dict[str, str]]] = {}

    def event(
        self,
        kind: str,
        message: str,
        host: str | None = None,
        ok: bool = True,
        step: int | None = None,
        steps: int | None = None,
        done: bool = False,
    ) -> None:
        self.on_event(Event(kind, message, host, ok, step, steps, done))

    def _read(
        self, fleet: Fleet, hosts: list[str] | None = None, gpu_uuids: bool = False, rdma_ports: Sequence[str] = ()
    ) -> dict[str, remote.HostState]:
        paths = sorted({r.model_path for r in self.rendered.values() if r.model_path})
        return remote.read_hosts(fleet, model_paths=paths, hosts=hosts, gpu_uuids=gpu_uuids, rdma_ports=rdma_ports)

    def _pattern(self) -> str | None:
        """``--instances``, with the worker units (``NAME-nodeR``) of the multi-node replicas it selects."""
        sel = self.opts.instances
        if not sel:
            return sel
        return ",".join([sel] + sorted(multinode.workers(i for n, i in self.instances.items() if matches(n, sel))))

    def _plan(self, states: dict[str, remote.HostState]) -> Plan:
        """The plan over ``states``, with the order a multi-node replica's units go in, as :meth:`_batch`
        applies it (multinode.phased)."""
        plan = make_plan(list(self.rendered.values()), states, [h.name for h in self.hosts], self._pattern())
        plan.order = multinode.phased(
            {
                hp.host: {
                    "start": [i.instance for i in hp.items if i.action in ("new", "start")],
                    "restart": [i.instance for i in hp.items if i.action == "changed"],
                }
                for hp in plan.hosts
            },
            self.instances.values(),
        )[1]
        spans = getattr(getattr(self, "placement", None), "spans", {})
        plan.placed = [
            f"replica {n} placed on {where}"
            for n, where in spans.items()
            if n in self.rendered and matches(n, self.opts.instances)
        ]
        return plan

    def prepare(self, fleet: Fleet) -> tuple[Plan, dict[str, remote.HostState]]:
        """Render and read; the plan for the selected hosts."""
        names = {h.name for h in self.hosts}
        self.instances, self.placement = desired(self.inv, self.state_dir, self.make_fleet, self.on_event)
        chosen = {
            n: i
            for n, i in self.instances.items()
            if matches(n, self.opts.instances) and any(g.host in names for g in i.placement)
        }
        self.rendered = {r.instance: r for r in render_all(self.inv, chosen)}
        routers = {
            r.instance: r
            for r in pdrouter.render_routers(self.inv, self.instances)
            if r.host in names and matches(r.instance, self.opts.instances)
        }
        self.rendered.update(routers)
        self.event(
            "phase",
            f"rendered {len(self.rendered)} instances"
            + (f" ({len(routers)} routers)" if routers else "")
            + f"; reading {len(self.hosts)} hosts",
        )
        spanning = [i for i in chosen.values() if multinode.is_multinode(i)]
        ports = sorted({p for i in spanning for h in i.hosts for p in multinode.rdma_ports(self.inv, h)})
        states = self._read(fleet, gpu_uuids=True, rdma_ports=ports)
        versions = {h: st.systemd_version for h, st in states.items()}
        uuids = {
            n: u
            for n, i in chosen.items()
            if not multinode.is_multinode(i) and (u := pinned_uuids(i, states.get(i.hosts[0]) if i.hosts else None))
        }
        if uuids or spanning or any(v is not None for v in versions.values()):
            # per host: the restart directives its systemd has; per instance: its GPUs by UUID; per
            # multi-node replica's host: its NCCL_IB_GID_INDEX from the GID table just read
            gids = {h: st.gids for h, st in states.items() if not st.error}
            self.rendered = {r.instance: r for r in render_all(self.inv, chosen, versions, uuids, gids)}
            self.rendered.update(routers)
        return self._plan(states), states

    def preflight(self, fleet: Fleet, plan: Plan) -> PreflightReport | None:
        """Run pre-flight on the instances to start or restart; raise when it refuses (unless --force)."""
        starting = {
            i.instance: self.instances[i.instance]
            for h in plan.hosts
            for i in h.items
            if i.action in ("new", "changed") and i.instance in self.instances
        }
        # a multi-node replica restarts whole when any member changes: checked stage by stage (preflight.py)
        for h in plan.hosts:
            for i in h.items:
                whole = multinode.replica_of(self.instances, i.instance) if i.action in ("new", "changed") else None
                if whole is not None:
                    starting[whole.name] = whole
        if not starting:
            return None
        # The state after the plan's removals: on each host, the units it removes or restarts are
        # drained and stopped before anything starts there (one node job per host, removals first).
        stopping = {
            h.host: {spec.unit_name(i.instance) for i in h.items if i.action in ("remove", "changed")}
            for h in plan.hosts
        }
        gone = sorted(u for units in stopping.values() for u in units)
        if gone:
            self.event(
                "phase", f"pre-flight over the state after the plan stops {len(gone)} unit(s): {', '.join(gone)}"
            )
        rep = preflight_checks.run_preflight(
            self.inv, starting, fleet, on_event=lambda m: self.event("phase", m), stopping=stopping
        )
        if not rep.ok and not self.opts.force:
            raise PreflightRefused("pre-flight refused the deploy (use --force to deploy anyway)", rep)
        if not rep.ok:
            for row in rep.rows:
                if not row.ok:
                    checks = sorted({p.check for p in row.problems if p.severity.name == "CRIT"})
                    self.event(
                        "warn",
                        f"--force: deploying {row.instance} although pre-flight refused it ({', '.join(checks)})",
                        row.host,
                        ok=False,
                    )
        return rep

    def run(self) -> DeployReport:
        t0 = time.monotonic()
        with self.make_fleet(self.hosts) as fleet:
            plan, states = self.prepare(fleet)
            rep = DeployReport(self.me.run_id, plan, "planned")
            rep.timings["prepare_s"] = _since(t0)
            self.report = rep
            for hp in plan.hosts:
                rep.hosts[hp.host] = HostOutcome(hp.host, "unreadable" if hp.error else "unchanged", error=hp.error)
            if self.opts.plan_only:
                rep.seconds = time.monotonic() - t0
                return rep
            t = time.monotonic()
            try:
                rep.preflight = self.preflight(fleet, plan)
                rep.timings["preflight_s"] = _since(t)
            except PreflightRefused as e:
                rep.result, rep.preflight = "refused", e.report
                self._audit_local(rep, f"pre-flight refused: {', '.join(e.report.refused)}")
                raise
            targets = plan.changed_hosts()
            if not targets:
                rep.result = "nothing" if not any(h.error for h in plan.hosts) else "partial"
                self._audit_local(rep)
                rep.seconds = time.monotonic() - t0
                return rep
            t = time.monotonic()
            try:
                got = lock.acquire(fleet, targets, self.me, ttl_s=self.opts.lock_ttl_s, break_lock=self.opts.break_lock)
                rep.timings["lock_s"] = _since(t)
            except lock.LockHeld as e:
                rep.result = "refused"
                self._audit_local(rep, str(e))
                raise
            try:
                self._locked(fleet, got, rep, states)
            except BaseException as e:  # Ctrl-C included: recorded here and on the hosts, then re-raised
                rep.result = "interrupted" if isinstance(e, KeyboardInterrupt) else "error"
                self._audit_local(rep, f"{type(e).__name__}: {e}" if not isinstance(e, KeyboardInterrupt) else None)
                raise
            finally:
                t = time.monotonic()
                lock.release_anyway(
                    fleet,
                    got.locked,
                    self.me.run_id,
                    self._audit_record(rep),
                    lambda: self.make_fleet([self.inv.hosts[h] for h in got.locked]),
                )
                rep.timings["unlock_s"] = _since(t)
            self._save_placements(rep)
            t = time.monotonic()
            self._kv_checks(fleet, rep)
            rep.timings["kv_checks_s"] = _since(t)
        self._audit_local(rep)
        rep.seconds = time.monotonic() - t0
        return rep

    def _kv_checks(self, fleet: Fleet, rep: DeployReport) -> None:
        """Compare pre-flight's predicted KV capacity with what each started instance logged.

        Only instances this run started or restarted on hosts that kept the change; best
        effort: a host that cannot be read gives a reason, never a failed deploy.
        """
        if rep.preflight is None:
            return

        kept = {h for h, o in rep.hosts.items() if o.status in ("applied", "held")}
        started = {
            i.instance
            for hp in rep.plan.hosts
            if hp.host in kept
            for i in hp.items
            if i.action in ("new", "changed", "start")
        }
        predicted = {n: hp for n, hp in rep.preflight.predictions().items() if n in started}
        if not predicted:
            return
        for name, check in sorted(read_kv_checks(fleet, predicted).items()):
            if isinstance(check, str):
                rep.kv_checks[name] = {"error": check}
                continue
            rep.kv_checks[name] = check.to_json()
            err = check.error_pct
            self.event(
                "phase",
                f"KV cache of {name}: predicted {check.predicted:,} tokens, vLLM logged "
                + (f"{check.logged:,} ({err:+.2f} %)" if err is not None else "nothing yet"),
            )

    def _locked(self, fleet: Fleet, got: lock.Acquired, rep: DeployReport, states: dict[str, remote.HostState]) -> None:
        """Everything done under the lock: re-read, re-plan, roll out."""
        rep.recovered_locks = got.recovered
        for h, why in got.failed.items():
            rep.hosts[h] = HostOutcome(h, "unreadable", error=f"lock: {why}")
        for h, old in got.recovered.items():
            self.event(
                "warn",
                f"recovered a stale deploy lock of {old.get('holder')} "
                f"(run {old.get('run_id')}, {old.get('age_s')} s old)",
                h,
                ok=False,
            )
        # Read again under the lock: another deploy may have finished since the plan.
        t = time.monotonic()
        states.update(self._read(fleet, got.locked))
        plan = self._plan(states)
        rep.plan = plan
        rep.timings["reread_s"] = _since(t)
        targets = [h for h in plan.changed_hosts() if h in got.locked]
        if self.opts.prestage:
            t = time.monotonic()
            self._prestage(plan, states, targets, rep)
            rep.timings["prestage_s"] = _since(t)
        self._rollout(fleet, plan, states, targets, rep)
        if rep.result == "ok" and any(h.status == "unreadable" for h in rep.hosts.values()):
            rep.result = "partial"

    def _rollout(
        self, fleet: Fleet, plan: Plan, states: dict[str, remote.HostState], targets: list[str], rep: DeployReport
    ) -> None:
        by_host = {hp.host: hp for hp in plan.hosts}
        # a pool's router comes after its members: its gate sends a completion through them
        rep.batches = multinode.together(
            rollout.batches(pdrouter.routers_last(targets, self.inv, self.rendered.values()), self.opts.serial),
            self.instances.values(),
        )
        rep.result = "ok"
        for n, batch in enumerate(rep.batches, 1):
            label = "canary" if n == 1 and len(rep.batches) > 1 else f"batch {n}/{len(rep.batches)}"
            self.event("batch", f"{label}: {len(batch)} hosts: {', '.join(batch)}", step=n, steps=len(rep.batches))
            failed = self._batch(fleet, n, batch, by_host, states, rep)
            held = [h for h in batch if rep.hosts[h].status == "held"]
            if rollout.batch_failed(len(failed), len(batch), self.opts.max_fail_percentage):
                self.event(
                    "batch",
                    f"{label} failed on {len(failed)}/{len(batch)} hosts "
                    f"(max fail {self.opts.max_fail_percentage:g} %): rolling back this batch",
                    ok=False,
                )
                self._rollback(fleet, batch, by_host, rep, "rolled_back")
                for later in rep.batches[n:]:
                    for h in later:
                        rep.hosts[h] = HostOutcome(h, "not_reached", error="rollout stopped")
                rep.result = "rolled_back"
                return
            if failed:
                self._rollback(fleet, failed, by_host, rep, "failed")
                rep.result = "partial"
            if held:
                # An inconclusive release gate is no regression (nothing to roll back) and no pass
                # (the rollout does not go on): the batch keeps the change, the rollout pauses here.
                self.event(
                    "batch",
                    f"{label}: a release gate could not decide on {', '.join(held)}: the change "
                    "is kept there and the rollout pauses; measure again and run the same deploy "
                    "to go on, or roll back",
                    ok=False,
                )
                for later in rep.batches[n:]:
                    for h in later:
                        rep.hosts[h] = HostOutcome(
                            h, "not_reached", error="rollout paused: a release gate was inconclusive"
                        )
                rep.result = "paused"
                return
            self.event("batch", f"{label} passed", ok=True, step=n, steps=len(rep.batches), done=True)

    def _batch(
        self,
        fleet: Fleet,
        n: int,
        batch: list[str],
        by_host: Mapping[str, HostPlan],
        states: dict[str, remote.HostState],
        rep: DeployReport,
    ) -> list[str]:
        """Stage, drain, apply and gate one batch; returns the failed hosts."""
        t0 = time.monotonic()
        took: dict[str, Any] = {"batch": n, "hosts": len(batch)}
        rep.timings.setdefault("batches", []).append(took)
        starting = {i.instance for h in batch for i in by_host[h].items if i.action in ("new", "changed", "start")}
        # Staging switches model links: rollback must restore the targets from before it.
        self.links_before.update({h: {p: m.get("target") for p, m in states[h].models.items()} for h in batch})
        unstaged = self._stage(fleet, batch, starting, states, via_apply=True)
        took["stage_s"] = t = _since(t0)
        marks = list(getattr(self.gateway, "timings", []))
        self.mark_down_batch(batch, by_host, states)
        with cf.ThreadPoolExecutor(max_workers=max(1, min(16, len(batch)))) as ex:
            drained = ex.map(
                lambda h: ap.drain_before(
                    self.inv, by_host[h], states[h], self.instances, self.opts.drain_timeout_s, self.gateway
                ),
                batch,
            )
            for h, notes in zip(batch, drained):
                rep.hosts[h] = HostOutcome(h, "applied", n, drained=notes)
        downs = [m for m in getattr(self.gateway, "timings", [])[len(marks) :] if m.op != "up"]
        took["drain_s"], t = round(_since(t0) - t, 3), _since(t0)
        took["mark_down_s"] = round(sum(m.seconds for m in downs), 3)
        took["mark_downs"] = sum(1 for m in downs if getattr(m, "applied", True))  # those that reached the gateway
        failed = []
        for h, why in unstaged.items():
            rep.hosts[h].status, rep.hosts[h].error = "failed", why
            failed.append(h)
        jobs = {h: self.apply_job(by_host[h], states[h]) for h in batch if h not in unstaged}
        # a multi-node replica: stop all its members, start the workers, then the head (multinode.phased)
        phases, order = multinode.phased(jobs, self.instances.values())
        for line in order:
            self.event("phase", line)
        replies: dict[str, Any] = {}
        for phase in phases:
            for h, r in ap.apply_hosts(
                fleet,
                phase,
                on_reply=lambda r: self.event("host", "applied" if r.ok else f"apply failed: {r.error}", r.host, r.ok),
            ).items():
                if h not in replies or not r.ok:
                    replies[h] = r
        for h, r in replies.items():
            if not r.ok:
                rep.hosts[h].status, rep.hosts[h].error = "failed", r.error
                failed.append(h)
        took["apply_s"], t = round(_since(t0) - t, 3), _since(t0)
        headless = multinode.workers(self.instances.values())  # gated through their head's /health
        names = [
            i.instance
            for h in batch
            if h not in failed
            for i in by_host[h].items
            if i.action in ("new", "changed", "start") and i.instance not in headless
        ]
        results = self.gate(fleet, names)
        took["gate_s"], t = round(_since(t0) - t, 3), _since(t0)
        for g in results:
            rep.hosts[g.host].gates.append(g)
            if not g.ok and not g.inconclusive and g.host not in failed:
                rep.hosts[g.host].status, rep.hosts[g.host].error = "failed", f"{g.instance}: {g.reason}"
                failed.append(g.host)
        for g in results:  # kept, not failed: the rollout pauses after this batch (see _rollout)
            if g.inconclusive and g.host not in failed and rep.hosts[g.host].status != "held":
                rep.hosts[g.host].status, rep.hosts[g.host].error = "held", f"{g.instance}: {g.reason}"
        # Back at the gateway: what passed every gate (or whose only doubt is an inconclusive
        # measurement: it keeps the change and serves) on a host that keeps the change, and what
        # the change removed (its drain mark would otherwise stay behind for a later same name).
        bad = {g.instance for g in results if not g.ok and not g.inconclusive}
        back = list(dict.fromkeys(g.instance for g in results if g.instance not in bad and g.host not in failed))
        back += [i.instance for h in batch if h not in failed for i in by_host[h].items if i.action == "remove"]
        self.put_back(back, rep)
        took["mark_up_s"], took["seconds"] = round(_since(t0) - t, 3), _since(t0)
        return failed

    def mark_down_batch(
        self, batch: list[str], by_host: Mapping[str, HostPlan], states: dict[str, remote.HostState]
    ) -> None:
        """Mark every instance the batch's drains will take out down at the gateway in one change
        (one render and reload for the batch, not one per instance); each drain's own mark-down then
        finds it down.  Needs a hook with ``mark_down_many``; raises as a drain's mark-down does."""
        many = getattr(self.gateway, "mark_down_many", None)
        if not callable(many):
            return
        names = [i.name for h in batch for i in ap.drain_targets(self.inv, by_host[h], states[h], self.instances)[0]]
        if names:
            many(list(dict.fromkeys(names)))

    @property
    def gateway(self) -> GatewayHook | None:
        """The gateway hook drains mark instances down through, as given (``None``: no gateway)."""
        return self._gateway

    def put_back(self, names: Sequence[str], rep: DeployReport) -> None:
        """Mark ``names`` up at the gateway where a drain left them down; noted in ``rep.gateway``."""
        for name, note in put_back(self.gateway, names).items():
            rep.gateway[name] = note
            self.event(
                "host",
                f"{name}: {note}",
                self.rendered[name].host if name in self.rendered else None,
                note.startswith("up"),
            )

    def restore_gates(self, fleet: Fleet, replies: Mapping[str, Any], rep: DeployReport) -> None:
        """After a rollback restarted the previous units: gate them and put those that pass back."""
        from clusterctl.deploy.rollout.rollback import gate_restored

        # restored, and members of a multi-node replica restarted in order (their workers are not gated)
        restored = {
            h: list(dict.fromkeys(r.data.get("restored", []) + r.data.get("held", [])))
            for h, r in replies.items()
            if r.ok
        }
        removed = [n for r in replies.values() if r.ok for n in r.data.get("removed", [])]
        if not any(restored.values()) and not removed:
            return
        results = gate_restored(self.inv, self.state_dir, fleet, restored, self.opts.gate_timeout_s, self.on_event)
        self.put_back([g.instance for g in results if g.ok] + removed, rep)

    def apply_job(self, hp: HostPlan, st: remote.HostState) -> dict[str, Any]:
        """The node job that applies one host's plan ``hp`` (a hook: playbooks drop files already written),
        with the model links :meth:`_stage` left to it to switch (the node refuses a missing or
        unverified target before touching anything)."""
        job = ap.apply_job(hp, self.rendered, st, self.me.run_id, self.links_before.get(hp.host))
        if self.switches.get(hp.host):
            job["relink"] = list(self.switches[hp.host])
        return job

    def gate(self, fleet: Fleet, names: Sequence[str]) -> list[gates.GateResult]:
        """Gate the started instances ``names`` (:mod:`clusterctl.deploy.rollout.gates`), then
        :meth:`extra_gates` on those that passed; one result per instance, then the extra ones."""
        targets = [self._gate_target(name, {}) for name in names]
        wanted = {t.instance: t.host for t in targets}

        def units() -> dict[str, gates.UnitState]:
            now = remote.read_hosts(fleet, hosts=sorted(set(wanted.values())), timeout=30)
            return {
                name: (s.active, s.sub, s.restarts)
                for name, host in wanted.items()
                for s in [now.get(host, remote.HostState(host)).instances.get(name)]
                if s is not None
            }

        results = gates.wait_gates(
            targets,
            timeout_s=self.opts.gate_timeout_s,
            units=units,
            on_result=self.gate_event,
            explain=lambda t: first_error(fleet, t.host, t.instance),
        )
        return results + self.extra_gates(fleet, [t for t, g in zip(targets, results) if g.ok])

    def extra_gates(self, fleet: Fleet, passed: list[gates.GateTarget]) -> list[gates.GateResult]:
        """More checks of instances that passed the standard gate (a hook: a playbook's custom gates)."""
        return []

    def gate_event(self, g: gates.GateResult) -> None:
        self.event("gate", f"{g.instance}: {'pass' if g.ok else 'FAIL'} ({g.reason})", g.host, g.ok)

    def _gate_target(self, name: str, states: Mapping[str, remote.HostState]) -> gates.GateTarget:
        r = self.rendered[name]
        pool = pdrouter.pool_of(self.inv, name)
        if pool is not None:  # through the router: prefill, then decode with the members' key
            key = next(
                (
                    k
                    for m in pdrouter.members(self.inv, pool, self.instances.values())
                    if m.name in self.rendered and (k := api_key(self.rendered[m.name]))
                ),
                None,
            )
            return gates.GateTarget(
                name, r.host, self.inv.hosts[r.host].address, r.port, pdrouter.served_model(self.inv, pool), key, 0
            )
        # systemd resets NRestarts on an explicit start or restart, so any restart counted is a crash.
        return gates.GateTarget(
            name,
            r.host,
            self.inv.hosts[r.host].address,
            r.port,
            instance_served_name(self.inv, self.instances.get(name), r),
            api_key(r),
            0,
        )

    def _unstaged(self, r: spec.RenderedInstance, st: remote.HostState) -> bool:
        """True when ``r``'s model has a source and its path on the host is not the verified version."""
        return prestage.needs_staging(self.inv, r, st)

    def _prestage(self, plan: Plan, states: dict[str, remote.HostState], targets: list[str], rep: DeployReport) -> None:
        """``--prestage``: the versions every target host's starting instances lack, staged without
        switching and warmed, before any batch stops anything (deploy/rollout/prestage.py)."""
        starting = {
            i.instance
            for hp in plan.hosts
            if hp.host in targets
            for i in hp.items
            if i.action in ("new", "changed", "start")
        }
        need = prestage.unstaged(self.inv, self.rendered.values(), targets, starting, states)
        if not need:
            self.event("phase", "pre-stage: every target host already has the versions it needs")
            rep.prestage = prestage.Prestaged().to_dict()
            return

        def on_bytes(host: str, done: int, total: int) -> None:
            self.event("bytes", "pre-staging", host, step=done, steps=total)

        got = prestage.prestage(
            self.inv,
            need,
            self.make_fleet,
            warm_budget=self.opts.warm_budget,
            on_phase=lambda m: self.event("phase", m),
            on_host=lambda h, m, ok: self.event("host", m, h, ok),
            on_progress=on_bytes,
        )
        rep.prestage = got.to_dict()
        self.prestaged = got
        if got.failed:
            self.event(
                "warn",
                f"pre-staging failed on {', '.join(sorted(got.failed))}: their batches stage "
                "again (and leave the host alone if that fails too)",
                ok=False,
            )

    def _stage(
        self,
        fleet: Fleet,
        batch: list[str],
        starting: set[str],
        states: dict[str, remote.HostState],
        via_apply: bool = False,
    ) -> dict[str, str]:
        """Stage the models that instances about to start lack on the batch's hosts.

        ``via_apply``: a host where ``--prestage`` staged and verified the version runs no
        staging run: its apply job switches the link (:meth:`switch_in_apply`); the others
        (and every host without ``via_apply``: surge, a playbook's stage step) are staged,
        which switches the link there.  Returns host -> why its model is still not there
        afterwards (read back from the host, whatever staging reported): those hosts are
        not applied.
        """
        need = prestage.unstaged(self.inv, self.rendered.values(), batch, starting, states)
        if via_apply:
            need = self.switch_in_apply(need, starting)
        if not need:
            return {}
        errors: dict[tuple[str, str], str] = {}
        for name, hosts in need.items():
            model = self.inv.models[name]
            self.event("phase", f"staging {name} on {', '.join(hosts)}")
            src = sp.parse_source(model.source or "", f"{self.inv.path}: models.{name}.source")
            man = sp.load_manifest(src, name, model.version)

            def on_bytes(host: str, done: int, total: int, what: str = f"staging {name}") -> None:
                self.event("bytes", what, host, step=done, steps=total)

            with self.make_fleet([self.inv.hosts[h] for h in hosts]) as sf:
                report = sr.stage_model(
                    sf, [self.inv.hosts[h] for h in hosts], model, src, man, relay="chain", on_progress=on_bytes
                )
            for row in report.rows:
                self.event(
                    "host", f"stage {name}: {row.status}" + (f" ({row.error})" if row.error else ""), row.host, row.ok
                )
                if not row.ok:
                    errors[(name, row.host)] = row.error or row.status
        staged = sorted({h for hosts in need.values() for h in hosts})
        states.update(self._read(fleet, staged))
        missing: dict[str, str] = {}
        for r in self.rendered.values():
            if r.model in need and r.host in need[r.model] and self._unstaged(r, states[r.host]):
                why = errors.get((r.model, r.host), "not a verified version after staging")
                missing[r.host] = f"staging {r.model}: {why}"
        return missing

    def switch_in_apply(self, need: Mapping[str, list[str]], starting: set[str]) -> dict[str, list[str]]:
        """Of ``need`` (model -> hosts lacking it), leave to each host's apply job the models the
        pre-stage run staged and verified there (one ``relink`` per model path, to the version
        it staged, in :attr:`switches`); returns what is left to stage."""
        done = self.prestaged
        if done is None:
            return dict(need)
        left: dict[str, list[str]] = {}
        for name, hosts in need.items():
            for h in hosts:
                version = done.versions.get(h, {}).get(name)
                if done.hosts.get(h, {}).get(name) not in ("staged", "present") or not version:
                    left.setdefault(name, []).append(h)
                    continue
                links = self.switches.setdefault(h, [])
                for r in self.rendered.values():
                    if r.host == h and r.model == name and r.instance in starting and r.model_path:
                        if all(m["path"] != r.model_path for m in links):
                            links.append(
                                {"path": r.model_path, "target": f".versions/{name}/{version}", "version": version}
                            )
                self.event("host", f"switch {name} to {version} in the apply (pre-staged, verified)", h)
        return left

    def _rollback(
        self, fleet: Fleet, hosts: list[str], by_host: Mapping[str, HostPlan], rep: DeployReport, status: str
    ) -> None:
        # a multi-node replica's members: stop all, then the workers, then the head (not all at once)
        replies, order = rollback_in_order(
            fleet,
            {h: ap.touched(by_host[h]) for h in hosts},
            self.instances,
            own_run_id=self.me.run_id,
            only_run_id=self.me.run_id,
        )
        for line in order:
            self.event("phase", line)
        self.restore_gates(fleet, replies, rep)
        for h in hosts:
            r = replies.get(h)
            rep.hosts[h].status = status
            if r is not None and not r.ok:
                rep.hosts[h].error = f"{rep.hosts[h].error}; rollback: {r.error}"
            self.event(
                "host", "rolled back" if r is None or r.ok else f"rollback failed: {r.error}", h, r is None or r.ok
            )

    def _save_placements(self, rep: DeployReport) -> None:
        res = getattr(self, "placement", None)
        if res is not None and getattr(res, "changed", False) and rep.result in ("ok", "partial", "paused"):
            StateStore(self.state_dir).save_placements(res.state.placements)

    def _entries(self, rep: DeployReport) -> list[dict[str, Any]]:
        out = []
        for hp in rep.plan.hosts:
            for i in hp.changes:
                r = self.rendered.get(i.instance)
                out.append(
                    audit.instance_entry(r, i.action)
                    if r
                    else {"instance": i.instance, "host": hp.host, "action": i.action, "digest": i.old_digest}
                )
        return out

    def _audit_record(self, rep: DeployReport, detail: str | None = None) -> dict[str, Any]:
        # The failed hosts with why (a gate's reason; never a secret), so the audit says why it stopped.
        failed = [
            f"{h.host} ({h.error})" if h.error else h.host
            for h in rep.hosts.values()
            if h.status in ("failed", "rolled_back", "held")
        ]
        return audit.record(
            "deploy",
            run_id=self.me.run_id,
            who=self.me.holder,
            started=self.started,
            instances=self._entries(rep),
            result=rep.result if rep.result != "planned" else "error",
            detail=detail or (("failed: " + ", ".join(failed)) if failed else None),
            hosts=[h for h in rep.hosts if rep.hosts[h].batch is not None],
        )

    def _audit_local(self, rep: DeployReport, detail: str | None = None) -> None:
        audit.append(self.state_dir, self._audit_record(rep, detail))
