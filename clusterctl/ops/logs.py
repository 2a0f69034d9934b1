"""The logs workflow: ``logs TARGET...``, the journal of instances or the kernel log of hosts.

:func:`options` checks ``--since`` and ``--grep`` before the inventory is read; a
:class:`LogsRequest` (the inventory loaded, the deploy state directory, the hosts of
``@failed``, the targets) goes to :func:`plan`, which says what to read on which host
(:class:`LogsPlan`); :func:`run` reads it over a fleet the caller built over ``LogsPlan.hosts``
(with ``LogsPlan.fanout`` when it is set: a follow holds one connection per host), handing each
line, each host that could not be read and each note to callbacks, in time order without
``follow``, as they are written with it.  Problems with the targets or the options are
:class:`~clusterctl.errors.ClusterctlError`; a host that cannot be read is a callback and the
others go on.  The reading itself is :mod:`clusterctl.fleet.logs`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from clusterctl.deploy.placement.deployed import wanted_instances
from clusterctl.deploy.spec import unit_name
from clusterctl.deploy.status.instances import match_instances
from clusterctl.errors import ClusterctlError
from clusterctl.fleet import logs as core
from clusterctl.fleet.fleet import Fleet, max_fanout_for_fds, raise_nofile_limit
from clusterctl.fleet.logs import HostQuery, LogLine
from clusterctl.fleet.results import HostResult
from clusterctl.inventory.model import Inventory
from clusterctl.inventory.select import select_hosts


@dataclass(frozen=True)
class LogsOptions:
    """What to read: ``follow`` (stream until Ctrl-C or ``duration`` seconds), ``since`` (in
    journalctl's syntax, checked), ``grep`` (compiled; None: every line), ``lines`` per host (None:
    200, 10 with ``follow``, all with ``since``), ``kernel``: the kernel log of the instances'
    hosts too."""

    follow: bool = False
    since: Optional[str] = None
    grep: Optional[re.Pattern[str]] = None
    lines: Optional[int] = None
    duration: Optional[float] = None
    kernel: bool = False

    @property
    def line_count(self) -> Optional[int]:
        """Lines per host as read: the given count, else 10 with ``follow``, all with ``since``, 200."""
        if self.lines is not None:
            return self.lines
        return 10 if self.follow else (None if self.since else 200)


def options(
    *,
    follow: bool = False,
    since: Optional[str] = None,
    grep: Optional[str] = None,
    lines: Optional[int] = None,
    duration: Optional[float] = None,
    kernel: bool = False,
) -> LogsOptions:
    """The options checked: ``since`` (``90s``, ``10m``, ``2h``, ``1d``, a date) and ``grep`` (a
    Python regular expression); a ClusterctlError naming the bad one."""
    return LogsOptions(
        follow=follow,
        since=core.parse_since(since) if since else None,
        grep=core.compile_grep(grep),
        lines=lines,
        duration=duration,
        kernel=kernel,
    )


@dataclass(frozen=True)
class LogsRequest:
    """``targets``: instance names or globs (their units' journals on every host of their TP
    group), else host patterns (those hosts' kernel log); ``state_dir``: the deploy state
    directory (placed replicas); ``failed``: the hosts ``@failed`` names (None: no run recorded)."""

    inventory: Inventory
    state_dir: Path
    targets: Sequence[str]
    options: LogsOptions
    failed: Optional[list[str]] = None


@dataclass(frozen=True)
class LogsPlan:
    """Host -> what to read there; ``fanout``: the fleet's fan-out when the plan needs one (a
    follow: every host at once), else None (the caller's)."""

    queries: dict[str, HostQuery]
    options: LogsOptions
    fanout: Optional[int] = None

    @property
    def hosts(self) -> list[str]:
        return sorted(self.queries)

    @property
    def label_width(self) -> int:
        """The longest ``host/source`` label of the lines to come."""
        return max(
            len(f"{h}/{s}")
            for h, q in self.queries.items()
            for s in list(q.units.values()) + (["kernel"] if q.kernel else [])
        )


def plan(request: LogsRequest) -> LogsPlan:
    """What to read on which host; a ClusterctlError when a target names nothing, nothing is
    placed, or a follow needs more connections than the open-file limit allows."""
    inv, opts = request.inventory, request.options
    wanted = wanted_instances(inv, request.state_dir)
    units: dict[str, dict[str, str]] = {}
    kern: set[str] = set()
    for t in request.targets:
        names = match_instances(wanted, t) if t.strip() not in ("all", "*", "") else []
        if names:
            for n in names:
                for h in wanted[n].hosts:
                    units.setdefault(h, {})[unit_name(n)] = n
                    if opts.kernel:
                        kern.add(h)
            continue
        try:
            hosts = select_hosts(inv, t, failed=request.failed)
        except ClusterctlError as e:
            raise ClusterctlError(f"{t!r} names no instance, and as a host pattern: {e}") from e
        if not hosts:
            raise ClusterctlError(f"{t!r} selects neither an instance nor a host of the inventory")
        kern.update(h.name for h in hosts)
    queries = {h: HostQuery(units=units.get(h, {}), kernel=h in kern) for h in inv.hosts if h in units or h in kern}
    if not queries:
        raise ClusterctlError("nothing to read: the instances selected have no placement")
    fanout = None
    if opts.follow:
        most = max_fanout_for_fds(raise_nofile_limit())
        if len(queries) > most:
            raise ClusterctlError(
                f"-f needs one connection per host: {len(queries)} hosts, but the open-file limit allows {most} "
                "(raise ulimit -n, or follow fewer hosts)"
            )
        fanout = len(queries)
    return LogsPlan(queries, opts, fanout)


def run(
    logs: LogsPlan,
    fleet: Fleet,
    on_line: Callable[[LogLine], None],
    *,
    on_error: Callable[[str, str, str], None],
    on_notice: Callable[[str, str], None],
) -> bool:
    """Read ``logs`` over ``fleet`` (entered here): each line to ``on_line`` (merged by time
    without follow; one call at a time as they come with it), each host that could not be read
    to ``on_error(host, status, why)``, the collector's notes to ``on_notice(host, text)``.
    Returns whether some host could not be read; Ctrl-C ends a follow normally."""
    opts = logs.options
    duration = opts.duration

    def report(r: HostResult) -> None:
        if opts.follow and core.follow_ended_normally(r, duration):
            return
        if not r.ok:
            why = r.error or (r.stderr.strip().splitlines() or [f"rc={r.rc}"])[-1]
            on_error(r.host, r.status.value, why)

    failed = False
    try:
        with fleet:
            if opts.follow:
                res = core.follow(
                    fleet,
                    logs.queries,
                    on_line,
                    lines=opts.line_count,
                    since=opts.since,
                    grep=opts.grep,
                    duration=duration,
                    on_result=report,
                    on_notice=on_notice,
                )
                failed = any(not core.follow_ended_normally(r, duration) for r in res)
            else:
                out, res = core.read(
                    fleet,
                    logs.queries,
                    lines=opts.line_count,
                    since=opts.since,
                    grep=opts.grep,
                    on_result=report,
                    on_notice=on_notice,
                )
                for line in out:
                    on_line(line)
                failed = any(not r.ok for r in res)
    except KeyboardInterrupt:  # the way a follow ends: connections are closed already
        if not opts.follow:
            raise
    return failed
