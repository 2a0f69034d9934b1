"""The drain hook deploy calls (``clusterctl.deploy.rollout.drain.GatewayHook``).

``mark_down(NAME)`` adds NAME to the persisted marked-down set (the gateway
state in the deploy state directory, :mod:`clusterctl.gateway.state`) and
syncs now: it re-renders from the states the last sync decided, with NAME
down, and applies to every gateway host at once (a drain does not wait for
the sync interval).  It returns when every gateway host serves the new
config (nginx reloaded gracefully: streams already on NAME continue), and
raises :class:`GatewayError` when a host could not apply it.  ``mark_up``
removes NAME from the set the same way; NAME then gets traffic again from
the next render (its last known weight, or full weight).

The hook a command run is given (a deploy, a rollback, a restart: :func:`gateway_hook`,
``keep_open``) opens its fleet of the gateway hosts (an SSH connection to each) on its
first change and keeps it for the next ones, and the run closes it at its end
(:meth:`Hook.close`, or the hook as a context manager); other hooks (:func:`fleet_hook`)
open and close a fleet per change.  A fleet left idle for ``idle_s`` seconds is
closed and opened again on the next change; a change whose gateway host answered
with an SSH error (a connection that broke while held) is applied once more over
a new connection.  Changes asked for at the same time by several threads (the
drains of one batch run in parallel) are applied together: a change waiting
while another applies goes with every other change waiting, in one render and
one reload (``timings`` records each apply).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.deploy.rollout.drain import DRAIN_REASON
from clusterctl.deploy.units.pdrouter import gateway_servers
from clusterctl.deploy.state import who_am_i
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.factory import make_fleet
from clusterctl.fleet.fleet import Fleet
from clusterctl.gateway import state as gwstate
from clusterctl.gateway.render import ServerState
from clusterctl.gateway.sync import SyncResult, sync_gateway
from clusterctl.inventory.model import Host, Instance, Inventory
from clusterctl.config import load_user_config
from clusterctl.deploy.placement.deployed import wanted_instances
from clusterctl.deploy.state import resolve_state_dir


class GatewayError(ClusterctlError):
    """A gateway host could not apply a change."""


#: Seconds the hook's gateway fleet may sit unused before it is closed (opened again on next use):
#: a deploy's batches mark down and up minutes apart; an idle SSH connection kept longer may have
#: been cut by a firewall or the host's sshd meanwhile.
IDLE_CLOSE_S = 300.0
#: The kinds of a gateway host's failed row that mean the SSH connection broke (a protocol error, a
#: closed channel): the change is applied once more over a new connection.
RECONNECT_KINDS = frozenset({"error"})


@dataclass
class HookTiming:
    """One apply at the gateway: ``op`` (``down``, ``up`` or ``both``), the instances it changed,
    ``seconds`` it took (render, SSH, nginx reload on every gateway host), whether it opened the
    fleet (``connected``), whether it was applied again over a new connection (``reconnected``) and
    whether it reached the gateway hosts at all (``applied``: False when the config it rendered was
    the one they serve, e.g. a drain's mark-down after its batch's)."""

    op: str
    names: list[str]
    seconds: float
    connected: bool
    reconnected: bool = False
    applied: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "names": self.names,
            "seconds": round(self.seconds, 3),
            "connected": self.connected,
            "reconnected": self.reconnected,
            "applied": self.applied,
        }


@dataclass
class _Change:
    names: list[str]
    down: bool
    reason: str
    done: bool = False
    error: GatewayError | None = None


class _OnUse:
    """The hook's fleet, reached on first use: a change the gateway already serves (a drain's
    mark-down after its batch's) renders the same config and reaches no host."""

    def __init__(self, hook: "Hook") -> None:
        self._hook = hook
        self._fleet: Any = None
        self.used = False
        self.opened = False  # the fleet was opened for this change (not one held from before)

    def __getattr__(self, name: str) -> Any:
        if self._fleet is None:
            self._fleet, self.opened = self._hook._fleet_now()
            self.used = True
        return getattr(self._fleet, name)


