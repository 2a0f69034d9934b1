"""Run the collector on every host of a Fleet: one round trip per host once it is cached there.

:func:`collect_facts` runs the payload (``clusterctl.probe.payload``), shipped
on stdin only to hosts that have no verified copy in their cache
(``clusterctl.fleet.cached``), and returns one :class:`FactsResult` per host, always: a host
that could not be reached, has no python3 (or one older than 3.8), timed out
or printed something that is not a facts document gets status ``unknown`` and
a reason, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from clusterctl.errors import ProbeError
from clusterctl.probe.facts import Facts, parse_facts
from clusterctl.fleet.cached import run_cached
from clusterctl.fleet.fleet import Fleet
from clusterctl.fleet.results import HostResult
from clusterctl.probe.payload import RC_PYTHON_TOO_OLD, payload, probe_args

#: Seconds a whole probe may take on one host (the collector itself bounds each
#: NVML call, command and statvfs, see collector.py).
DEFAULT_TIMEOUT_S = 90.0

OK = "ok"
UNKNOWN = "unknown"


@dataclass
class FactsResult:
    """The probe's outcome on one host.

    ``status``: ``ok`` (``facts`` is set) or ``unknown`` (``reason`` says why the
    facts could not be had).  ``fleet_status`` is the fleet's row status
    (``ok``, ``unreachable``, ``no_python``...), ``duration_s`` the round trip.
    """

    host: str
    status: str
    facts: Facts | None = None
    reason: str | None = None
    fleet_status: str = "ok"
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the facts document itself, or ``{"status", "reason"}``."""
        if self.facts is not None:
            return self.facts.raw
        return {"status": self.status, "reason": self.reason, "fleet_status": self.fleet_status}


def _status(row: HostResult) -> str:
    return str(getattr(row.status, "value", row.status))


def interpret(row: HostResult) -> FactsResult:
    """Turn one fleet row (a ``HostResult``) into a :class:`FactsResult`."""
    status = _status(row)
    result = partial(FactsResult, row.host, fleet_status=status, duration_s=row.duration_s)
    if status == "no_python":
        return result(
            status=UNKNOWN, reason="python3 is not installed on the node (the probe needs Python 3.8 or newer)"
        )
    if status not in ("ok", "failed"):
        return result(status=UNKNOWN, reason=row.error or status)
    if row.rc == RC_PYTHON_TOO_OLD:
        return result(status=UNKNOWN, reason=_last_line(row.stderr) or "python3 is older than 3.8")
    if row.rc != 0:
        return result(
            status=UNKNOWN,
            reason=f"the probe exited with rc {row.rc}: {_last_line(row.stderr) or 'no message'}",
        )
    try:
        facts = parse_facts(_document_text(row.stdout), origin=f"{row.host}: probe output")
    except ProbeError as e:
        return result(status=UNKNOWN, reason=str(e))
    return result(status=OK, facts=facts)


def _document_text(stdout: str) -> str:
    """The collector prints its document as the last line; a login script that
    echoes a banner on stdout (a ~/.bashrc) must not hide it."""
    lines = [x for x in (stdout or "").splitlines() if x.strip()]
    return lines[-1] if lines and lines[-1].lstrip().startswith("{") else stdout


def _last_line(text: str) -> str:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1] if lines else ""


def collect_facts(
    fleet: Fleet,
    *,
    kernel_log_cursor: str | dict[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    nvml_timeout: float | None = None,
    sudo: bool = False,
    on_result: Callable[[FactsResult], None] | None = None,
    counter_interval: float | None = None,
    raw_outputs: bool = False,
    cache: bool | None = None,
) -> dict[str, FactsResult]:
    """Probe every host of ``fleet``; one :class:`FactsResult` per host, in fleet order.

    ``kernel_log_cursor``: one cursor for every host or a mapping host ->
    cursor (from a previous run's ``facts.kernel_log.cursor``).  ``timeout``:
    seconds for one host's probe.  ``nvml_timeout``: seconds one NVML call may
    take on the node.  ``sudo``: run the collector as root where the login user
    is not (needed to read a root-only kernel log).  ``counter_interval``: seconds
    between two samples of the RDMA NICs' counters, taken on the node
    (``nics[].samples``); rate-based checks (``doctor``'s RoCE checks) need it.
    ``raw_outputs``: the document also carries ``raw_outputs``, every command the
    collector ran with its verbatim output (``clusterctl collect`` saves them).
    ``cache``: ship the payload only to hosts without a verified copy
    (``clusterctl.fleet.cached``); ``None`` follows ``CLUSTERCTL_NODE_CACHE``.
    """
    data = payload().data
    cursors = kernel_log_cursor if isinstance(kernel_log_cursor, dict) else None
    nvml_budget = max(1.0, timeout * 0.6)
    common = {
        "nvml_timeout": nvml_timeout,
        "nvml_budget": nvml_budget,
        "counter_interval": counter_interval,
        "raw_outputs": raw_outputs,
    }
    args: list[str] | dict[str, list[str]]
    if cursors is None:
        args = probe_args(kernel_log_cursor=kernel_log_cursor, **common)  # type: ignore[arg-type]
    else:
        args = {
            h.name: probe_args(kernel_log_cursor=cursors.get(h.name), **common)  # type: ignore[arg-type]
            for h in getattr(fleet, "hosts")
        }

    seen: dict[str, FactsResult] = {}

    def each(row: HostResult) -> None:
        seen[row.host] = interpret(row)
        if on_result:
            on_result(seen[row.host])

    results = run_cached(
        fleet, data, args, cache=cache, sudo=sudo, timeout=timeout, on_result=each, require_python=True
    )
    return {row.host: seen.get(row.host) or interpret(row) for row in results}
