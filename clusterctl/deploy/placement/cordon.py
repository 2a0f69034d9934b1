"""Cordons: an operator's "place nothing new here" on a host or one GPU.

Placement avoids cordoned hosts and GPUs for new replicas; a replica already
there stays until it is moved (``reschedule``, as failover does).  Only
:func:`uncordon`, run for an operator, removes a cordon: nothing automatic
ever uncordons what an operator cordoned.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.deploy.state import Cordon, DeployState, StateStore, cordon_key, utc_now, who_am_i
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.fields import suggest
from clusterctl.inventory.model import Inventory


class CordonError(ClusterctlError):
    """A cordon target that does not name a host or GPU of the inventory."""


@dataclass(frozen=True)
class Target:
    """``HOST`` (``gpu`` None) or ``HOST:GPU``."""

    host: str
    gpu: int | None = None

    @property
    def key(self) -> str:
        return cordon_key(self.host, self.gpu)


def parse_target(inv: Inventory, text: str) -> Target:
    """``HOST`` or ``HOST:GPU`` checked against the inventory; :class:`CordonError` naming what is wrong."""
    host, sep, gpu = text.strip().partition(":")
    if host not in inv.hosts:
        raise CordonError(
            f"{text!r}: host {host!r} is not in the inventory {inv.path}" + suggest(host, list(inv.hosts))
        )
    if not sep:
        return Target(host)
    count = inv.hosts[host].gpus.count
    if not gpu.isdigit():
        raise CordonError(f"{text!r}: {gpu!r} is not a GPU index (expected {host}:N)")
    if int(gpu) >= count:
        have = f"GPUs 0-{count - 1}" if count else "no GPUs"
        raise CordonError(f"{text!r}: {host} has {have} (inventory {inv.path})")
    return Target(host, int(gpu))


def replicas_on(state: DeployState, target: Target) -> list[str]:
    """Replica names whose recorded placement uses ``target`` (the host, or that GPU)."""
    return [
        name
        for reps in state.placements.values()
        for name, p in reps.items()
        if any(h == target.host and (target.gpu is None or target.gpu in gpus) for h, gpus in p.stages)
    ]


def cordon(store: StateStore, target: Target, reason: str, who: str | None = None) -> tuple[Cordon, bool, list[str]]:
    """Record a cordon (replacing the reason of an existing one).

    Returns the cordon, whether it is new, and the replicas that stay on the target.
    """
    entry = Cordon(reason=reason, who=who or who_am_i(), when=utc_now())
    with store.update() as st:
        fresh = target.key not in st.cordons
        st.cordons[target.key] = entry
        staying = replicas_on(st, target)
    return entry, fresh, staying


def uncordon(store: StateStore, target: Target) -> tuple[Cordon | None, list[str]]:
    """Remove the cordon on exactly ``target``.

    Returns the removed cordon (``None`` when there was none) and the keys of
    cordons that still apply to it (the host's own, or its GPUs' when
    uncordoning a host).
    """
    with store.update() as st:
        removed = st.cordons.pop(target.key, None)
        if target.gpu is None:
            left = [k for k in st.cordons if k.startswith(f"{target.host}:")]
        else:
            left = [target.host] if target.host in st.cordons else []
    return removed, left
