"""Bounded, deadline-aware fan-out of commands over SSH.

A :class:`Fleet` is one phase of work on a set of hosts::

    with Fleet(hosts, fanout=64, command_timeout=30, deadline=120) as fleet:
        res = fleet.run("uname -r")
        for group in res.gather():
            print(group.nodeset, group.stdout)

Guarantees:

* At most ``fanout`` worker threads exist for the Fleet's lifetime, and at
  most ``fanout`` connections (paramiko Transports, one thread each) are
  open at once.  ``fanout`` is capped by the open-file limit, whose soft
  value is raised to the hard value on entry.
* A host's connection is reused by later ``run`` calls; when the fleet has
  more hosts than ``fanout``, the least recently used idle connection is
  closed to make room, and hosts that still hold a connection are served
  first.
* Every run returns one row per host.  A run never lasts longer than its
  deadline: hosts not finished by then become ``timeout`` rows and their
  connections are closed.
* Ctrl-C (KeyboardInterrupt) closes every connection and propagates.
* A ``become_password`` only travels as the first line of the remote stdin;
  it is never in a command line, a result or an error message.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import resource
import threading
import time
from collections import Counter, OrderedDict
from typing import Callable, Mapping, Sequence

from clusterctl.errors import FleetError
from clusterctl.fleet import shell
from clusterctl.fleet.results import HostResult, HostStatus, RunResults
from clusterctl.fleet.transport import Connection, HostFailure, Transport
from clusterctl.inventory.model import Host

#: File descriptors one connection may use (socket + the channel's wake-up
#: pipe + slack), and those kept for everything else.
FDS_PER_CONNECTION = 4
FDS_RESERVED = 64

OnResult = Callable[[HostResult], None]


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def max_fanout_for_fds(nofile: int) -> int:
    return max(1, (nofile - FDS_RESERVED) // FDS_PER_CONNECTION)


class _RunState:
    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.active: dict[str, Connection] = {}  # host -> connection in use by this run
        self.lock = threading.Lock()


class Fleet:
    """Run commands on many hosts at once; see the module docstring.

    ``fanout``: parallel hosts (and open connections).  ``connect_timeout``:
    seconds for each of TCP connect, SSH handshake and authentication (a
    host's ``ssh.connect_timeout`` wins).  ``command_timeout``: seconds per
    command.  ``deadline``: seconds a whole ``run`` may take (``None``: no
    limit beyond the timeouts).  ``transport``: defaults to
    :class:`~clusterctl.fleet.ssh.ParamikoTransport`.
    """

    def __init__(
        self,
        hosts: Sequence[Host],
        *,
        fanout: int = 64,
        connect_timeout: float = 10,
        command_timeout: float = 60,
        deadline: float | None = None,
        become_password: str | None = None,
        transport: Transport | None = None,
    ):
        if fanout < 1:
            raise FleetError(f"fanout must be at least 1 (got {fanout})")
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            raise FleetError("a host was given twice: " + ", ".join(sorted({n for n in names if names.count(n) > 1})))
        self.hosts = list(hosts)
        self._by_name = {h.name: h for h in self.hosts}
        self.requested_fanout = fanout
        self.fanout = min(fanout, max(1, len(self.hosts)))
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.deadline = deadline
        self._become_password = become_password
        if transport is None:
            from clusterctl.fleet.ssh import ParamikoTransport

            transport = ParamikoTransport()
        self.transport = transport
        self._conns: "OrderedDict[str, Connection]" = OrderedDict()
        # How many runs are using each host's connection now: two runs may share a host
        # (pre-flight's rounds, a lifecycle action beside a read), and eviction must wait for both.
        self._in_use: Counter[str] = Counter()
        self._connecting = 0
        self._lock = threading.Lock()
        self._executor: cf.ThreadPoolExecutor | None = None
        self._runs: list[_RunState] = []
        self._closed = False

    def __repr__(self) -> str:
        return f"Fleet({len(self.hosts)} hosts, fanout={self.fanout})"

    @property
    def warnings(self) -> list[str]:
        return list(getattr(self.transport, "warnings", []))

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> "Fleet":
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        if self._executor is not None:
            return
        nofile = raise_nofile_limit()
        self.fanout = min(self.fanout, max_fanout_for_fds(nofile))
        self._executor = cf.ThreadPoolExecutor(max_workers=self.fanout, thread_name_prefix="fleet")

    def close(self) -> None:
        """Close every connection and stop the workers (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for st in self._runs:
            st.cancelled.set()
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
        for c in conns:
            c.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self.transport.close()

    # -- connections -----------------------------------------------------

    def _acquire(self, host: Host, state: _RunState) -> tuple[Connection, bool]:
        """The host's connection (reused, or new); ``True`` when newly opened."""
        with self._lock:
            self._in_use[host.name] += 1
            conn = self._conns.get(host.name)
            if conn is not None and getattr(conn, "alive", True):
                self._conns.move_to_end(host.name)
                return conn, False
            if conn is not None:
                del self._conns[host.name]
            evict = self._evict_for_room_locked()
            self._connecting += 1  # holds a slot while the handshake runs
        if conn is not None:
            conn.close()
        for c in evict:
            c.close()
        timeout = host.ssh.connect_timeout or self.connect_timeout
        try:
            conn = self.transport.connect(host, timeout=timeout)
        finally:
            with self._lock:
                self._connecting -= 1
        spare: Connection | None = None
        with self._lock:
            if self._closed or state.cancelled.is_set():
                keep = False
            else:
                keep = True
                other = self._conns.get(host.name)
                if other is not None and getattr(other, "alive", True):
                    # another run connected to this host meanwhile: share its connection and
                    # close this one (kept, it would be open but untracked until exit)
                    spare, conn = conn, other
                else:
                    self._conns[host.name] = conn
        if not keep:
            conn.close()
            raise HostFailure(HostStatus.TIMEOUT, "run ended before the connection was ready")
        if spare is not None:
            spare.close()
        return conn, True

    def _evict_for_room_locked(self) -> list[Connection]:
        out: list[Connection] = []
        while len(self._conns) + self._connecting >= self.fanout:
            victim = next((n for n in self._conns if n not in self._in_use), None)
            if victim is None:
                break
            out.append(self._conns.pop(victim))
        return out

    def _drop(self, name: str) -> None:
        with self._lock:
            conn = self._conns.pop(name, None)
        if conn is not None:
            conn.close()

    # -- running -----------------------------------------------------------

    def run(
        self,
        command: str | Mapping[str, str],
        *,
        stdin: bytes | None = None,
        sudo: bool = False,
        timeout: float | None = None,
        on_result: OnResult | None = None,
        require_python: bool = False,
        deadline: float | None = None,
        on_stderr: Callable[[str, bytes], None] | None = None,
        on_stdout: Callable[[str, bytes], None] | None = None,
    ) -> RunResults:
        """Run ``command`` on every host (or ``command[host]`` per host).

        ``stdin`` is written to each command's standard input.  ``sudo``:
        for hosts whose login user is not root, run through sudo (``sudo -n``,
        or with the fleet's ``become_password``).  ``timeout``: seconds per
        command (default: ``command_timeout``).  ``deadline``: seconds for
        the whole run (default: the fleet's).  ``require_python``: hosts
        without ``python3`` give ``no_python`` rows.  ``on_result`` is called
        in the caller's thread as each host finishes.  ``on_stderr(host,
        chunk)`` is called from worker threads with standard error as it
        arrives (raw chunks, not redacted: for progress markers only).  ``on_stdout(host,
        chunk)`` likewise streams standard output (worker threads, raw chunks); the rows'
        ``stdout`` are then empty, so a command that runs for hours (``journalctl -f``)
        holds no output in memory.  Hosts missing from a
        per-host mapping are skipped (no row).
        """
        if self._closed:
            raise FleetError("this Fleet is closed")
        self._start()
        assert self._executor is not None
        if isinstance(command, Mapping):
            unknown = [h for h in command if h not in self._by_name]
            if unknown:
                raise FleetError("commands given for hosts not in this fleet: " + ", ".join(unknown))
            targets = [h for h in self.hosts if h.name in command]
        else:
            targets = list(self.hosts)
        cmd_timeout = self.command_timeout if timeout is None else timeout
        limit = self.deadline if deadline is None else deadline
        t0 = time.monotonic()
        end = t0 + limit if limit is not None else None

        with self._lock:  # hosts with a live connection first: they cost no handshake
            warm = [h for h in targets if h.name in self._conns]
        cold = [h for h in targets if h.name not in {w.name for w in warm}]
        state = _RunState()
        self._runs.append(state)
        results: dict[str, HostResult] = {}
        futures: dict[cf.Future[HostResult], str] = {}
        try:
            for h in warm + cold:
                cmd = command[h.name] if isinstance(command, Mapping) else command
                fut = self._executor.submit(
                    self._one, h, cmd, stdin, sudo, cmd_timeout, end, require_python, state, on_stderr, on_stdout
                )
                futures[fut] = h.name
            pending = set(futures)
            while pending:
                wait_s = None if end is None else max(0.0, end - time.monotonic())
                done, pending = cf.wait(pending, timeout=wait_s, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    r = fut.result()
                    results[r.host] = r
                    if on_result:
                        on_result(r)
                if pending and end is not None and time.monotonic() >= end:
                    self._expire(state, pending, futures, results, limit or 0, on_result)
                    pending = set()
        except BaseException:  # KeyboardInterrupt included: close everything, then re-raise
            state.cancelled.set()
            for fut in futures:
                fut.cancel()
            self.close()
            raise
        finally:
            if state in self._runs:
                self._runs.remove(state)
        ordered = [results[h.name] for h in targets]
        return RunResults(ordered, duration_s=time.monotonic() - t0)

    def _expire(
        self,
        state: _RunState,
        pending: set[cf.Future[HostResult]],
        futures: Mapping[cf.Future[HostResult], str],
        results: dict[str, HostResult],
        limit: float,
        on_result: OnResult | None,
    ) -> None:
        state.cancelled.set()
        now = time.time()
        for fut in pending:
            name = futures[fut]
            never_started = fut.cancel()
            r = HostResult(
                name,
                HostStatus.TIMEOUT,
                started=now,
                error=(
                    f"run deadline of {limit:g}s reached before this host started"
                    if never_started
                    else f"run deadline of {limit:g}s reached"
                ),
            )
            results[name] = r
            if not never_started:
                with state.lock:
                    conn = state.active.pop(name, None)
                if conn is not None:
                    conn.close()
                self._drop(name)
            if on_result:
                on_result(r)

    def _one(
        self,
        host: Host,
        command: str,
        stdin: bytes | None,
        sudo: bool,
        timeout: float,
        end: float | None,
        require_python: bool,
        state: _RunState,
        on_stderr: Callable[[str, bytes], None] | None = None,
        on_stdout: Callable[[str, bytes], None] | None = None,
    ) -> HostResult:
        started, t0 = time.time(), time.monotonic()
        if state.cancelled.is_set() or (end is not None and t0 >= end):
            return HostResult(
                host.name, HostStatus.TIMEOUT, started=started, error="run deadline reached before this host started"
            )
        password = self._become_password
        try:
            conn, _ = self._acquire(host, state)
            with state.lock:
                state.active[host.name] = conn
            remote, data = self._prepare(host, command, stdin, sudo, require_python)
            budget = timeout if end is None else min(timeout, max(end - time.monotonic(), 0.001))
            er = conn.exec(
                remote,
                stdin=data,
                timeout=budget,
                on_stderr=functools.partial(on_stderr, host.name) if on_stderr else None,
                on_stdout=functools.partial(on_stdout, host.name) if on_stdout else None,
            )
        except HostFailure as f:
            if f.status in (HostStatus.TIMEOUT, HostStatus.ERROR):
                self._drop(host.name)  # a timed-out or broken connection is not reused
            message = f.message
            if end is not None and f.status is HostStatus.TIMEOUT and time.monotonic() >= end - 0.01:
                message = f"run deadline reached ({message})"
            return HostResult(
                host.name, f.status, started=started, duration_s=time.monotonic() - t0, error=_redact(message, password)
            )
        except Exception as e:  # a bug or an unexpected library error: still one row
            self._drop(host.name)
            return HostResult(
                host.name,
                HostStatus.ERROR,
                started=started,
                duration_s=time.monotonic() - t0,
                error=_redact(f"{type(e).__name__}: {e}", password),
            )
        finally:
            with state.lock:
                state.active.pop(host.name, None)
            with self._lock:
                self._in_use[host.name] -= 1
                if self._in_use[host.name] <= 0:
                    del self._in_use[host.name]
        out = _redact(er.stdout.decode("utf-8", "replace"), password)
        err = _redact(er.stderr.decode("utf-8", "replace"), password)
        status = HostStatus.OK if er.rc == 0 else HostStatus.FAILED
        error = None
        if er.rc == 127 and (
            shell.NO_PYTHON_MARKER in err or (require_python and "python3" in err and "not found" in err)
        ):
            status, error = HostStatus.NO_PYTHON, "python3 is not installed (or not on PATH)"
        return HostResult(
            host.name,
            status,
            rc=er.rc,
            stdout=out,
            stderr=err,
            started=started,
            duration_s=time.monotonic() - t0,
            error=error,
        )

    def _prepare(
        self, host: Host, command: str, stdin: bytes | None, sudo: bool, require_python: bool
    ) -> tuple[str, bytes | None]:
        if require_python:
            command = shell.require_python3(command)
        if sudo and (host.ssh.user or "root") != "root":
            if self._become_password is not None:
                line = self._become_password.encode() + b"\n"
                return shell.sudo(command, with_password=True), line + (stdin or b"")
            return shell.sudo(command, with_password=False), stdin
        return command, stdin

    def run_python(
        self,
        script: bytes,
        args: Sequence[str] = (),
        *,
        sudo: bool = False,
        timeout: float | None = None,
        on_result: OnResult | None = None,
    ) -> RunResults:
        """Pipe ``script`` to ``python3 -`` with quoted ``args``; no python3 -> ``no_python``."""
        return self.run(
            shell.python_script(args),
            stdin=script,
            sudo=sudo,
            timeout=timeout,
            on_result=on_result,
            require_python=True,
        )


def _redact(text: str, secret: str | None) -> str:
    if secret and secret in text:
        return text.replace(secret, "********")
    return text
