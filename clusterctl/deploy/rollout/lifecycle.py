"""Start, stop and restart instances through systemd, draining first.

* ``stop``: :func:`~clusterctl.deploy.rollout.drain.drain` (gateway mark-down, wait for
  in-flight requests up to ``drain_timeout``), then ``systemctl stop
  clusterctl-NAME.service``.  The instance stays marked down at the gateway.
* ``restart``: drain, ``systemctl restart``, wait until ``/health`` answers
  200 (up to ``health_timeout``: vLLM loads for minutes), then mark it up at
  the gateway.
* ``start``: ``systemctl start``, wait for ``/health``, mark up.

Before a start or restart, a unit in systemd's failed state (its start limit
hit, say) is cleared with ``systemctl reset-failed``.  While waiting for
``/health`` the unit's state is read every ``UNIT_CHECK_S`` seconds: once it
failed, exited or is restarting after a crash the wait stops, and the error
names the journal's first error of that run (:mod:`clusterctl.deploy.rollout.journal`).

A multi-node replica (docs/multinode.md) is acted on as one: every member's unit, in the
replica's order.  ``stop`` drains the head (the gateway knows only the head), stops the
head's unit, then each worker's (``NAME-nodeR`` on its host); ``start`` starts the workers,
then the head, and waits for the head's ``/health`` (it answers only once every rank
joined), watching every member's unit; ``restart`` is a stop then a start (vLLM's head
takes no rank back, so a member is never restarted alone).  A worker that fails to start
stops the action before the head is started, naming the worker, its host and its journal's
first error.  ``ActionResult.units`` lists the units acted on, in that order.

A pool's router (``router-P``, docs/disaggregation.md) is drained through its pool: marked down at
the gateway, then its members' in-flight requests waited for (:mod:`clusterctl.deploy.rollout.routerdrain`).

Instances are worked on in parallel (at most ``parallel`` at once, each on its
own host's connection of the ``fleet``).  A drain that times out still stops
the instance (that is what the timeout bounds) and says so; ``drain=False``
skips it.  Every instance gets an :class:`ActionResult`, never an exception:
an unreachable host or a failing ``systemctl`` is a row with ``ok=False``.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from clusterctl.deploy.rollout.drain import DEFAULT_DRAIN_TIMEOUT_S, DEFAULT_POLL_S, DrainResult, GatewayHook, drain
from clusterctl.deploy.rollout.journal import first_error
from clusterctl.deploy.status.metrics import base_url, http_get
from clusterctl.deploy.rollout import routerdrain
from clusterctl.deploy.units import multinode, pdrouter
from clusterctl.deploy.spec import unit_name
from clusterctl.errors import ClusterctlError
from clusterctl.fleet import shell
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.fleet.fleet import Fleet

Action = Literal["start", "stop", "restart"]
#: Default seconds to wait for ``/health`` after a start or restart.
DEFAULT_HEALTH_TIMEOUT_S = 900.0
#: Seconds ``systemctl`` itself may take (stop waits for the process to exit).
SYSTEMCTL_TIMEOUT_S = 180.0
#: Seconds between two reads of the unit's state while waiting for ``/health``.
UNIT_CHECK_S = 3.0


@dataclass
class ActionResult:
    """What happened to one instance.  ``ok``: the action completed (and, for
    start/restart, ``/health`` answered 200).  ``drain``: the drain's result
    (``None`` when not drained).  ``healthy_after_s``: seconds from the
    systemctl call to the first 200 from ``/health``."""

    instance: str
    host: str | None
    action: Action
    ok: bool
    drain: DrainResult | None = None
    error: str | None = None
    healthy_after_s: float | None = None
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: a multi-node replica's units as acted on, in order (``UNIT on HOST``); empty for one host
    units: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["drain"] = self.drain.to_json() if self.drain else None
        return d


def wait_healthy(
    inv: Inventory,
    inst: Instance,
    timeout: float,
    poll: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    dead: Callable[[], str | None] | None = None,
) -> float | str | None:
    """Poll ``/health`` until 200: the seconds it took, ``None`` after ``timeout`` seconds, or
    the reason ``dead()`` gives (checked every ``UNIT_CHECK_S`` seconds) once the unit died."""
    url = base_url(inv, inst) + "/health"
    t0 = clock()
    checked = t0
    while True:
        if http_get(url, timeout=min(3.0, max(poll, 1.0))).ok:
            return round(clock() - t0, 2)
        if dead is not None and clock() - checked >= UNIT_CHECK_S:
            checked = clock()
            why = dead()
            if why:
                return why
        if clock() - t0 >= timeout:
            return None
        sleep(poll)


def unit_dead(fleet: Fleet, host: str, inst: Instance) -> str | None:
    """Why the instance's unit is no longer starting (failed, exited, restarting after a crash),
    or ``None`` while it is activating/active or cannot be read."""
    cmd = shell.join(["systemctl", "show", "-p", "ActiveState,SubState,Result", unit_name(inst.name)])
    r = fleet.run({host: cmd}, sudo=True, timeout=30)[host]
    if not r.ok:
        return None
    props = dict(ln.split("=", 1) for ln in (r.stdout or "").splitlines() if "=" in ln)
    active, sub = props.get("ActiveState", ""), props.get("SubState", "")
    if active in ("failed", "inactive") or sub == "auto-restart":
        return f"unit {active}/{sub} (result {props.get('Result', '?')})"
    return None


def _systemctl(fleet: Fleet, host: str, verb: str, inst: Instance) -> str | None:
    """Run ``systemctl VERB unit`` on ``host`` (as root); the error text, or ``None`` when it worked."""
    cmd = shell.join(["systemctl", verb, unit_name(inst.name)])
    if verb == "reset-failed":  # exits 1 when the unit is not failed: only that it ran matters
        cmd = f"systemctl is-failed --quiet {shell.quote(unit_name(inst.name))} && {cmd}"
    r = fleet.run({host: cmd}, sudo=True, timeout=SYSTEMCTL_TIMEOUT_S)[host]
    if r.ok:
        return None
    detail = (r.stderr or r.stdout or "").strip().splitlines()
    return f"systemctl {verb} on {host}: " + (detail[-1] if detail else (r.error or r.status.value))


def _one(
    inv: Inventory,
    fleet: Fleet,
    inst: Instance,
    action: Action,
    *,
    drain_first: bool,
    drain_timeout: float,
    poll: float,
    health_timeout: float,
    gateway: GatewayHook | None,
    on_event: Callable[[str], None],
    instances: Mapping[str, Instance] | None = None,
) -> ActionResult:
    t0 = time.monotonic()
    host = inst.placement[0].host if inst.placement else None
    res = ActionResult(inst.name, host, action, ok=False)
    if host is None:
        res.error = "the instance has no placement"
        return res
    try:
        if action in ("stop", "restart") and drain_first:
            on_event(f"{inst.name}: draining (up to {drain_timeout:g} s)")
            pool = pdrouter.pool_of(inv, inst.name)  # a pool's router: its requests run on the members
            res.drain = (
                drain(inv, inst, timeout=drain_timeout, poll=poll, gateway=gateway)
                if pool is None
                else routerdrain.drain_router(
                    inv, pool, instances or {}, timeout=drain_timeout, poll=poll, gateway=gateway
                )
            )
            if res.drain.timed_out:
                left = "?" if res.drain.remaining is None else res.drain.remaining
                res.notes.append(f"drain timed out with {left} request(s) in flight; {action}ing anyway")
        elif action in ("stop", "restart") and gateway is not None:
            gateway.mark_down(inst.name)
        if multinode.is_multinode(inst):
            _replica(inv, fleet, inst, action, res, poll=poll, health_timeout=health_timeout, on_event=on_event)
        else:
            _single(inv, fleet, inst, host, action, res, poll=poll, health_timeout=health_timeout, on_event=on_event)
        if res.ok and action in ("start", "restart") and gateway is not None:
            gateway.mark_up(inst.name)
    except ClusterctlError as e:  # the gateway could not mark the instance
        res.error, res.ok = f"gateway: {e}", False
    res.duration_s = round(time.monotonic() - t0, 2)
    return res


def _single(
    inv: Inventory,
    fleet: Fleet,
    inst: Instance,
    host: str,
    action: Action,
    res: ActionResult,
    *,
    poll: float,
    health_timeout: float,
    on_event: Callable[[str], None],
) -> None:
    """systemctl ACTION on a one-host instance's unit, then (start/restart) its ``/health``."""
    if action in ("start", "restart"):
        # A unit systemd gave up on (start limit, failed) starts again only once its failed state is cleared.
        if _systemctl(fleet, host, "reset-failed", inst) is None:
            res.notes.append("cleared the unit's failed state")
    on_event(f"{inst.name}: systemctl {action} on {host}")
    res.error = _systemctl(fleet, host, action, inst)
    if res.error is None and action in ("start", "restart"):
        took = wait_healthy(inv, inst, health_timeout, poll, dead=lambda: unit_dead(fleet, host, inst))
        if took is None:
            res.error = f"/health did not answer 200 within {health_timeout:g} s"
        elif isinstance(took, str):
            res.error = f"{took}; {first_error(fleet, host, inst.name)}"
        else:
            res.healthy_after_s = took
    elif res.error is not None and action in ("start", "restart"):
        res.error = f"{res.error}; {first_error(fleet, host, inst.name)}"
    res.ok = res.error is None


