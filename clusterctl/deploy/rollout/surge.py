"""Surge deploy (``deploy --surge``): no replica of the old version stops before its replacement passes its gates.

Kubernetes' ``maxSurge`` per replica, with the names kept: for each changed instance ``NAME``
that runs and has a place for a second copy on its host (GPUs no instance uses, desired or
found running, and not cordoned), one at a time per host:

1. the new version starts as a temporary unit ``NAME.surge`` on those spare GPUs and another
   port (``clusterctl-NAME.surge.service``, not enabled at boot), after staging the model;
2. it passes the deploy's gates (standard and release), then is added at the gateway;
3. ``NAME`` is drained at the gateway (``NAME.surge`` keeps serving), restarted in place with
   the new version on its own GPUs and port, gated and put back: the engine's own per-host
   apply, for this one instance;
4. ``NAME.surge`` is drained, stopped and removed (no copy is kept for ``rollback``), and the
   spare GPUs are free for the host's next changed instance.

So an instance keeps its unit name, port and GPUs (status, doctor, placements and the gateway
see what they saw before) and the serving capacity never drops below what it was; the price is
a second model load per instance (from the page cache just filled by the first).

Rollback: a surge unit that fails its start or gate is removed and the model links the staging
switched are put back; ``NAME`` was never stopped.  When ``NAME``'s own restart fails afterwards,
the batch's usual rollback restores it (gated and put back) while ``NAME.surge`` still serves,
and only then is ``NAME.surge`` removed.

An instance that cannot surge is restarted in place, as without ``--surge``, and the plan says
why (no gateway to send traffic to a surge unit, not running, no spare GPUs, a multi-node
replica, a prefill/decode pool member or router, a CPU instance).  ``--surge-strict`` refuses
the deploy instead (exit 3, nothing changed).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar, cast

from clusterctl.deploy.rollout import apply as ap
from clusterctl.deploy.rollout import drain as dr
from clusterctl.deploy.units import multinode
from clusterctl.deploy import remote
from clusterctl.deploy.rollout.engine import Deploy, DeployReport, HostOutcome, pinned_uuids, render_all
from clusterctl.deploy.placement.place import best_group
from clusterctl.deploy.rollout.plan import HostPlan, Plan, PlanItem
from clusterctl.deploy.state import DeployState, StateStore
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import GpuRef, Instance, Inventory

D = TypeVar("D", bound=Deploy)

#: The surge unit of instance ``NAME`` is instance ``NAME.surge`` (unit ``clusterctl-NAME.surge.service``).
SUFFIX = ".surge"
#: ``DeployOptions.surge``: off, surge where possible (else in place), or refuse unless every change can surge.
MODES = ("", "auto", "strict")

#: A batch's phases in deploy's ``--json`` ``timings`` (``Deploy._batch``): a surge batch sums its
#: in-place parts' over its rounds.
IN_PLACE_PHASES = ("stage_s", "drain_s", "mark_down_s", "apply_s", "gate_s", "mark_up_s")
#: A surge batch's own steps, seconds summed over its rounds: staging for the surge units, their
#: start, their gates, adding them at the gateway, and taking them out, draining and removing them.
SURGE_PHASES = ("surge_stage_s", "surge_start_s", "surge_gate_s", "surge_add_s", "surge_retire_s")


class SurgeRefused(ClusterctlError):
    """``--surge-strict`` and some changed instance cannot surge (nothing was changed)."""


def surge_name(instance: str) -> str:
    return instance + SUFFIX


@dataclass
class SurgeStep:
    """How one changed instance is replaced: ``mode`` ``surge`` (on ``gpus``/``port`` as ``surge``) or
    ``in_place`` (``why``).  ``outcome``: ``planned``, then ``done``, ``failed`` (``error``) or
    ``not_reached``."""

    instance: str
    host: str
    mode: str
    surge: str | None = None
    gpus: tuple[int, ...] = ()
    port: int | None = None
    why: str = ""
    outcome: str = "planned"
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "host": self.host,
            "mode": self.mode,
            "surge": self.surge,
            "gpus": list(self.gpus),
            "port": self.port,
            "why": self.why or None,
            "outcome": self.outcome,
            "error": self.error,
        }

    def line(self) -> str:
        return step_line(self.to_dict())


def step_line(step: Mapping[str, Any]) -> str:
    """One line for a step (``SurgeStep.to_dict()``): the surge steps, or why in place; and how it went."""
    head = f"{step['host']} {step['instance']}: "
    if step["mode"] != "surge":
        return head + f"in place ({step['why']})"
    gpus = ",".join(map(str, step["gpus"]))
    text = (
        head + f"start {step['surge']} on GPU {gpus} port {step['port']}, gate it, add it at the gateway; "
        f"drain {step['instance']}, restart it in place, gate, put back; drain and remove {step['surge']}"
    )
    if step.get("outcome", "planned") != "planned":
        text += f" -> {step['outcome']}" + (f" ({step['error']})" if step.get("error") else "")
    return text


def _unit_gpus(x: Mapping[str, str]) -> set[int]:
    return {int(g) for g in x.get("GPUs", "").split(",") if g.strip().isdigit()}


def _unit_port(x: Mapping[str, str]) -> int | None:
    p = x.get("Port", "")
    return int(p) if p.isdigit() else None


def spare_gpus(
    inv: Inventory,
    host: str,
    instances: Mapping[str, Instance],
    st: remote.HostState,
    cordons: DeployState | None = None,
) -> list[int]:
    """GPU indexes of ``host`` that no instance uses (desired, or a unit found on the host) and not cordoned."""
    used = {g.index for i in instances.values() for g in i.placement if g.host == host and not g.is_cpu}
    for s in st.instances.values():
        used |= _unit_gpus(s.x)
    if cordons is not None and cordons.host_cordoned(host):
        return []
    return [
        i
        for i in range(inv.hosts[host].gpus.count)
        if i not in used and not (cordons is not None and cordons.gpu_cordoned(host, i))
    ]


def free_port(
    inv: Inventory, host: str, start: int, instances: Mapping[str, Instance], st: remote.HostState
) -> int | None:
    """The lowest port from ``start`` that no instance on ``host`` (desired or found) and no gateway there uses."""
    used = {i.port for i in instances.values() if any(g.host == host for g in i.placement)}
    used |= {p for s in st.instances.values() if (p := _unit_port(s.x)) is not None}
    gw = inv.gateway
    if gw is not None and host in gw.hosts:
        used.add(gw.port)
    return next((p for p in range(start, 65536) if p not in used), None)


def plan_surges(
    inv: Inventory,
    plan: Plan,
    instances: Mapping[str, Instance],
    states: Mapping[str, remote.HostState],
    cordons: DeployState | None = None,
) -> list[SurgeStep]:
    """How each ``changed`` instance of ``plan`` is replaced (pure: no I/O).

    Per host the surges run one after another on the same spare GPUs, so each instance gets the
    best group of its TP size among the host's spare GPUs."""
    out: list[SurgeStep] = []
    workers = multinode.workers(instances.values())
    for hp in plan.hosts:
        st = states.get(hp.host)
        for item in hp.items:
            if item.action != "changed" or st is None:
                continue
            inst = instances.get(item.instance)
            have = st.instances.get(item.instance)
            why = ""
            if inv.gateway is None:
                why = "no gateway in the inventory: nothing would send requests to a surge unit"
            elif inst is None or item.instance in workers:
                why = "not a replica the gateway fronts (a router or a multi-node worker)"
            elif multinode.is_multinode(inst):
                why = "a multi-node replica"
            elif inst.role != "mixed":
                why = f"a {inst.role} member of a prefill/decode pool (its router sends it requests)"
            elif any(g.is_cpu for g in inst.placement) or not inst.placement:
                why = "a CPU instance"
            elif have is None or have.active != "active":
                why = "not running: nothing serves that a surge would keep"
            elif surge_name(item.instance) in instances:
                why = f"an inventory instance is named {surge_name(item.instance)}"
            if why:
                out.append(SurgeStep(item.instance, hp.host, "in_place", why=why))
                continue
            assert inst is not None
            free = spare_gpus(inv, hp.host, instances, st, cordons)
            group = best_group(free, inst.tp_size)
            if group is None:
                out.append(
                    SurgeStep(
                        item.instance, hp.host, "in_place", why=f"no spare GPUs: needs {inst.tp_size}, {len(free)} free"
                    )
                )
                continue
            port = free_port(inv, hp.host, inst.port + 1, instances, st)
            if port is None:
                out.append(SurgeStep(item.instance, hp.host, "in_place", why="no free port"))
                continue
            out.append(SurgeStep(item.instance, hp.host, "surge", surge_name(item.instance), tuple(group), port))
    return out


