"""Batches of hosts, with Ansible's ``serial`` and ``max_fail_percentage`` semantics (pure).

``serial`` is a count (``2``), a percentage of all hosts (``25%``) or a ramp
(``1,25%,100%``): each value sizes the next batch and the last one repeats
until every host is in a batch.  A percentage is of the whole host list
(rounded down, at least 1), as Ansible's ``pct_to_int`` does.  No serial (or
``0``/``100%``) is one batch of everything.  Batches are over **hosts**, as in
Ansible: all of a host's changed instances go in together.  The first batch
is the canary.

``max_fail_percentage``: a batch fails when its failed hosts are **more
than** that percentage of the batch (exceeded, not reached: with 4 hosts and
25, one failure passes and two fail).  ``0`` (the default) stops at the
first failure.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

from clusterctl.errors import ClusterctlError

T = TypeVar("T")


class SerialError(ClusterctlError):
    """A ``--serial`` or ``--max-fail-percentage`` value that cannot be used."""


def parse_serial(text: str | None) -> list[str]:
    """``"1,25%,100%"`` -> ``["1", "25%", "100%"]``; checks each value."""
    if text is None or not text.strip():
        return []
    values = [v.strip() for v in text.split(",")]
    for v in values:
        num = v[:-1] if v.endswith("%") else v
        if not num.isdigit():
            raise SerialError(f"--serial: {v!r} is not a count or a percentage (e.g. 1,25%,100%)")
        if v.endswith("%") and not 0 < int(num) <= 100:
            raise SerialError(f"--serial: {v!r}: a percentage must be in 1..100")
    return values


def batch_size(value: str, total: int) -> int:
    """One serial value as a host count for a play of ``total`` hosts (Ansible's ``pct_to_int``)."""
    if value.endswith("%"):
        return int(int(value[:-1]) / 100.0 * total) or 1
    return int(value)


def batches(hosts: Sequence[T], serial: Sequence[str]) -> list[list[T]]:
    """Split ``hosts`` (in order) into batches as Ansible's ``_get_serialized_batches``."""
    remaining = list(hosts)
    values = list(serial) or ["0"]
    total = len(remaining)
    out: list[list[T]] = []
    i = 0
    while remaining:
        size = batch_size(values[i], total)
        if size <= 0:
            out.append(remaining)
            break
        out.append(remaining[:size])
        remaining = remaining[size:]
        i = min(i + 1, len(values) - 1)
    return out


def batch_failed(failed: int, size: int, max_fail_percentage: float) -> bool:
    """True when ``failed`` of ``size`` hosts exceeds ``max_fail_percentage`` (percent)."""
    if size <= 0 or failed <= 0:
        return False
    return failed / size * 100.0 > max_fail_percentage
