"""The seam between the fan-out logic and SSH.

A :class:`Transport` opens a :class:`Connection` to one host; a connection
runs commands.  :class:`~clusterctl.fleet.fleet.Fleet` only talks to these
two protocols, so unit tests drive it with :class:`FakeTransport` (no
network) and production uses
:class:`~clusterctl.fleet.ssh.ParamikoTransport`.

Failures are reported by raising :class:`HostFailure` with the
:class:`~clusterctl.fleet.results.HostStatus` the row should get.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from clusterctl.fleet.results import HostStatus
from clusterctl.inventory.model import Host


class HostFailure(Exception):
    """One host could not do what was asked; ``status`` says how."""

    def __init__(self, status: HostStatus, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class ExecResult:
    """What one remote command produced (raw bytes; rc as the server sent it)."""

    rc: int
    stdout: bytes = b""
    stderr: bytes = b""


#: Called with each chunk of a command's standard error as it arrives.
StderrSink = Callable[[bytes], None]
#: Called with each chunk of a command's standard output as it arrives (streaming).
StdoutSink = Callable[[bytes], None]


class Connection(Protocol):
    """An open, authenticated connection to one host."""

    def exec(
        self,
        command: str,
        *,
        stdin: bytes | None,
        timeout: float,
        on_stderr: StderrSink | None = None,
        on_stdout: StdoutSink | None = None,
    ) -> ExecResult:
        """Run ``command`` in the login shell, feed ``stdin``, wait up to ``timeout`` s.

        ``on_stderr`` receives standard error as it arrives (raw chunks, not
        split on lines), for live progress; the result still holds all of it.
        ``on_stdout`` receives standard output as it arrives and the result's
        ``stdout`` is then empty (streaming: memory stays bounded however long
        the command runs, e.g. ``journalctl -f``).
        Raises :class:`HostFailure` (``timeout`` when the command did not
        exit in time, ``error`` for a broken connection).
        """
        ...

    def close(self) -> None:
        """Close the connection; safe to call twice and from another thread."""
        ...


class Transport(Protocol):
    """Opens connections; shared by all worker threads of a fleet."""

    def connect(self, host: Host, *, timeout: float) -> Connection:
        """Connect and authenticate within ``timeout`` seconds (TCP + SSH handshake
        + authentication each), or raise :class:`HostFailure`."""
        ...

    def close(self) -> None:
        """Release shared resources (e.g. bastion connections)."""
        ...


# --------------------------------------------------------------------------
# A fake for unit tests.


@dataclass
class FakeReply:
    """What a fake host answers: an exit code, output and how long it takes."""

    rc: int = 0
    stdout: bytes | str = b""
    stderr: bytes | str = b""
    delay_s: float = 0.0


FakeHandler = Callable[[Host, str, "bytes | None"], "FakeReply | HostFailure"]
FakeConnectHandler = Callable[[Host], "HostFailure | None | float"]


def _b(v: bytes | str) -> bytes:
    return v.encode() if isinstance(v, str) else v


class FakeConnection:
    def __init__(self, transport: "FakeTransport", host: Host):
        self._t = transport
        self.host = host
        self.closed = threading.Event()

    def exec(
        self,
        command: str,
        *,
        stdin: bytes | None,
        timeout: float,
        on_stderr: StderrSink | None = None,
        on_stdout: StdoutSink | None = None,
    ) -> ExecResult:
        if self.closed.is_set():
            raise HostFailure(HostStatus.ERROR, "connection closed")
        self._t.commands.append((self.host.name, command, stdin))
        reply = self._t.handler(self.host, command, stdin)
        if isinstance(reply, HostFailure):
            raise reply
        if reply.delay_s:
            # Waits like a real command would, but wakes up when closed.
            if self.closed.wait(min(reply.delay_s, timeout)):
                raise HostFailure(HostStatus.ERROR, "connection closed")
            if reply.delay_s > timeout:
                raise HostFailure(HostStatus.TIMEOUT, f"command timed out after {timeout:g}s")
        if on_stderr and reply.stderr:
            on_stderr(_b(reply.stderr))
        if on_stdout:
            if reply.stdout:
                on_stdout(_b(reply.stdout))
            return ExecResult(reply.rc, b"", _b(reply.stderr))
        return ExecResult(reply.rc, _b(reply.stdout), _b(reply.stderr))

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self._t._closed(self)


class FakeTransport:
    """A transport that answers from Python functions, and counts what happens.

    ``handler(host, command, stdin)`` returns a :class:`FakeReply` or a
    :class:`HostFailure`.  ``on_connect(host)`` may return a
    :class:`HostFailure` (the connect fails), a float (the connect takes
    that many seconds) or ``None``.  ``max_open`` is the largest number of
    connections that were open at the same time; ``connects`` counts
    connects per host.
    """

    def __init__(self, handler: FakeHandler | None = None, on_connect: FakeConnectHandler | None = None):
        self.handler: FakeHandler = handler or (lambda h, c, s: FakeReply())
        self.on_connect = on_connect
        self._lock = threading.Lock()
        self.open = 0
        self.max_open = 0
        self.connects: dict[str, int] = {}
        self.commands: list[tuple[str, str, bytes | None]] = []

    def connect(self, host: Host, *, timeout: float) -> FakeConnection:
        with self._lock:
            self.open += 1
            self.max_open = max(self.max_open, self.open)
            self.connects[host.name] = self.connects.get(host.name, 0) + 1
        try:
            outcome = self.on_connect(host) if self.on_connect else None
            if isinstance(outcome, HostFailure):
                raise outcome
            if isinstance(outcome, (int, float)) and outcome > 0:
                time.sleep(min(outcome, timeout))
                if outcome > timeout:
                    raise HostFailure(HostStatus.TIMEOUT, f"connect timed out after {timeout:g}s")
        except BaseException:
            with self._lock:
                self.open -= 1
            raise
        return FakeConnection(self, host)

    def _closed(self, conn: FakeConnection) -> None:
        with self._lock:
            self.open -= 1

    def close(self) -> None:
        pass


def __getattr__(name: str) -> object:
    # ParamikoTransport lives in fleet/ssh.py (it imports paramiko); offer it here too.
    if name in ("ParamikoTransport", "ParamikoConnection"):
        from clusterctl.fleet import ssh

        return getattr(ssh, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