def _replica(
    inv: Inventory,
    fleet: Fleet,
    inst: Instance,
    action: Action,
    res: ActionResult,
    *,
    poll: float,
    health_timeout: float,
    on_event: Callable[[str], None],
) -> None:
    """A multi-node replica's units in its order (module doc): stop head then workers; start workers then
    the head and wait for the head's ``/health``; restart = stop + start.  Sets ``res.error``/``res.ok``."""
    units = multinode.units(inst)
    res.units = [f"{unit_name(m.name)} on {h}" for m, h in units]
    errors: list[str] = []
    if action in ("stop", "restart"):
        for m, h in units:  # the head first: its API stops taking requests; then the ranks it leaves
            on_event(f"{inst.name}: systemctl stop {unit_name(m.name)} on {h}")
            err = _systemctl(fleet, h, "stop", m)
            if err is not None:
                errors.append(err)
        if errors or action == "stop":
            res.error = "; ".join(errors) or None
            res.ok = not errors
            return
        res.notes.append(
            "restart of a multi-node replica: stopped every unit (head first), then started the workers, then the head"
        )
    for m, h in units:
        if _systemctl(fleet, h, "reset-failed", m) is None:
            res.notes.append(f"cleared the failed state of {unit_name(m.name)} on {h}")
    for m, h in units[1:] + units[:1]:  # the workers, then the head
        on_event(f"{inst.name}: systemctl start {unit_name(m.name)} on {h}")
        err = _systemctl(fleet, h, "start", m)
        if err is not None:
            res.error = f"{err}; {first_error(fleet, h, m.name)}" + (
                "" if m.name == inst.name else f"; the head {unit_name(inst.name)} was not started"
            )
            return
    dead_member: list[tuple[Instance, str]] = []

    def dead() -> str | None:
        for m, h in units:
            why = unit_dead(fleet, h, m)
            if why:
                dead_member.append((m, h))
                return f"{unit_name(m.name)} on {h}: {why}"
        return None

    took = wait_healthy(inv, inst, health_timeout, poll, dead=dead)
    if took is None:
        res.error = f"/health of the head did not answer 200 within {health_timeout:g} s"
    elif isinstance(took, str):
        m, h = dead_member[-1]
        res.error = f"{took}; {first_error(fleet, h, m.name)}"
    else:
        res.healthy_after_s = took
    res.ok = res.error is None


