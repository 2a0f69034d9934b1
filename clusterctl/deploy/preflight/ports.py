"""Who already listens on an instance's port, from ``ss -Htlnp`` on its host.

vLLM binds with ``SO_REUSEADDR`` + ``SO_REUSEPORT`` and would not fail at
bind when another process listens there: clients would be split between the
two.  So the port must be checked before start.  A listener owned by the
instance's own unit (``clusterctl-NAME.service``, a redeploy) is not a
conflict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

_PROC = re.compile(r'\("((?:[^"\\]|\\.)*)",pid=(\d+),fd=\d+\)')
_WILDCARDS = frozenset({"*", "0.0.0.0", "::", "[::]"})


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: local address (without brackets or ``%iface``), port, owners."""

    address: str
    port: int
    pids: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    line: str = ""

    @property
    def wildcard(self) -> bool:
        return self.address in _WILDCARDS


def _split_addr(local: str) -> tuple[str, int] | None:
    host, sep, port = local.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host.split("%", 1)[0]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.startswith("::ffff:"):  # an IPv4-mapped IPv6 address is the IPv4 address
        host = host[len("::ffff:") :]
    return (host or "*"), int(port)


def parse_ss(text: str) -> list[Listener]:
    """Listeners of ``ss -Htlnp`` output (``ss -tlnp`` with its header line works too).

    Columns: State Recv-Q Send-Q Local:Port Peer:Port [users:(("name",pid=N,fd=M),...)].
    The process column is absent for sockets whose owner ss may not see.
    """
    out = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 5 or cols[0] == "State":
            continue
        addr = _split_addr(cols[3])
        if addr is None:
            continue
        procs = _PROC.findall(line)
        out.append(
            Listener(
                address=addr[0],
                port=addr[1],
                pids=tuple(int(p) for _, p in procs),
                names=tuple(n for n, _ in procs),
                line=line.strip(),
            )
        )
    return out


def _overlaps(listener: Listener, bind_host: str | None) -> bool:
    if bind_host is None or bind_host in _WILDCARDS or listener.wildcard:
        return True
    return listener.address == bind_host.strip("[]")


@dataclass
class PortCheck:
    """The verdict on one port: ``conflicts`` lists the foreign listeners (empty: free or ours)."""

    port: int
    own: list[Listener] = field(default_factory=list)
    conflicts: list[Listener] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)  # "name (pid N, unit U)" per foreign owner

    @property
    def free(self) -> bool:
        return not self.conflicts


def check_port(
    listeners: list[Listener],
    port: int,
    own_unit: str,
    pid_units: Mapping[int, str | None],
    bind_host: str | None = None,
) -> PortCheck:
    """Whether ``port`` (bound on ``bind_host``, ``None`` = all addresses) is free for the
    instance whose unit is ``own_unit``.  ``pid_units`` maps a pid to its systemd unit.

    A listener is the instance's own when every owning pid runs in ``own_unit``;
    one whose owner is unknown (ss showed no process) is a conflict.
    """
    res = PortCheck(port=port)
    for li in listeners:
        if li.port != port or not _overlaps(li, bind_host):
            continue
        units = [pid_units.get(p) for p in li.pids]
        if li.pids and all(u == own_unit for u in units):
            res.own.append(li)
            continue
        res.conflicts.append(li)
        owners = [
            f"{name} (pid {pid}" + (f", {unit})" if unit else ")") for name, pid, unit in zip(li.names, li.pids, units)
        ]
        for o in owners or [f"an unidentified process on {li.address}:{li.port}"]:
            if o not in res.owners:  # one process often listens on IPv4 and IPv6
                res.owners.append(o)
    return res
