"""Run a playbook (:mod:`clusterctl.deploy.playbooks.load`) with the deploy engine's pieces.

The plan is the engine's (:meth:`Deploy.prepare`: render, read, diff) over
the hosts and instances the command line selected; each step narrows it
with its own ``hosts:`` / ``instances:`` patterns.  Under the engine's lock
(every host with a change, and every exec step's hosts), steps run in order:

* ``preflight``: the engine's pre-flight on the step's new and changed
  instances; a refusal stops the playbook (unless ``--force``).
* ``stage``: stage missing model versions on the step's hosts.
* ``units``: write unit and env files (previous copies saved for rollback),
  daemon-reload, enable; nothing is started, restarted or removed.
* ``canary``: the first batch of the step's ``serial`` (default: the next
  rollout's serial, else ``1``); ``rollout``: the batches of its ``serial``
  over the step's hosts, less the hosts an earlier step already rolled out,
  so canary + rollout batch exactly as ``deploy --serial`` does.  Each batch
  is staged, drained, applied (files a ``units`` step wrote are not written
  again), gated (standard gate, then the step's custom gates) and judged
  with ``max_fail_percentage`` (exceeded, not reached): a failed batch is
  rolled back and the playbook stops; failures within it are rolled back
  alone.
* ``gates``: the standard and custom gates of the instances this run
  started on the step's hosts; judged and rolled back like one batch.
* ``exec``: a shell command on the step's hosts (in ``serial`` batches) that
  must exit ``expect_rc``; a batch over ``max_fail_percentage`` stops.

When the playbook stops, files a ``units`` step wrote on hosts not yet
rolled out are put back too.  Nothing here prints: progress goes to
``on_event`` as engine :class:`~clusterctl.deploy.rollout.engine.Event` values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from clusterctl.deploy.rollout import apply as ap
from clusterctl.deploy.rollout import gates, lock, batches as rollout
from clusterctl.deploy import remote
from clusterctl.deploy.rollout.engine import (
    Deploy,
    DeployOptions,
    DeployReport,
    Event,
    FleetFactory,
    HostOutcome,
    PreflightRefused,
    api_key,
    render_all,
)
from clusterctl.deploy.rollout.drain import GatewayHook
from clusterctl.deploy.rollout.plan import CHANGING, HostPlan, Plan, make_plan, matches
from clusterctl.deploy.playbooks.load import CustomGate, Playbook, PlaybookError, Step
from clusterctl.deploy.playbooks.gates import wait_custom, with_vars
from clusterctl.errors import ClusterctlError, Problem
from clusterctl.inventory.model import Host, Inventory
from clusterctl.inventory.select import select_hosts

#: Plan actions that start or restart an instance (what gates check).
STARTING = ("new", "changed", "start")


@dataclass
class StepPlan:
    """What one step covers: ``hosts`` (in order), ``instances`` it changes, and its ``batches``."""

    step: Step
    hosts: list[str]
    instances: list[str]
    batches: list[list[str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        s = self.step
        return {
            "name": s.name,
            "kind": s.kind,
            "line": s.line,
            "hosts": self.hosts,
            "instances": self.instances,
            "batches": self.batches,
            "serial": s.serial,
            "max_fail_percentage": s.max_fail_percentage,
            "gates": [g.describe() for g in s.gates],
            "command": s.command or None,
        }


@dataclass
class StepOutcome:
    """``status``: ``ok``, ``failed`` (the playbook stopped here), ``partial`` (failures within
    max_fail_percentage) or ``skipped`` (nothing to do, or an earlier step failed)."""

    name: str
    kind: str
    status: str
    note: str = ""
    hosts: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "status": self.status, "note": self.note, "hosts": self.hosts}


@dataclass
class PlaybookReport:
    """The engine's report (``deploy``: result, hosts, plan) plus the steps.

    ``deploy.result`` adds ``stopped`` to the engine's values: a step that is
    not a rollout batch failed (nothing that had been rolled out needed
    undoing)."""

    playbook: str
    deploy: DeployReport
    steps: list[StepPlan]
    outcomes: list[StepOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.deploy.ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "playbook": self.playbook,
            **self.deploy.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "outcomes": [o.to_dict() for o in self.outcomes],
        }


class StepFailed(Exception):
    """Stops the playbook (internal)."""


# --- resolution (pure) ----------------------------------------------------------------


def step_hosts(book: Playbook, step: Step, inv: Inventory, selected: Sequence[str]) -> list[str]:
    """The selected hosts (in their order) that the step's ``hosts:`` pattern matches."""
    if not step.hosts:
        return list(selected)
    try:
        names = {h.name for h in select_hosts(inv, step.hosts)}
    except ClusterctlError as e:
        raise PlaybookError(
            [Problem(book.path, step.hosts_line or step.line, f"step {step.name!r}: hosts: {e}")]
        ) from None
    return [h for h in selected if h in names]