@dataclass
class Hook:
    """Marks instances down/up at the gateway of ``inv``.

    ``fleet_factory`` returns a context-managed fleet holding the gateway
    hosts, entered on the first change; ``keep_open``: kept until :meth:`close`
    (or ``idle_s`` seconds without use), else closed after each change; ``instances`` the instances the gateway
    fronts (the inventory's and placed replicas).  ``clock``: seconds, monotonic.
    """

    inv: Inventory
    state_dir: Path
    instances: Callable[[], dict[str, Instance]]
    fleet_factory: Callable[[], Fleet]
    on_event: Callable[[str], None] | None = None
    results: list[SyncResult] = field(default_factory=list)
    keep_open: bool = False
    idle_s: float = IDLE_CLOSE_S
    clock: Callable[[], float] = time.monotonic
    #: every apply, in order (what a deploy reports as its mark-down and mark-up times)
    timings: list[HookTiming] = field(default_factory=list)
    _fleet: Fleet | None = field(default=None, init=False, repr=False)
    _fleet_cm: Fleet | None = field(default=None, init=False, repr=False)
    _used_at: float = field(default=0.0, init=False, repr=False)
    _queue: list[_Change] = field(default_factory=list, init=False, repr=False)
    _queue_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _apply_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __enter__(self) -> "Hook":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the gateway fleet if one is open (idempotent; the next change opens a new one)."""
        cm, self._fleet_cm, self._fleet = self._fleet_cm, None, None
        if cm is not None:
            cm.__exit__(None, None, None)

    def _fleet_now(self) -> tuple[Fleet, bool]:
        """The open fleet, or a new one (``True``) when none is open or it sat idle past ``idle_s``."""
        if self._fleet_cm is not None and self.clock() - self._used_at > self.idle_s:
            self.close()
        if self._fleet_cm is not None and self._fleet is not None:
            return self._fleet, False
        cm = self.fleet_factory()
        fleet = cm.__enter__()
        self._fleet, self._fleet_cm = fleet, cm
        return fleet, True

    def _apply(self, names: list[str], down: bool, reason: str) -> None:
        mine = _Change(list(names), down, reason)
        with self._queue_lock:
            self._queue.append(mine)
        with self._apply_lock:
            if not mine.done:  # else applied with another thread's change while this one waited
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                error: GatewayError | None = None
                try:
                    self._apply_now(batch)
                except GatewayError as e:
                    error = e
                except BaseException as e:  # raised here as it is; the changes it carried failed too
                    for c in batch:
                        c.done, c.error = True, GatewayError(f"gateway: {type(e).__name__}: {e}")
                    mine.error = None
                    raise
                for c in batch:
                    c.done, c.error = True, error
        if mine.error is not None:
            raise mine.error

    def _apply_now(self, batch: list[_Change]) -> None:
        """One state update, render and sync for every change in ``batch`` (applied in order)."""
        t0 = self.clock()

        def change(st: gwstate.GatewayState) -> None:
            for c in batch:
                for name in c.names:
                    if c.down:
                        st.marked_down[name] = {
                            "reason": c.reason,
                            "by": who_am_i(),
                            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        }
                    else:
                        st.marked_down.pop(name, None)

        st = gwstate.update(self.state_dir, change)
        servers = dict(st.servers)
        # the gateway's servers: the instances, and each ready pool's router (router-P: drained as one)
        for n in {**self.instances(), **gateway_servers(self.inv, self.instances())}:
            if n in st.marked_down:
                servers[n] = ServerState(True, 1, f"marked down: {st.marked_down[n].get('reason', '')}".rstrip(": "))
            elif servers.get(n, ServerState()).reason.startswith("marked down"):
                servers[n] = ServerState()
        fleet = _OnUse(self)
        result = self._sync(fleet, servers)
        connected, reconnected = fleet.opened, False
        broken = [h for h in result.hosts if not h.ok and h.kind in RECONNECT_KINDS]
        if broken and fleet.used and not fleet.opened:  # a held connection broke: once more over a new one
            self.close()
            result = self._sync(_OnUse(self), servers)
            reconnected = True
        self._used_at = self.clock()
        if not self.keep_open:
            self.close()
        self.results.append(result)
        ops = {c.down for c in batch}
        self.timings.append(
            HookTiming(
                "both" if len(ops) > 1 else ("down" if batch[0].down else "up"),
                list(dict.fromkeys(n for c in batch for n in c.names)),
                self._used_at - t0,
                connected,
                reconnected,
                bool(result.hosts),
            )
        )
        failed = [h for h in result.hosts if not h.ok]
        if failed:
            raise GatewayError("gateway: " + "; ".join(f"{h.host}: {h.error}" for h in failed))

    def _sync(self, fleet: Any, servers: dict[str, ServerState]) -> SyncResult:
        return sync_gateway(
            self.inv, fleet, self.instances(), servers, state_dir=self.state_dir, force=True, on_event=self.on_event
        )

    def mark_down(self, instance_name: str, reason: str = DRAIN_REASON) -> None:
        self._apply([instance_name], True, reason)

    def mark_down_many(self, names: list[str], reason: str = DRAIN_REASON) -> None:
        """Mark every one of ``names`` down with one gateway sync (autoscale: replicas not yet gated)."""
        self._apply(list(names), True, reason)

    def mark_up(self, instance_name: str) -> None:
        self._apply([instance_name], False, "")

    def mark_up_many(self, names: list[str]) -> None:
        """Mark every one of ``names`` up with one gateway sync."""
        self._apply(list(names), False, "")

    def marked(self) -> dict[str, str]:
        """Instance -> reason, for every instance marked down now."""
        return {n: str(m.get("reason", "")) for n, m in gwstate.load(self.state_dir).marked_down.items()}


def gateway_hook(
    inv: Inventory, state_dir: str | Path | None = None, *, become_password: str | None = None
) -> Hook | None:
    """The hook for ``inv`` (``None`` without a ``gateway:`` section); the workflow layer
    (``ops.deploy.drain_hook``) builds it and gives it to deploy, rollback and start/stop/restart.

    Uses ``state_dir`` (the command's deploy state directory), else the user
    config's (``$CLUSTERCTL_STATE_DIR`` first), and an SSH fleet of the gateway
    hosts with their inventory settings and ``become_password`` (the sudo password the
    command read at the CLI's edge; never read here from the environment).  The hook keeps
    its SSH connections to the gateway hosts from its first change on: the caller closes it
    at the run's end (:meth:`Hook.close`; the workflows of ``ops.deploy`` do).
    """
    if inv.gateway is None:
        return None
    cfg = load_user_config()
    directory = resolve_state_dir(state_dir, cfg)
    gw = inv.gateway

    def instances() -> dict[str, Instance]:
        return wanted_instances(inv, directory)

    def fleet() -> Fleet:
        hosts = [inv.hosts[h] for h in gw.hosts]
        return make_fleet(hosts, cfg, become_password=become_password)

    return Hook(inv, directory, instances, fleet, keep_open=True)


def fleet_hook(inv: Inventory, state_dir: Path, make_fleet: Callable[[list[Host]], Fleet]) -> Hook | None:
    """The hook over ``make_fleet`` (a command's own fleet factory) and the instances as deployed
    in ``state_dir``; ``None`` without a ``gateway:`` section."""
    gw = inv.gateway
    if gw is None:
        return None
    return Hook(
        inv, state_dir, lambda: wanted_instances(inv, state_dir), lambda: make_fleet([inv.hosts[h] for h in gw.hosts])
    )