def refusal(steps: Sequence[SurgeStep]) -> str | None:
    """``--surge-strict``'s message when some change cannot surge (None: all can)."""
    bad = [s for s in steps if s.mode != "surge"]
    if not bad:
        return None
    return (
        "--surge-strict: no change was made; these instances cannot surge: "
        + "; ".join(f"{s.host} {s.instance}: {s.why}" for s in bad)
        + " (deploy --surge restarts them in place)"
    )


class SurgeDeploy(Deploy):
    """A deploy whose changed instances surge where they can (``opts.surge``: ``auto`` or ``strict``)."""

    def _surge_init(self) -> None:
        if not hasattr(self, "surge_steps"):
            self.surge_steps: list[SurgeStep] = []
            #: surge instance -> Instance, while its unit may run (the gateway fronts them too).
            self.surging: dict[str, Instance] = {}
            #: host -> model path -> link target before anything of this run (what a failed surge restores).
            self.links_first: dict[str, dict[str, str | None]] = {}
            self.uuids: dict[str, dict[int, str] | None] = {}
            #: surge instances added at the gateway (taken out before they stop).
            self.at_gateway: set[str] = set()
            #: the running surge batch's timings entry (``SURGE_PHASES`` added up as they run), or None
            self.surge_took: dict[str, Any] | None = None

    def _steps(self, plan: Plan, states: Mapping[str, remote.HostState]) -> list[SurgeStep]:
        self._surge_init()
        if not self.opts.surge:
            return []
        steps = plan_surges(self.inv, plan, self.instances, states, StateStore(self.state_dir).load())
        why = refusal(steps) if self.opts.surge == "strict" and not self.opts.plan_only else None
        if why:
            raise SurgeRefused(why)
        return steps

    def prepare(self, fleet: Any) -> tuple[Plan, dict[str, remote.HostState]]:
        plan, states = super().prepare(fleet)
        self._surge_init()
        self.uuids = {h: st.gpu_uuids for h, st in states.items()}
        self.surge_steps = self._steps(plan, states)
        for s in self.surge_steps:
            self.event("phase", "surge plan: " + s.line())
        return plan, states

    def run(self) -> DeployReport:
        try:
            return super().run()
        finally:
            if self.report is not None:
                self.report.surge = [s.to_dict() for s in getattr(self, "surge_steps", [])]

    def _rollout(
        self, fleet: Any, plan: Plan, states: dict[str, remote.HostState], targets: list[str], rep: DeployReport
    ) -> None:
        self.surge_steps = self._steps(plan, states)  # the plan again under the lock: so is the surge plan
        super()._rollout(fleet, plan, states, targets, rep)
        for s in self.surge_steps:
            if s.mode == "surge" and s.outcome == "planned":
                s.outcome = "not_reached"

    @property
    def gateway(self) -> Any:
        """The engine's gateway hook, fronting the running surge units too."""
        hook: Any = super().gateway  # the gateway package's Hook (instances, marked): more than GatewayHook
        if hook is not None and not getattr(hook, "_surge_wrapped", False) and hasattr(hook, "instances"):
            base: Callable[[], dict[str, Instance]] = hook.instances
            hook.instances = lambda: {**base(), **self.surging}
            hook._surge_wrapped = True
        return hook

    def apply_job(self, hp: Any, st: remote.HostState) -> dict[str, Any]:
        job = super().apply_job(hp, st)
        first = self.links_first.get(hp.host) if hasattr(self, "links_first") else None
        if first:  # staging for a surge switched the links before the engine's batch read them
            for w in job["write"]:
                if w.get("model_path") in first:
                    w["model_before"] = first[w["model_path"]]
        return job

    # --- the batch ------------------------------------------------------------------

    def _batch(
        self,
        fleet: Any,
        n: int,
        batch: list[str],
        by_host: Mapping[str, Any],
        states: dict[str, remote.HostState],
        rep: DeployReport,
    ) -> list[str]:
        per_host = {h: [s for s in self.surge_steps if s.host == h and s.mode == "surge"] for h in batch}
        if not any(per_host.values()):
            return super()._batch(fleet, n, batch, by_host, states, rep)
        # One timings entry for the batch, as an in-place batch has: the in-place parts (the engine's
        # batch per surge round and for the rest) are folded into it, the surge's own steps added.
        t0 = time.monotonic()
        entries = rep.timings.setdefault("batches", [])
        took: dict[str, Any] = {"batch": n, "hosts": len(batch), **{k: 0.0 for k in SURGE_PHASES}}
        entries.append(took)
        first = len(entries)
        self.surge_took = took
        try:
            for h in batch:
                self.links_first.setdefault(h, {p: m.get("target") for p, m in states[h].models.items()})
            failed: list[str] = []
            for k in range(max(len(v) for v in per_host.values())):
                now = {h: v[k] for h, v in per_host.items() if len(v) > k and h not in failed}
                if now:
                    failed += self._surge_round(fleet, n, now, by_host, states, rep)
            surged = {s.instance for v in per_host.values() for s in v}
            rest = {
                h: HostPlan(h, [i for i in by_host[h].items if i.instance not in surged])
                for h in batch
                if h not in failed
            }
            rest = {h: hp for h, hp in rest.items() if hp.changes}
            if rest:
                failed += self._merged(fleet, n, list(rest), rest, states, rep)
            return failed
        finally:
            parts = entries[first:]
            del entries[first:]
            for phase in IN_PLACE_PHASES:
                took[phase] = round(sum(float(p.get(phase, 0.0)) for p in parts), 3)
            took["mark_downs"] = sum(int(p.get("mark_downs", 0)) for p in parts)
            took["seconds"] = round(time.monotonic() - t0, 3)
            self.surge_took = None

    def _timed(self, phase: str, t0: float) -> float:
        """Add the seconds since ``t0`` to ``phase`` of the surge batch's timings; now."""
        now = time.monotonic()
        took = getattr(self, "surge_took", None)
        if took is not None:
            took[phase] = round(took[phase] + now - t0, 3)
        return now

    def _merged(
        self,
        fleet: Any,
        n: int,
        hosts: list[str],
        plans: Mapping[str, Any],
        states: dict[str, remote.HostState],
        rep: DeployReport,
    ) -> list[str]:
        """The engine's batch over ``plans`` (a part of each host's plan), keeping what earlier parts
        of this batch recorded on the host's outcome."""
        before = {h: rep.hosts.get(h) for h in hosts}
        failed = super()._batch(fleet, n, hosts, plans, states, rep)
        for h, old in before.items():
            new = rep.hosts[h]
            if old is not None and old.batch == n and old is not new:
                new.gates[:0] = old.gates
                new.drained = {**old.drained, **new.drained}
        return failed

    def _fail(self, rep: DeployReport, n: int, step: SurgeStep, why: str) -> None:
        step.outcome, step.error = "failed", why
        out = rep.hosts.get(step.host)
        if out is None or out.batch != n:
            out = rep.hosts[step.host] = HostOutcome(step.host, "failed", n)
        out.status, out.error = "failed", f"{step.surge}: {why}"
        self.event("host", f"surge {step.surge} failed: {why}; {step.instance} was not stopped", step.host, False)

    def _render(self, step: SurgeStep, states: Mapping[str, remote.HostState]) -> Instance:
        inst = self.instances[step.instance]
        assert step.surge is not None and step.port is not None
        s_inst = dataclasses.replace(
            inst, name=step.surge, port=step.port, placement=tuple(GpuRef(step.host, g) for g in step.gpus)
        )
        st = states.get(step.host) or remote.HostState(step.host)
        st_uuids = dataclasses.replace(st, gpu_uuids=st.gpu_uuids or self.uuids.get(step.host))
        uuids = {step.surge: u} if (u := pinned_uuids(s_inst, st_uuids)) else {}
        [r] = render_all(self.inv, {step.surge: s_inst}, {step.host: st.systemd_version}, uuids)
        self.rendered[step.surge] = dataclasses.replace(r, enable_at_boot=False)  # temporary: never at boot
        self.instances[step.surge] = s_inst
        return s_inst

    def _surge_round(
        self,
        fleet: Any,
        n: int,
        now: dict[str, SurgeStep],
        by_host: Mapping[str, Any],
        states: dict[str, remote.HostState],
        rep: DeployReport,
    ) -> list[str]:
        """One changed instance per host of ``now``: surge, in-place restart, retire; the failed hosts."""
        failed: list[str] = []
        self.event("phase", "surge: " + ", ".join(f"{s.surge} on {h}" for h, s in now.items()))
        t = time.monotonic()
        unstaged = self._stage(fleet, list(now), {s.instance for s in now.values()}, states)
        t = self._timed("surge_stage_s", t)
        for h, why in unstaged.items():
            self._fail(rep, n, now[h], why)
            failed.append(h)
        go = {h: s for h, s in now.items() if h not in failed}
        for s in go.values():
            self.surging[s.surge or ""] = self._render(s, states)
        jobs = {h: self.apply_job(HostPlan(h, [PlanItem(s.surge or "", h, "new")]), states[h]) for h, s in go.items()}
        for h, r in ap.apply_hosts(fleet, jobs).items():
            if not r.ok:
                self._fail(rep, n, go[h], f"start: {r.error}")
        t = self._timed("surge_start_s", t)
        results = self.gate(fleet, [s.surge or "" for h, s in go.items() if now[h].outcome == "planned"])
        t = self._timed("surge_gate_s", t)
        bad = {g.instance: g for g in results if not g.ok}
        for h, s in go.items():
            g = bad.get(s.surge or "")
            if g is not None and s.outcome == "planned":
                self._fail(
                    rep,
                    n,
                    s,
                    f"gate: {g.reason}" + (" (inconclusive: the old version keeps serving)" if g.inconclusive else ""),
                )
        passed = {h: s for h, s in go.items() if s.outcome == "planned"}
        if passed:
            self.at_gateway |= {
                s.surge or "" for s in passed.values()
            }  # also when a gateway host failed: taken out later
            err = self._gateway_sync()
            t = self._timed("surge_add_s", t)
            if err:
                for s in passed.values():
                    self._fail(rep, n, s, f"not added at the gateway: {err}")
                passed = {}
            else:
                for h, s in passed.items():
                    self.event("host", f"{s.surge} passed its gates and serves at the gateway", h)
        lost = [h for h, s in go.items() if s.outcome == "failed"]
        self._retire(fleet, [go[h] for h in lost], relink=True)
        t = self._timed("surge_retire_s", t)
        failed += lost
        if passed:
            plans = {
                h: HostPlan(h, [i for i in by_host[h].items if i.instance == s.instance]) for h, s in passed.items()
            }
            broke = self._merged(fleet, n, list(passed), plans, states, rep)
            for h in broke:
                passed[h].outcome, passed[h].error = "failed", rep.hosts[h].error
            # a host whose own restart failed keeps its surge unit until the batch's rollback restored it
            t = time.monotonic()
            self._retire(fleet, [s for h, s in passed.items() if h not in broke])
            self._timed("surge_retire_s", t)
            for h, s in passed.items():
                if h not in broke:
                    s.outcome = "done"
            failed += broke
        return failed

    def _gateway_sync(self) -> str | None:
        """Render the gateway again (running surge units included); why it could not, or None."""
        hook = self.gateway
        if hook is None:
            return None
        try:
            hook.mark_up_many([])
        except ClusterctlError as e:
            return str(e)
        return None

    def _retire(self, fleet: Any, steps: Sequence[SurgeStep], relink: bool = False) -> None:
        """Take the surge units of ``steps`` out of the gateway (one sync; nginx's graceful reload lets
        requests in flight finish), wait for those in flight, then stop and remove them (no previous
        copy kept).  ``relink``: also put back the model links staging switched (the old one never stopped)."""
        steps = [s for s in steps if s.surge in self.surging]
        if not steps:
            return
        insts = [self.surging.pop(s.surge or "") for s in steps]
        for s in steps:
            self.instances.pop(s.surge or "", None)
        served = [s for s in steps if s.surge in self.at_gateway]
        if served:
            self.at_gateway -= {s.surge for s in served}
            hook = self.gateway
            try:  # rendered without them (and any mark of theirs cleared)
                if hook is not None:
                    hook.mark_up_many([s.surge for s in served])
            except ClusterctlError as e:
                self.event("warn", f"gateway: surge units not taken out: {e}", ok=False)
            with cf.ThreadPoolExecutor(max_workers=min(16, len(insts))) as ex:
                notes = list(ex.map(lambda i: _drain(self.inv, i, self.opts.drain_timeout_s), insts))
            for s, note in zip(steps, notes):
                self.event("host", f"{s.surge}: out of the gateway, {note}", s.host, note == "drained")
        jobs: dict[str, dict[str, Any]] = {}
        for s in steps:
            job = jobs.setdefault(
                s.host,
                {
                    "op": "apply",
                    "run_id": self.me.run_id,
                    "write": [],
                    "restart": [],
                    "start": [],
                    "remove": [],
                    "forget": [],
                    "relink": [],
                    "setup_scripts": [],
                },
            )
            job["remove"].append(s.surge)
            job["forget"].append(s.surge)
            r = self.rendered.get(s.instance)
            before = self.links_first.get(s.host, {})
            if relink and r is not None and r.model_path and before.get(r.model_path):
                job["relink"].append({"path": r.model_path, "target": before[r.model_path]})
        for h, reply in ap.apply_hosts(fleet, jobs).items():
            self.event(
                "host", "surge unit removed" if reply.ok else f"surge unit not removed: {reply.error}", h, reply.ok
            )

    def _rollback(
        self, fleet: Any, hosts: list[str], by_host: Mapping[str, Any], rep: DeployReport, status: str
    ) -> None:
        super()._rollback(fleet, hosts, by_host, rep, status)
        self._retire(fleet, [s for s in self.surge_steps if s.host in hosts and s.surge in self.surging])


def _drain(inv: Inventory, inst: Instance, timeout: float) -> str:
    """Wait for a surge unit's requests in flight (it is out of the gateway already); how it ended."""
    r = dr.drain(inv, inst, timeout=timeout)
    return "drained" if r.drained else f"drain timed out, {r.remaining} in flight"


def with_surge(base: type[D]) -> type[D]:
    """``base`` (a Deploy class, e.g. the release gates') with surge; ``SurgeDeploy`` for ``Deploy``."""
    if base is Deploy:
        return cast("type[D]", SurgeDeploy)
    return cast("type[D]", type(f"Surge{base.__name__}", (SurgeDeploy, base), {}))