def run_action(
    inv: Inventory,
    fleet: Fleet,
    instances: Sequence[Instance],
    action: Action,
    *,
    drain_first: bool = True,
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_S,
    poll: float = DEFAULT_POLL_S,
    health_timeout: float = DEFAULT_HEALTH_TIMEOUT_S,
    gateway: GatewayHook | None = None,
    parallel: int = 16,
    on_event: Callable[[str], None] | None = None,
    on_result: Callable[[ActionResult], None] | None = None,
    wanted: Mapping[str, Instance] | None = None,
) -> list[ActionResult]:
    """Apply ``action`` to every instance (module docstring); one result per instance, in order.
    ``wanted``: every instance wanted (a pool router's drain reads its members'; default: the inventory's)."""
    say = on_event or (lambda s: None)
    if not instances:
        return []

    def one(inst: Instance) -> ActionResult:
        r = _one(
            inv,
            fleet,
            inst,
            action,
            drain_first=drain_first,
            drain_timeout=drain_timeout,
            poll=poll,
            health_timeout=health_timeout,
            gateway=gateway,
            on_event=say,
            instances=wanted if wanted is not None else inv.instances,
        )
        if on_result:
            on_result(r)
        return r

    with cf.ThreadPoolExecutor(max_workers=max(1, min(parallel, len(instances)))) as pool:
        return list(pool.map(one, instances))


def stop_instances(inv: Inventory, fleet: Fleet, instances: Sequence[Instance], **kw: Any) -> list[ActionResult]:
    """Drain (unless ``drain_first=False``) and stop each instance; see :func:`run_action`."""
    return run_action(inv, fleet, instances, "stop", **kw)


def start_instances(inv: Inventory, fleet: Fleet, instances: Sequence[Instance], **kw: Any) -> list[ActionResult]:
    """Start each instance and wait for ``/health``; see :func:`run_action`."""
    return run_action(inv, fleet, instances, "start", **kw)


def restart_instances(inv: Inventory, fleet: Fleet, instances: Sequence[Instance], **kw: Any) -> list[ActionResult]:
    """Drain, restart and wait for ``/health`` on each instance; see :func:`run_action`."""
    return run_action(inv, fleet, instances, "restart", **kw)
