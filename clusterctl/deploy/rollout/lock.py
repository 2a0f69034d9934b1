"""The deploy lock on every target host (``spec.LOCK_PATH``), so operators exclude each other.

The node creates the lock file with ``O_EXCL`` (one winner) holding the
holder (``user@control-host``), the control process's pid, the run id and
the time (UTC).  A lock held by another run is refused with its details.  A
lock older than ``ttl_s`` (default 2 h: a deploy that crashed without
releasing) or any lock with ``break_lock`` is replaced, and reported as
recovered.  :func:`held` releases every lock it took on exit, also on errors
and Ctrl-C (with a fresh fleet when the interrupted one was closed).
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from clusterctl.deploy import remote
from clusterctl.deploy.state import utc_now, who_am_i
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.fleet import Fleet

#: Seconds after which a lock is stale and taken over.
DEFAULT_TTL_S = 7200.0


class LockHeld(ClusterctlError):
    """Some target host's deploy lock belongs to another run (``held``: host -> lock data)."""

    def __init__(self, held: dict[str, dict[str, Any]]):
        self.held = held
        parts = [
            f"{h}: held by {d.get('holder')} (pid {d.get('pid')}, run {d.get('run_id')}) since "
            f"{d.get('time')}, {d.get('age_s')} s ago"
            for h, d in sorted(held.items())
        ]
        super().__init__(
            "deploy lock not acquired (no host was changed); "
            + "; ".join(parts)
            + ". Wait for that deploy, or use --break-lock if it is dead."
        )


@dataclass
class Acquired:
    """``locked``: hosts we hold; ``recovered``: host -> the stale or broken lock we replaced;
    ``failed``: host -> why it could not be locked (unreachable...): those are not deployed."""

    locked: list[str]
    recovered: dict[str, dict[str, Any]]
    failed: dict[str, str]


@dataclass
class LockInfo:
    """This run's lock: what the lock file holds."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    holder: str = field(default_factory=who_am_i)
    pid: int = field(default_factory=os.getpid)
    time: str = field(default_factory=utc_now)

    def to_dict(self) -> dict[str, Any]:
        return {"holder": self.holder, "pid": self.pid, "run_id": self.run_id, "time": self.time}


def acquire(
    fleet: Fleet, hosts: list[str], me: LockInfo, *, ttl_s: float = DEFAULT_TTL_S, break_lock: bool = False
) -> Acquired:
    """Take the lock on every reachable host; when another run holds any, raise
    :class:`LockHeld` after releasing what was taken (all or nothing)."""
    replies = remote.run_job(
        fleet, {"op": "lock", "lock": me.to_dict(), "ttl_s": ttl_s, "break": break_lock}, hosts=hosts, timeout=60
    )
    held = {h: r.data.get("lock") or {} for h, r in replies.items() if not r.ok and r.kind == "locked"}
    ok = [h for h in hosts if replies[h].ok]
    if held:
        release(fleet, ok, me.run_id)
        raise LockHeld(held)
    return Acquired(
        ok,
        {h: replies[h].data["recovered"] for h in ok if replies[h].data.get("recovered")},
        {h: r.error or "failed" for h, r in replies.items() if not r.ok},
    )


def release(fleet: Fleet, hosts: list[str], run_id: str, audit: dict[str, Any] | None = None) -> dict[str, str]:
    """Remove our lock on ``hosts`` (only if it is still ours), appending ``audit`` there first.

    Returns host -> error for hosts where that failed.
    """
    if not hosts:
        return {}
    replies = remote.run_job(fleet, {"op": "unlock", "run_id": run_id, "audit": audit}, hosts=hosts, timeout=60)
    return {h: r.error or "failed" for h, r in replies.items() if not r.ok}


@contextmanager
def held(
    fleet: Fleet,
    hosts: list[str],
    me: LockInfo,
    *,
    ttl_s: float = DEFAULT_TTL_S,
    break_lock: bool = False,
    fresh_fleet: Callable[[], Fleet] | None = None,
    audit: Callable[[], dict[str, Any] | None] = lambda: None,
) -> Iterator[Acquired]:
    """``with held(...) as got:``: the lock on ``hosts`` (``got.locked``) for the block.

    On exit (normal, error or Ctrl-C) the lock is released and ``audit()``'s
    record appended on each host.  When the fleet was closed by Ctrl-C,
    ``fresh_fleet()`` gives one to release with.
    """
    got = acquire(fleet, hosts, me, ttl_s=ttl_s, break_lock=break_lock)
    try:
        yield got
    finally:
        release_anyway(fleet, got.locked, me.run_id, audit(), fresh_fleet)


def release_anyway(
    fleet: Fleet,
    hosts: list[str],
    run_id: str,
    audit: dict[str, Any] | None,
    fresh_fleet: Callable[[], Fleet] | None = None,
) -> dict[str, str]:
    """:func:`release`, with ``fresh_fleet()`` when ``fleet`` can no longer run (closed by Ctrl-C)."""
    try:
        return release(fleet, hosts, run_id, audit)
    except Exception:
        if fresh_fleet is None:
            raise
        with fresh_fleet() as f2:
            return release(f2, hosts, run_id, audit)