def scoped(plan: Plan, hosts: Sequence[str], pattern: str | None, done: set[tuple[str, str]]) -> dict[str, HostPlan]:
    """Per host in ``hosts``: its plan items matching ``pattern`` that change and are not ``done``."""
    by_host = {hp.host: hp for hp in plan.hosts}
    out: dict[str, HostPlan] = {}
    for h in hosts:
        hp = by_host.get(h)
        if hp is None or hp.error:
            continue
        items = [
            i for i in hp.items if i.action in CHANGING and matches(i.instance, pattern) and (h, i.instance) not in done
        ]
        if items:
            out[h] = HostPlan(h, items)
    return out


def canary_serial(book: Playbook, step: Step) -> list[str]:
    """A canary's serial: its own, else the next rollout step's, else ``["1"]``."""
    if step.serial:
        return list(step.serial)
    later = book.steps[book.steps.index(step) + 1 :]
    return next((list(s.serial) for s in later if s.kind == "rollout" and s.serial), ["1"])


def rollout_batches(targets: Sequence[str], serial: Sequence[str], done_hosts: set[str]) -> list[list[str]]:
    """``serial``'s batches over all ``targets``, less hosts already rolled out (empty batches dropped).

    So a canary (the first batch) followed by the rollout gives the batches
    one ``deploy --serial`` run would."""
    return [b for b in ([h for h in batch if h not in done_hosts] for batch in rollout.batches(targets, serial)) if b]


def resolve(book: Playbook, inv: Inventory, plan: Plan, selected: Sequence[str]) -> list[StepPlan]:
    """Every step's hosts, instances and batches as they would run against ``plan``.

    Raises :class:`PlaybookError` (``file:line``) for a step whose ``hosts:``
    pattern is not valid for the inventory."""
    done: set[tuple[str, str]] = set()
    done_hosts: set[str] = set()
    out: list[StepPlan] = []
    for step in book.steps:
        hosts = step_hosts(book, step, inv, selected)
        sc = scoped(plan, hosts, step.instances, done if step.kind in ("canary", "rollout") else set())
        insts = sorted({i.instance for hp in sc.values() for i in hp.items})
        sp = StepPlan(step, list(sc), insts)
        if step.kind == "exec":
            sp.hosts = hosts
            sp.batches = rollout.batches(hosts, step.serial)
        elif step.kind in ("canary", "rollout"):
            serial = canary_serial(book, step) if step.kind == "canary" else step.serial
            targets = list(scoped(plan, hosts, step.instances, set()))
            batches = rollout_batches(targets, serial, done_hosts)
            sp.batches = batches[:1] if step.kind == "canary" else batches
            for b in sp.batches:
                for h in b:
                    done.update((h, i.instance) for i in sc.get(h, HostPlan(h)).items)
                    done_hosts.add(h)
            sp.hosts = [h for b in sp.batches for h in b]
            sp.instances = sorted({i.instance for h in sp.hosts for i in sc.get(h, HostPlan(h)).items})
        out.append(sp)
    return out


def lock_targets(plan: Plan, steps: Sequence[StepPlan]) -> list[str]:
    """Hosts the playbook may touch: every host with a change, and every exec step's hosts."""
    want = set(plan.changed_hosts()) | {h for s in steps if s.step.kind == "exec" for h in s.hosts}
    return [hp.host for hp in plan.hosts if hp.host in want]


# --- running --------------------------------------------------------------------------


