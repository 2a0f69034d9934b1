"""The one way to build a :class:`~clusterctl.fleet.fleet.Fleet` from the inventory and the user's settings.

Every command (and the gateway's drain hook) builds its fleets here, so the
rules hold everywhere: a value given on the command line beats the user's
configuration file, and a ``connect_timeout`` given on the command line beats
each host's own ``ssh.connect_timeout`` — through copies of the hosts, never
by changing the inventory's ``Host`` objects that other code still reads.
The become (sudo) password is an argument: it never travels through the
environment, argv or a log.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from clusterctl.config import UserConfig
from clusterctl.fleet.fleet import Fleet
from clusterctl.fleet.transport import Transport
from clusterctl.inventory.model import Host

#: Where a command finds the sudo password when it is not prompted for (``-K``); read by the CLI
#: (and the gateway's drain hook), never written, never put on a command line.
BECOME_PASSWORD_ENV = "CLUSTERCTL_BECOME_PASSWORD"

#: A command's fleet factory: the hosts to reach -> a fleet over them (the deploy engine takes one).
FleetFactory = Callable[[Iterable[Host]], Fleet]


def make_fleet(
    hosts: Iterable[Host],
    cfg: UserConfig,
    *,
    fanout: int | None = None,
    connect_timeout: float | None = None,
    command_timeout: float | None = None,
    deadline: float | None = None,
    become_password: str | None = None,
    host_key_policy: str | None = None,
    transport: Transport | None = None,
) -> Fleet:
    """A fleet over ``hosts``; ``None`` options fall back to ``cfg`` (``fanout``, ``connect_timeout``,
    ``command_timeout``); ``transport`` defaults to paramiko with ``host_key_policy``."""
    hs = list(hosts)
    if connect_timeout:  # the command line beats the inventory (on copies of the hosts)
        hs = [dataclasses.replace(h, ssh=dataclasses.replace(h.ssh, connect_timeout=connect_timeout)) for h in hs]
    if transport is None:
        # paramiko takes ~0.3 s to import: only commands that reach hosts pay for it.
        from clusterctl.fleet.ssh import ParamikoTransport

        transport = ParamikoTransport(host_key_policy=host_key_policy)
    return Fleet(
        hs,
        fanout=fanout or cfg.fanout,
        connect_timeout=connect_timeout or cfg.connect_timeout,
        command_timeout=cfg.command_timeout if command_timeout is None else command_timeout,
        deadline=deadline,
        become_password=become_password,
        transport=transport,
    )


def fleet_factory(
    cfg: UserConfig,
    *,
    fanout: int | None = None,
    connect_timeout: float | None = None,
    command_timeout: float | None = None,
    deadline: float | None = None,
    become_password: str | None = None,
    host_key_policy: str | None = None,
) -> FleetFactory:
    """:func:`make_fleet` with these options fixed, for code that builds fleets over host subsets."""

    def make(hosts: Iterable[Host]) -> Fleet:
        return make_fleet(
            hosts,
            cfg,
            fanout=fanout,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
            deadline=deadline,
            become_password=become_password,
            host_key_policy=host_key_policy,
        )

    return make
