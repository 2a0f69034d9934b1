"""Journals across hosts: the units of instances and the kernel log, merged by time.

One ``journalctl -o json`` per host (one SSH session channel each), its matches
OR-ed (``_SYSTEMD_UNIT=U + UNIT=U + _TRANSPORT=kernel``: a unit's own lines, the
lines systemd writes about it, the kernel's).  :func:`read` returns the lines of
every host merged in time order; :func:`follow` streams them as they arrive
(``journalctl -f`` with :meth:`Fleet.run`'s ``on_stdout``: nothing accumulates,
however long it runs) and stops at Ctrl-C or after ``duration`` seconds (a
``timeout`` on the node, so the host's command ends by itself).

Bounded: ``lines`` per host (journalctl ``-n``), a partial line longer than
:data:`MAX_LINE` is cut, each host's command has a timeout and the run a deadline.
``grep`` is a Python regular expression applied here, to the message, so every
node gets the same semantics whatever its journalctl was built with.
"""

from __future__ import annotations

import heapq
import json
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from clusterctl.errors import ConfigError, Problem
from clusterctl.fleet import shell
from clusterctl.fleet.results import HostResult, RunResults
from clusterctl.node.collector import journal_line

if TYPE_CHECKING:
    from clusterctl.fleet.fleet import Fleet

#: Longest line kept from a node (bytes); the rest of a longer line is dropped.
MAX_LINE = 64 * 1024
#: Fields asked of journalctl (``__REALTIME_TIMESTAMP`` always comes).
FIELDS = ("MESSAGE", "PRIORITY", "_SYSTEMD_UNIT", "UNIT", "_TRANSPORT", "SYSLOG_IDENTIFIER")
#: A follow without a duration runs until interrupted: the per-command timeout then.
FOREVER_S = 10 * 365 * 86400.0

#: Seconds between the follow heartbeats on stderr (a closed channel is noticed within this).
HEARTBEAT_S = 1.0
#: What a host prints when its journal holds no kernel message (see :func:`command`).
NO_KERNEL_MARK = "#clusterctl: no kernel messages in this journal"
NO_KERNEL_NOTE = (
    "its journal has no kernel messages (journald not reading /dev/kmsg, or a container): "
    "the kernel log may be only in /var/log/kern.log"
)

_SINCE_RE = re.compile(r"^(\d+)\s*(s|sec|m|min|h|d)$")
_SINCE_ABS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2})?)?$")
_UNIT_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class HostQuery:
    """What to read on one host: ``units`` (unit name -> label shown) and/or the kernel log."""

    units: Mapping[str, str] = field(default_factory=dict)
    kernel: bool = False


@dataclass(frozen=True)
class LogLine:
    """One journal entry: ``time`` (epoch s, None if the node gave none), host, source
    (an instance name, a unit, or ``kernel``), syslog ``priority`` (0-7) and text."""

    time: float | None
    host: str
    source: str
    priority: int | None
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "host": self.host,
            "source": self.source,
            "priority": self.priority,
            "message": self.text,
        }


def parse_since(text: str) -> str:
    """``--since`` as journalctl takes it: ``10m``/``2h``/``90s``/``1d`` (ago) or a date
    ``YYYY-MM-DD[ HH:MM[:SS]]``; raises ConfigError otherwise."""
    t = text.strip()
    m = _SINCE_RE.match(t)
    if m:
        return f"-{int(m.group(1)) * _UNIT_S[m.group(2)]}s"
    if _SINCE_ABS_RE.match(t):
        return t.replace("T", " ")
    raise ConfigError(
        [
            Problem(
                "--since",
                0,
                f"{text!r}: use a duration ago (90s, 10m, 2h, 1d) or a date (2026-12-01 or '2026-12-01 14:30')",
            )
        ]
    )


def compile_grep(pattern: str | None) -> re.Pattern[str] | None:
    """``--grep`` compiled; a bad expression raises ConfigError."""
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ConfigError([Problem("--grep", 0, f"{pattern!r} is not a regular expression: {e}")]) from None


def command(
    query: HostQuery, *, lines: int | None, since: str | None, follow: bool, duration: float | None = None
) -> str:
    """The shell command run on a host for ``query`` (every value quoted)."""
    argv: list[object] = ["journalctl", "--no-pager", "-q", "-o", "json", "--output-fields=" + ",".join(FIELDS)]
    if lines is not None:
        argv += ["-n", lines]
    if since:
        argv += ["--since", since]
    if follow:
        argv.append("-f")
    matches: list[str] = []
    for unit in sorted(query.units):
        matches += [f"_SYSTEMD_UNIT={unit}", f"UNIT={unit}"]
    if query.kernel:
        matches.append("_TRANSPORT=kernel")
    for i, m in enumerate(matches):
        argv += (["+"] if i else []) + [m]
    cmd = shell.join(argv)
    if follow:
        if duration is not None:  # ends by itself on the node (exit 124): no SSH timeout needed to stop it
            cmd = f"timeout {max(duration, 0.1):g} {cmd}"
        # journalctl -f notices a closed SSH channel only when it next writes, maybe never on a quiet
        # unit: a heartbeat on stderr finds the closed channel (EPIPE) within HEARTBEAT_S and stops it.
        cmd = (
            f"{cmd} & j=$!; trap '' PIPE; trap 'kill $j 2>/dev/null' HUP INT TERM; "
            f"while kill -0 $j 2>/dev/null; do sleep {HEARTBEAT_S:g}; printf . >&2 || kill $j 2>/dev/null; done; "
            "wait $j"
        )
    if query.kernel:  # say so when the journal has no kernel messages at all (rsyslog-only, containers)
        cmd = (
            f"[ -n \"$(journalctl -q -n 1 -o cat _TRANSPORT=kernel 2>/dev/null)\" ] || "
            f"echo {shell.quote(NO_KERNEL_MARK)}; {cmd}"
        )
    return cmd


