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
"""

from __future__ import annotations

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
from clusterctl.gateway import state as gwstate
from clusterctl.gateway.render import ServerState
from clusterctl.gateway.sync import SyncResult, sync_gateway
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.config import load_user_config
from clusterctl.deploy.placement.deployed import wanted_instances
from clusterctl.deploy.state import resolve_state_dir


class GatewayError(ClusterctlError):
    """A gateway host could not apply a change."""


@dataclass
class Hook:
    """Marks instances down/up at the gateway of ``inv``.

    ``fleet_factory`` returns a context-managed fleet holding the gateway
    hosts; ``instances`` the instances the gateway fronts (the inventory's and
    placed replicas).
    """

    inv: Inventory
    state_dir: Path
    instances: Callable[[], dict[str, Instance]]
    fleet_factory: Callable[[], Any]
    on_event: Callable[[str], None] | None = None
    results: list[SyncResult] = field(default_factory=list)

    def _apply(self, names: list[str], down: bool, reason: str) -> None:
        def change(st: gwstate.GatewayState) -> None:
            for name in names:
                if down:
                    st.marked_down[name] = {
                        "reason": reason,
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
        with self.fleet_factory() as fleet:
            result = sync_gateway(
                self.inv, fleet, self.instances(), servers, state_dir=self.state_dir, force=True, on_event=self.on_event
            )
        self.results.append(result)
        failed = [h for h in result.hosts if not h.ok]
        if failed:
            raise GatewayError("gateway: " + "; ".join(f"{h.host}: {h.error}" for h in failed))

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
    command read at the CLI's edge; never read here from the environment).
    """
    if inv.gateway is None:
        return None
    cfg = load_user_config()
    directory = resolve_state_dir(state_dir, cfg)
    gw = inv.gateway

    def instances() -> dict[str, Instance]:
        return wanted_instances(inv, directory)

    def fleet() -> Any:
        hosts = [inv.hosts[h] for h in gw.hosts]
        return make_fleet(hosts, cfg, become_password=become_password)

    return Hook(inv, directory, instances, fleet)


def fleet_hook(inv: Inventory, state_dir: Path, make_fleet: Callable[[Any], Any]) -> Hook | None:
    """The hook over ``make_fleet`` (a command's own fleet factory) and the instances as deployed
    in ``state_dir``; ``None`` without a ``gateway:`` section."""
    gw = inv.gateway
    if gw is None:
        return None
    return Hook(
        inv, state_dir, lambda: wanted_instances(inv, state_dir), lambda: make_fleet([inv.hosts[h] for h in gw.hosts])
    )