class StepDeploy(Deploy):
    """The engine, with the current step's custom gates and gate timeout, and without
    rewriting files a ``units`` step already wrote (that would overwrite the previous
    copies it saved for rollback)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.written: dict[str, set[str]] = {}  # host -> instances whose files a units step wrote
        self.custom: list[CustomGate] = []

    def apply_job(self, hp: Any, st: remote.HostState) -> dict[str, Any]:
        job = super().apply_job(hp, st)
        done = self.written.get(hp.host, set())
        job["write"] = [w for w in job["write"] if w["instance"] not in done]
        if not job["write"]:
            job["setup_scripts"] = []
        return job

    def extra_gates(self, fleet: Any, passed: list[gates.GateTarget]) -> list[gates.GateResult]:
        if not self.custom:
            return []
        return wait_custom(passed, self.custom, exec_runner(fleet), on_result=self.gate_event, reference=self.reference)

    def reference(self, name: str) -> tuple[str, str | None]:
        """A bench gate's reference instance (from the inventory): its URL and API key."""
        inst = self.instances.get(name)
        if inst is None:
            raise ClusterctlError(f"no instance {name!r} in the inventory")
        [r] = render_all(self.inv, {name: inst})
        return f"http://{self.inv.hosts[r.host].address}:{r.port}", api_key(r)


def exec_runner(fleet: Any) -> Callable[[str, str, float], tuple[int | None, str]]:
    """Runs an exec gate's command on one host of ``fleet``: ``(rc, stderr or stdout tail)``."""

    def run(host: str, command: str, timeout: float) -> tuple[int | None, str]:
        r = fleet.run({host: command}, sudo=True, timeout=timeout)[host]
        if r.rc is None:
            return None, r.error or r.status.value
        return r.rc, (r.stderr.strip() or r.stdout.strip())[-200:]

    return run