def parse_entry(raw: str, host: str, query: HostQuery) -> LogLine | None:
    """One ``journalctl -o json`` line as a LogLine; None when it is not an entry."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    base = journal_line(entry)
    unit = entry.get("_SYSTEMD_UNIT") if entry.get("_SYSTEMD_UNIT") in query.units else entry.get("UNIT")
    if entry.get("_TRANSPORT") == "kernel":
        source = "kernel"
    elif isinstance(unit, str) and unit in query.units:
        source = query.units[unit]
    else:
        source = str(entry.get("_SYSTEMD_UNIT") or entry.get("SYSLOG_IDENTIFIER") or "journal")
    return LogLine(base["time"], host, source, base["priority"], base["text"])


def _key(line: LogLine) -> tuple[float, str]:
    return (line.time if line.time is not None else 0.0, line.host)


def merge(per_host: Iterable[list[LogLine]]) -> list[LogLine]:
    """Lines of several hosts (each in its own time order) in one time order."""
    return list(heapq.merge(*per_host, key=_key))


def read(
    fleet: Fleet,
    queries: Mapping[str, HostQuery],
    *,
    lines: int | None,
    since: str | None,
    grep: re.Pattern[str] | None = None,
    timeout: float | None = None,
    on_result: Callable[[HostResult], None] | None = None,
    on_notice: Callable[[str, str], None] | None = None,
) -> tuple[list[LogLine], RunResults]:
    """The journals of ``queries`` (host -> what) on ``fleet``, merged by time, filtered by
    ``grep`` (then the last ``lines`` of the merged lines when ``grep`` is given), and the
    per-host results (a host that failed has its row, and no lines)."""
    fetch = None if grep is not None else lines
    cmds = {h: command(q, lines=fetch, since=since, follow=False) for h, q in queries.items()}
    res = fleet.run(cmds, sudo=True, timeout=timeout, on_result=on_result)
    per_host: list[list[LogLine]] = []
    for r in res:
        if not r.ok:
            continue
        raw = r.stdout.splitlines()
        if raw and raw[0] == NO_KERNEL_MARK and on_notice:
            on_notice(r.host, NO_KERNEL_NOTE)
        got = [x for x in (parse_entry(s, r.host, queries[r.host]) for s in raw) if x]
        if grep is not None:
            got = [x for x in got if grep.search(x.text)]
        per_host.append(sorted(got, key=_key))
    merged = merge(per_host)
    if grep is not None and lines is not None:
        merged = merged[-lines:] if lines else []
    return merged, res


class _Splitter:
    """Bytes arriving in chunks -> complete lines (a line over MAX_LINE is cut)."""

    def __init__(self) -> None:
        self.buf = b""
        self.skipping = False

    def feed(self, chunk: bytes) -> list[str]:
        self.buf += chunk
        out: list[str] = []
        while True:
            i = self.buf.find(b"\n")
            if i < 0:
                break
            line, self.buf = self.buf[:i], self.buf[i + 1 :]
            if not self.skipping:
                out.append(line[:MAX_LINE].decode("utf-8", "replace"))
            self.skipping = False
        if len(self.buf) > MAX_LINE:  # keep the head of a huge line, drop the rest up to its newline
            if not self.skipping:
                out.append(self.buf[:MAX_LINE].decode("utf-8", "replace"))
            self.buf, self.skipping = b"", True
        return out


def follow(
    fleet: Fleet,
    queries: Mapping[str, HostQuery],
    on_line: Callable[[LogLine], None],
    *,
    lines: int | None = 10,
    since: str | None = None,
    grep: re.Pattern[str] | None = None,
    duration: float | None = None,
    connect_slack: float = 30.0,
    on_result: Callable[[HostResult], None] | None = None,
    on_notice: Callable[[str, str], None] | None = None,
) -> RunResults:
    """Stream the journals of ``queries``: ``on_line`` is called (one call at a time, from
    the fleet's threads) with each line as its host sends it.  Returns when every host's
    command ended: after ``duration`` s (then rc 124 on the node is the normal end) or
    when the caller's thread is interrupted (Ctrl-C closes every connection)."""
    lock = threading.Lock()
    splitters = {h: _Splitter() for h in queries}

    def on_stdout(host: str, chunk: bytes) -> None:
        raw = splitters[host].feed(chunk)
        if NO_KERNEL_MARK in raw and on_notice:
            with lock:
                on_notice(host, NO_KERNEL_NOTE)
        parsed = [x for x in (parse_entry(s, host, queries[host]) for s in raw) if x]
        with lock:
            for x in parsed:
                if grep is None or grep.search(x.text):
                    on_line(x)

    cmds = {h: command(q, lines=lines, since=since, follow=True, duration=duration) for h, q in queries.items()}
    limit = FOREVER_S if duration is None else duration + connect_slack
    return fleet.run(cmds, sudo=True, timeout=limit, deadline=limit, on_stdout=on_stdout, on_result=on_result)


def follow_ended_normally(r: HostResult, duration: float | None) -> bool:
    """A follow row that is not a failure: rc 0, or 124 (the node's timeout) with a duration."""
    return r.ok or (duration is not None and r.rc == 124)
