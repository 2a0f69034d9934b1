"""One result row per host, and the grouping of identical rows.

Every host a :class:`~clusterctl.fleet.fleet.Fleet` was asked to reach gets
exactly one :class:`HostResult`, whatever happened to it: a host that could
not be reached, refused our key or never answered is a row with a status, not
an exception.  :meth:`RunResults.gather` folds hosts with identical results
into one group named by a node set (``gpu[01-04,07]``), as ClusterShell's
``clush -b`` does, so 1000 identical answers read as one line.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Iterable, Iterator

from clusterctl.inventory.nodeset import fold as _fold


class HostStatus(str, Enum):
    """What happened on one host.

    ``ok``: the command ran and exited 0.  ``failed``: it ran and exited
    non-zero (``rc`` holds the code).  ``timeout``: the connection or the
    command did not finish within its timeout or the run's deadline.
    ``unreachable``: no TCP connection (refused, no route, TCP timeout).
    ``auth_failed``: the server refused every key.  ``hostkey_mismatch``:
    the host key differs from known_hosts (or is unknown under the strict
    policy).  ``no_python``: the node has no ``python3``.  ``error``:
    anything else (an SSH protocol error, a closed channel).
    """

    OK = "ok"
    FAILED = "failed"
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    AUTH_FAILED = "auth_failed"
    HOSTKEY_MISMATCH = "hostkey_mismatch"
    NO_PYTHON = "no_python"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


#: The exit code a non-command status stands for in ``worst_rc`` (as ssh(1)
#: returns 255 for connection problems and timeout(1) returns 124).
STATUS_RC: dict[HostStatus, int] = {
    HostStatus.TIMEOUT: 124,
    HostStatus.NO_PYTHON: 127,
    HostStatus.UNREACHABLE: 255,
    HostStatus.AUTH_FAILED: 255,
    HostStatus.HOSTKEY_MISMATCH: 255,
    HostStatus.ERROR: 255,
}

#: Statuses meaning "we never got to run the command on that host".
CONNECT_FAILURES = frozenset({HostStatus.UNREACHABLE, HostStatus.AUTH_FAILED, HostStatus.HOSTKEY_MISMATCH})


@dataclass
class HostResult:
    """The outcome of one command on one host.

    ``rc`` is the remote exit status (``None`` when the command never ran or
    never finished; a command killed by a signal reports 128 + signal as a
    shell would, or -1 when the server sent no status).  ``stdout`` and
    ``stderr`` are decoded as UTF-8 with invalid bytes replaced.  ``started``
    is a Unix timestamp (seconds), ``duration_s`` covers connect (when this
    run opened the connection) plus the command.  ``error`` is a one-line
    human explanation for every status except ``ok`` and ``failed``.
    """

    host: str
    status: HostStatus
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    started: float = 0.0
    duration_s: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is HostStatus.OK

    @property
    def effective_rc(self) -> int:
        """The exit code this row contributes to ``worst_rc`` (0..255)."""
        if self.status in (HostStatus.OK, HostStatus.FAILED):
            return self.rc if self.rc is not None and 0 <= self.rc <= 255 else 255
        return STATUS_RC[self.status]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d


@dataclass
class Group:
    """Hosts whose results are identical: same status, rc, output and error."""

    status: HostStatus
    rc: int | None
    stdout: str
    stderr: str
    error: str | None
    hosts: list[str] = field(default_factory=list)

    @property
    def nodeset(self) -> str:
        return fold(self.hosts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodeset,
            "count": len(self.hosts),
            "status": self.status.value,
            "rc": self.rc,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "error": self.error,
            "hosts": list(self.hosts),
        }


class RunResults:
    """All rows of one :meth:`Fleet.run`, in the order the hosts were given."""

    def __init__(self, results: Iterable[HostResult] = (), *, duration_s: float = 0.0):
        self._rows: dict[str, HostResult] = {r.host: r for r in results}
        self.duration_s = duration_s

    def add(self, result: HostResult) -> None:
        self._rows[result.host] = result

    def __getitem__(self, host: str) -> HostResult:
        return self._rows[host]

    def __contains__(self, host: object) -> bool:
        return host in self._rows

    def __iter__(self) -> Iterator[HostResult]:
        return iter(self._rows.values())

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def hosts(self) -> list[str]:
        return list(self._rows)

    def by_status(self) -> dict[HostStatus, list[str]]:
        out: dict[HostStatus, list[str]] = {}
        for r in self:
            out.setdefault(r.status, []).append(r.host)
        return out

    def gather(self) -> list[Group]:
        """Group identical results; ok groups first, then by size (largest first)."""
        groups: dict[tuple[Any, ...], Group] = {}
        for r in self:
            key = (r.status, r.rc, r.stdout, r.stderr, r.error)
            g = groups.get(key)
            if g is None:
                g = groups[key] = Group(r.status, r.rc, r.stdout, r.stderr, r.error)
            g.hosts.append(r.host)
        return sorted(groups.values(), key=lambda g: (not g.status is HostStatus.OK, -len(g.hosts)))

    def worst_rc(self) -> int:
        """The largest exit code over all hosts (0 when there are none).

        ``ok``/``failed`` contribute their remote rc; ``timeout`` 124;
        ``no_python`` 127; unreachable, auth_failed, hostkey_mismatch and
        error 255 (as ssh(1)).
        """
        return max((r.effective_rc for r in self), default=0)

    def failed_hosts(self) -> list[str]:
        """Hosts whose status is not ``ok``, in the given order."""
        return [r.host for r in self if not r.ok]

    def all_ok(self) -> bool:
        return all(r.ok for r in self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "duration_s": round(self.duration_s, 3),
            "counts": {s.value: len(h) for s, h in self.by_status().items()},
            "worst_rc": self.worst_rc(),
            "groups": [g.to_dict() for g in self.gather()],
            "hosts": [r.to_dict() for r in self],
        }


_TRAILING_NUM = re.compile(r"^(.*?)(\d+)$")


def _fold_fallback(names: Iterable[str]) -> str:
    """Fold names whose last component is a number: ``a1 a2 a3 b`` -> ``a[1-3],b``.

    Used only until ``clusterctl.inventory.nodeset.fold`` is available.
    """
    by_prefix: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for name in dict.fromkeys(names):
        m = _TRAILING_NUM.match(name)
        if not m:
            plain.append(name)
            order.append(name)
            continue
        digits = m.group(2)
        width = len(digits) if digits.startswith("0") else 0
        key = (m.group(1), width)
        if key not in by_prefix:
            by_prefix[key] = []
            order.append(key)
        by_prefix[key].append(int(digits))
    parts: list[str] = []
    for item in order:
        if isinstance(item, str):
            parts.append(item)
            continue
        prefix, width = item
        nums = sorted(set(by_prefix[item]))
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        ranges: list[str] = []
        start = prev = nums[0]
        for n in nums[1:] + [None]:  # type: ignore[list-item]
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)


def fold(names: Iterable[str]) -> str:
    """Fold host names into node-set notation (``gpu[01-04,07]``)."""
    return _fold(list(names))