class PlaybookRun:
    """One ``clusterctl deploy --playbook`` run (see the module docstring)."""

    def __init__(
        self,
        book: Playbook,
        inv: Inventory,
        hosts: Sequence[Host],
        make_fleet: FleetFactory,
        state_dir: str,
        opts: DeployOptions,
        on_event: Callable[[Event], None] = lambda e: None,
        gateway: GatewayHook | None = None,
    ):
        self.book, self.inv, self.opts = book, inv, opts
        self.dep = StepDeploy(inv, hosts, make_fleet, state_dir, opts, on_event, gateway=gateway)
        self.selected = [h.name for h in hosts]
        self.written = self.dep.written
        self.rolled: set[tuple[str, str]] = set()  # (host, instance) rolled out by a canary/rollout step
        self.started: dict[str, set[str]] = {}  # host -> instances this run started or restarted

    def plan(self) -> PlaybookReport:
        """The playbook's plan: the engine's per-host plan and every step's hosts and batches."""
        t0 = time.monotonic()
        with self.dep.make_fleet(self.dep.hosts) as fleet:
            plan, _ = self.dep.prepare(fleet)
        rep = DeployReport(self.dep.me.run_id, plan, "planned", seconds=time.monotonic() - t0)
        for hp in plan.hosts:
            rep.hosts[hp.host] = HostOutcome(hp.host, "unreadable" if hp.error else "unchanged", error=hp.error)
        steps = resolve(self.book, self.inv, plan, self.selected)
        rep.batches = [b for sp in steps if sp.step.kind in ("canary", "rollout") for b in sp.batches]
        return PlaybookReport(self.book.name, rep, steps)

    def run(self) -> PlaybookReport:
        """Run every step under the lock; raises the engine's ``PreflightRefused`` / ``LockHeld``."""
        t0 = time.monotonic()
        dep = self.dep
        with dep.make_fleet(dep.hosts) as fleet:
            plan, states = dep.prepare(fleet)
            steps = resolve(self.book, self.inv, plan, self.selected)
            rep = DeployReport(dep.me.run_id, plan, "planned")
            dep.report = rep
            out = PlaybookReport(self.book.name, rep, steps)
            for hp in plan.hosts:
                rep.hosts[hp.host] = HostOutcome(hp.host, "unreadable" if hp.error else "unchanged", error=hp.error)
            targets = lock_targets(plan, steps)
            if not plan.changed_hosts():
                rep.result = "nothing" if not any(h.error for h in plan.hosts) else "partial"
                out.outcomes = [StepOutcome(s.step.name, s.step.kind, "skipped", "nothing to change") for s in steps]
                dep._audit_local(rep)
                rep.seconds = time.monotonic() - t0
                return out
            try:
                got = lock.acquire(fleet, targets, dep.me, ttl_s=self.opts.lock_ttl_s, break_lock=self.opts.break_lock)
            except lock.LockHeld as e:
                rep.result = "refused"
                dep._audit_local(rep, str(e))
                raise
            detail: str | None = None
            try:
                rep.recovered_locks = got.recovered
                for h, why in got.failed.items():
                    rep.hosts[h] = HostOutcome(h, "unreadable", error=f"lock: {why}")
                states.update(dep._read(fleet, got.locked))
                plan = make_plan(list(dep.rendered.values()), states, self.selected, self.opts.instances)
                rep.plan = plan
                out.steps = resolve(self.book, self.inv, plan, [h for h in self.selected if h in got.locked])
                rep.result = "ok"
                detail = self._steps(fleet, out, states)
            except KeyboardInterrupt:
                rep.result = "interrupted"
                raise
            except lock.LockHeld:
                raise
            except ClusterctlError as e:
                if rep.result == "ok":
                    rep.result = "refused" if isinstance(e, PreflightRefused) else "error"
                detail = str(e).splitlines()[0]
                raise
            except Exception:
                rep.result = "error"
                raise
            finally:
                lock.release_anyway(
                    fleet,
                    got.locked,
                    dep.me.run_id,
                    dep._audit_record(rep, detail),
                    lambda: dep.make_fleet([self.inv.hosts[h] for h in got.locked]),
                )
                dep._audit_local(rep, detail)
            dep._save_placements(rep)
        rep.seconds = time.monotonic() - t0
        return out

    # -- steps ------------------------------------------------------------------------

    def _steps(self, fleet: Any, out: PlaybookReport, states: dict[str, remote.HostState]) -> str | None:
        """Run the steps in order; returns the audit detail (the step that stopped the run)."""
        rep = out.deploy
        for n, sp in enumerate(out.steps):
            self.dep.event(
                "phase",
                f"step {sp.step.name} ({sp.step.kind}): "
                f"{len(sp.hosts)} hosts" + (f", {len(sp.batches)} batches" if sp.batches else ""),
            )
            try:
                outcome = self._step(fleet, sp, rep, states)
            except PreflightRefused:
                self._undo_written(fleet, rep)  # a preflight step after a units step
                raise
            except StepFailed as e:
                outcome = StepOutcome(sp.step.name, sp.step.kind, "failed", str(e))
                out.outcomes.append(outcome)
                self._undo_written(fleet, rep)
                for later in out.steps[n + 1 :]:
                    out.outcomes.append(
                        StepOutcome(later.step.name, later.step.kind, "skipped", "an earlier step failed")
                    )
                if rep.result not in ("rolled_back",):
                    rep.result = "stopped"
                for h, o in rep.hosts.items():
                    if o.status == "unchanged" and h in out.deploy.plan.changed_hosts():
                        rep.hosts[h] = HostOutcome(h, "not_reached", error="playbook stopped")
                return f"step {sp.step.name!r} failed: {e}"
            out.outcomes.append(outcome)
            if outcome.status == "partial":
                rep.result = "partial"
        if rep.result == "ok" and any(h.status == "unreadable" for h in rep.hosts.values()):
            rep.result = "partial"
        return None

    def _step(self, fleet: Any, sp: StepPlan, rep: DeployReport, states: dict[str, remote.HostState]) -> StepOutcome:
        s = sp.step
        self.dep.custom = list(s.gates)
        self.dep.opts = replace(
            self.opts,
            gate_timeout_s=s.gate_timeout_s or self.opts.gate_timeout_s,
            max_fail_percentage=s.max_fail_percentage,
            serial=list(s.serial),
        )
        if s.kind == "exec":
            return self._exec(fleet, sp)
        sc = self._scope(rep.plan, sp)
        if not sc and s.kind != "gates":
            return StepOutcome(s.name, s.kind, "skipped", "nothing to change on its hosts")
        if s.kind == "preflight":
            return self._preflight(fleet, sp, rep, sc)
        if s.kind == "stage":
            return self._judge(sp, self.dep._stage(fleet, list(sc), self._starting(sc), states), list(sc))
        if s.kind == "units":
            return self._units(fleet, sp, sc, states, rep)
        if s.kind == "gates":
            return self._gates_step(fleet, sp, rep)
        return self._rollout(fleet, sp, sc, states, rep)

    def _scope(self, plan: Plan, sp: StepPlan) -> dict[str, HostPlan]:
        done = self.rolled if sp.step.kind in ("canary", "rollout") else set()
        sc = scoped(plan, sp.hosts, sp.step.instances, done)
        return {h: sc[h] for h in sp.hosts if h in sc}

    @staticmethod
    def _starting(sc: Mapping[str, HostPlan]) -> set[str]:
        return {i.instance for hp in sc.values() for i in hp.items if i.action in STARTING}

    def _judge(self, sp: StepPlan, failed: Mapping[str, str], hosts: Sequence[str]) -> StepOutcome:
        """Failed hosts against max_fail_percentage: over it raises StepFailed; else ok/partial."""
        s = sp.step
        for h, why in failed.items():
            self.dep.event("host", f"{s.name}: {why}", h, ok=False)
        if rollout.batch_failed(len(failed), len(hosts), s.max_fail_percentage):
            raise StepFailed(
                f"{len(failed)}/{len(hosts)} hosts failed (max fail {s.max_fail_percentage:g} %): "
                + "; ".join(f"{h}: {w}" for h, w in failed.items())
            )
        return StepOutcome(
            s.name,
            s.kind,
            "partial" if failed else "ok",
            f"{len(failed)} failed within max fail" if failed else "",
            {h: failed.get(h, "ok") for h in hosts},
        )

    def _preflight(self, fleet: Any, sp: StepPlan, rep: DeployReport, sc: Mapping[str, HostPlan]) -> StepOutcome:
        pre = self.dep.preflight(fleet, Plan(list(sc.values())))  # raises PreflightRefused unless --force
        if pre is not None:
            rep.preflight = pre
        note = "" if pre is None else ("ok" if pre.ok else "refused, forced on")
        return StepOutcome(sp.step.name, sp.step.kind, "ok", note, {h: "ok" for h in sc})

    def _units(
        self,
        fleet: Any,
        sp: StepPlan,
        sc: Mapping[str, HostPlan],
        states: dict[str, remote.HostState],
        rep: DeployReport,
    ) -> StepOutcome:
        jobs: dict[str, dict[str, Any]] = {}
        for h, hp in sc.items():
            job = self.dep.apply_job(hp, states[h])
            job.update(restart=[], start=[], remove=[])
            if job["write"]:
                jobs[h] = job
        replies = ap.apply_hosts(
            fleet,
            jobs,
            on_reply=lambda r: self.dep.event(
                "host", "units written" if r.ok else f"writing units failed: {r.error}", r.host, r.ok
            ),
        )
        failed = {}
        for h, r in replies.items():
            self.written.setdefault(h, set()).update(w["instance"] for w in jobs[h]["write"])
            if not r.ok:
                failed[h] = r.error or "apply failed"
        if failed:
            self._rollback(
                fleet, list(failed), rep, "failed", {h: sorted(self.written.pop(h)) for h in failed}, restart=False
            )
        return self._judge(sp, failed, list(jobs))

    def _rollout(
        self,
        fleet: Any,
        sp: StepPlan,
        sc: Mapping[str, HostPlan],
        states: dict[str, remote.HostState],
        rep: DeployReport,
    ) -> StepOutcome:
        s = sp.step
        batches = [[h for h in b if h in sc] for b in sp.batches]
        batches = [b for b in batches if b]
        rep.batches.extend(batches)
        outcome = StepOutcome(s.name, s.kind, "ok")
        for n, batch in enumerate(batches, 1):
            label = f"{s.name} batch {n}/{len(batches)}"
            self.dep.event("batch", f"{label}: {len(batch)} hosts: {', '.join(batch)}", step=n, steps=len(batches))
            failed = self.dep._batch(fleet, len(rep.batches) - len(batches) + n, batch, sc, states, rep)
            for h in batch:
                outcome.hosts[h] = (rep.hosts[h].error or "failed") if h in failed else "ok"
            if rollout.batch_failed(len(failed), len(batch), s.max_fail_percentage):
                self.dep.event(
                    "batch",
                    f"{label} failed on {len(failed)}/{len(batch)} hosts "
                    f"(max fail {s.max_fail_percentage:g} %): rolling back this batch",
                    ok=False,
                )
                self._rollback(fleet, batch, rep, "rolled_back", {h: ap.touched(sc[h]) for h in batch})
                for h in batch:
                    self.written.pop(h, None)  # restored above: not again by _undo_written
                rep.result = "rolled_back"
                raise StepFailed(f"{label} failed: " + "; ".join(f"{h}: {rep.hosts[h].error}" for h in failed))
            if failed:
                self._rollback(fleet, failed, rep, "failed", {h: ap.touched(sc[h]) for h in failed})
                outcome.status = "partial"
            for h in batch:
                self.rolled.update((h, i.instance) for i in sc[h].items)
                if h not in failed:
                    self.started.setdefault(h, set()).update(i.instance for i in sc[h].items if i.action in STARTING)
                self.written.pop(h, None)
            self.dep.event("batch", f"{label} passed", step=n, steps=len(batches), done=True)
        return outcome

    def _gate(self, fleet: Any, names: list[str], rep: DeployReport) -> list[str]:
        """The engine's gate (standard, then the step's custom gates) of ``names``; returns the failed hosts."""
        failed: list[str] = []
        for g in self.dep.gate(fleet, names):
            rep.hosts[g.host].gates.append(g)
            if not g.ok and g.host not in failed:
                rep.hosts[g.host].status, rep.hosts[g.host].error = "failed", f"{g.instance}: {g.reason}"
                failed.append(g.host)
        return failed

    def _gates_step(self, fleet: Any, sp: StepPlan, rep: DeployReport) -> StepOutcome:
        s = sp.step
        names = {h: sorted(i for i in self.started.get(h, set()) if matches(i, s.instances)) for h in sp.hosts}
        names = {h: v for h, v in names.items() if v}
        if not names:
            return StepOutcome(s.name, s.kind, "skipped", "no instance on its hosts was started by this run")
        failed = self._gate(fleet, [i for h in names for i in names[h]], rep)
        hosts = list(names)
        by_host = {hp.host: hp for hp in rep.plan.hosts}
        touched = {h: [i for i in ap.touched(by_host[h]) if (h, i) in self.rolled] for h in hosts}
        if rollout.batch_failed(len(failed), len(hosts), s.max_fail_percentage):
            self._rollback(fleet, hosts, rep, "rolled_back", touched)
            rep.result = "rolled_back"
            raise StepFailed(
                f"gates failed on {len(failed)}/{len(hosts)} hosts (max fail "
                f"{s.max_fail_percentage:g} %): " + "; ".join(f"{h}: {rep.hosts[h].error}" for h in failed)
            )
        if failed:
            self._rollback(fleet, failed, rep, "failed", {h: touched[h] for h in failed})
        return StepOutcome(
            s.name,
            s.kind,
            "partial" if failed else "ok",
            "",
            {h: (rep.hosts[h].error or "failed") if h in failed else "ok" for h in hosts},
        )

    def _exec(self, fleet: Any, sp: StepPlan) -> StepOutcome:
        s = sp.step
        outcome = StepOutcome(s.name, s.kind, "ok")
        for n, batch in enumerate(sp.batches, 1):
            cmds = {h: with_vars(s.command, {"CLUSTERCTL_HOST": h}) for h in batch}
            results = fleet.run(cmds, sudo=True, timeout=s.timeout_s)
            failed: dict[str, str] = {}
            for h in batch:
                r = results[h]
                if r.rc is None:
                    failed[h] = r.error or r.status.value
                elif r.rc != s.expect_rc:
                    tail = (r.stderr.strip() or r.stdout.strip())[-200:]
                    failed[h] = f"exit status {r.rc}, expected {s.expect_rc}" + (f": {tail}" if tail else "")
                else:
                    self.dep.event("host", f"{s.name}: exit status {r.rc}", h)
            got = self._judge(sp, failed, batch)
            outcome.hosts.update(got.hosts)
            if got.status == "partial":
                outcome.status = "partial"
        return outcome

    def _rollback(
        self,
        fleet: Any,
        hosts: list[str],
        rep: DeployReport,
        status: str,
        instances: Mapping[str, list[str]],
        restart: bool = True,
    ) -> None:
        """Put back what this run saved for ``instances[host]`` (the engine's node rollback op);
        ``restart=False`` for files that were written but never started."""
        replies = ap.rollback_hosts(
            fleet,
            {h: instances.get(h, []) for h in hosts},
            own_run_id=self.dep.me.run_id,
            only_run_id=self.dep.me.run_id,
            restart=restart,
        )
        if restart:
            self.dep.restore_gates(fleet, replies, rep)
        for h in hosts:
            r = replies.get(h)
            o = rep.hosts.get(h) or HostOutcome(h, status)
            o.status = status
            if r is not None and not r.ok:
                o.error = f"{o.error}; rollback: {r.error}"
            rep.hosts[h] = o
            self.dep.event(
                "host", "rolled back" if r is None or r.ok else f"rollback failed: {r.error}", h, r is None or r.ok
            )

    def _undo_written(self, fleet: Any, rep: DeployReport) -> None:
        """Files a units step wrote on hosts that were never rolled out go back (the playbook stopped)."""
        pending = {h: sorted(v) for h, v in self.written.items() if v}
        if pending:
            self._rollback(fleet, list(pending), rep, "not_reached", pending, restart=False)
            self.written.clear()
