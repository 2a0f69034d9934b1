"""The production transport: paramiko, with our own host key checking.

One :class:`ParamikoTransport` serves a whole fleet.  It loads each identity
file once, reads ssh-agent keys once, shares one
:class:`~clusterctl.fleet.hostkeys.KnownHosts` per file, and keeps a small
pool of connections to each jump host (``proxy_jump``) through which target
connections are tunnelled as ``direct-tcpip`` channels.

Timeouts: ``connect(host, timeout=T)`` bounds the TCP connect, the SSH
banner and key exchange, and authentication by ``T`` seconds each.
``exec(..., timeout=T)`` bounds the whole command (stdin, output, exit).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import paramiko
from paramiko.common import cMSG_CHANNEL_REQUEST

from clusterctl.fleet.hostkeys import HostKeyError, HostKeyMismatch, KnownHosts
from clusterctl.fleet.results import HostStatus
from clusterctl.fleet.transport import ExecResult, HostFailure, StderrSink, StdoutSink
from clusterctl.inventory.model import Host, SSHSettings

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
_READ = 65536

# paramiko logs handshake failures at ERROR; they are result rows here, and
# without a handler Python would print them on stderr.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass(frozen=True)
class JumpHost:
    """``[user@]host[:port]`` of a ``proxy_jump`` setting."""

    user: str | None
    host: str
    port: int

    @classmethod
    def parse(cls, spec: str) -> "JumpHost":
        user, _, rest = spec.rpartition("@")
        host, port = rest, 22
        if rest.startswith("["):  # [v6addr]:port
            host, _, tail = rest[1:].partition("]")
            if tail.startswith(":"):
                port = int(tail[1:])
        elif rest.count(":") == 1:
            host, p = rest.split(":")
            port = int(p)
        if not host:
            raise ValueError(f"proxy_jump {spec!r}: no host")
        return cls(user or None, host, port)


class ParamikoConnection:
    """An authenticated paramiko Transport; each ``exec`` is a new session channel."""

    def __init__(self, transport: paramiko.Transport):
        self._t = transport
        self._closed = False

    @property
    def alive(self) -> bool:
        return not self._closed and self._t.is_active()

    def exec(
        self,
        command: str,
        *,
        stdin: bytes | None,
        timeout: float,
        on_stderr: StderrSink | None = None,
        on_stdout: StdoutSink | None = None,
    ) -> ExecResult:
        end = time.monotonic() + timeout
        try:
            chan = self._t.open_session(timeout=max(timeout, 0.001))
        except (paramiko.SSHException, EOFError, OSError) as e:
            if time.monotonic() >= end:
                raise HostFailure(HostStatus.TIMEOUT, f"no session opened within {timeout:g}s")
            raise HostFailure(HostStatus.ERROR, f"could not open a session: {e or type(e).__name__}")
        try:
            return self._run(chan, command, stdin, end, timeout, on_stderr, on_stdout)
        finally:
            chan.close()

    def _run(
        self,
        chan: paramiko.Channel,
        command: str,
        stdin: bytes | None,
        end: float,
        timeout: float,
        on_stderr: StderrSink | None = None,
        on_stdout: StdoutSink | None = None,
    ) -> ExecResult:
        out: list[bytes] = []
        err: list[bytes] = []

        def read_stdout() -> None:
            while chan.recv_ready():
                chunk = chan.recv(_READ)
                if on_stdout:
                    on_stdout(chunk)
                else:
                    out.append(chunk)

        def read_stderr() -> None:
            while chan.recv_stderr_ready():
                chunk = chan.recv_stderr(_READ)
                err.append(chunk)
                if on_stderr:
                    on_stderr(chunk)

        send_error: list[BaseException] = []

        def send() -> None:
            # In its own thread, so output is read while a large stdin is still going out
            # (no deadlock on full windows), and a command that exits without reading all of
            # its input is not an error (like ssh(1), which ignores EPIPE on stdin).
            try:
                if stdin:
                    chan.sendall(stdin)
                chan.shutdown_write()
            except (paramiko.SSHException, EOFError, OSError) as e:
                send_error.append(e)

        try:
            chan.settimeout(max(end - time.monotonic(), 0.001))
            chan.exec_command(command)
            sender = threading.Thread(target=send, name="ssh-stdin", daemon=True)
            sender.start()
            poller = select.poll()
            poller.register(chan.fileno(), select.POLLIN)
            while True:
                read_stdout()
                read_stderr()
                remaining = end - time.monotonic()
                if chan.eof_received or chan.closed:
                    if chan.status_event.wait(max(remaining, 0)) or chan.closed:
                        read_stdout()
                        read_stderr()
                        break
                    remaining = 0
                if remaining <= 0:
                    self._signal(chan, "TERM")
                    raise HostFailure(HostStatus.TIMEOUT, f"command timed out after {timeout:g}s")
                poller.poll(min(remaining, 1.0) * 1000)
        except socket.timeout:
            self._signal(chan, "TERM")
            raise HostFailure(HostStatus.TIMEOUT, f"command timed out after {timeout:g}s")
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise HostFailure(HostStatus.ERROR, f"connection lost: {e or type(e).__name__}")
        if not chan.status_event.is_set():
            if send_error:
                why = send_error[0]
                raise HostFailure(HostStatus.ERROR, f"connection lost while sending input: {why or type(why).__name__}")
            return ExecResult(-1, b"".join(out), b"".join(err))
        return ExecResult(chan.exit_status, b"".join(out), b"".join(err))

    def _signal(self, chan: paramiko.Channel, name: str) -> None:
        """Ask the server to signal the command (RFC 4254 §6.9), best effort."""
        try:
            m = paramiko.Message()
            m.add_byte(cMSG_CHANNEL_REQUEST)
            m.add_int(chan.remote_chanid)
            m.add_string("signal")
            m.add_boolean(False)
            m.add_string(name)
            self._t._send_user_message(m)  # type: ignore[attr-defined]
        except Exception:  # the connection may already be gone
            pass

    def close(self) -> None:
        self._closed = True
        try:
            self._t.close()
        except Exception:
            pass


class _BastionPool:
    """At most ``size`` connections to one jump host, used round-robin."""

    def __init__(self, owner: "ParamikoTransport", jump: JumpHost, settings: SSHSettings, size: int):
        self._owner = owner
        self._jump = jump
        self._settings = settings
        self._size = size
        self._lock = threading.Lock()
        self._conns: list[paramiko.Transport] = []
        self._next = 0

    def _get(self, timeout: float) -> paramiko.Transport:
        with self._lock:
            self._conns = [t for t in self._conns if t.is_active()]
            if len(self._conns) < self._size:
                j = self._jump
                user = j.user or self._settings.user or "root"
                sock = _connect_or_fail(j.host, j.port, timeout, what="jump host ")
                t = self._owner._handshake(
                    sock, j.host, j.port, user, self._settings, timeout, what=f"jump host {j.host}: "
                )
                self._conns.append(t)
                return t
            self._next = (self._next + 1) % len(self._conns)
            return self._conns[self._next]

    def open_channel(self, address: str, port: int, timeout: float) -> paramiko.Channel:
        t = self._get(timeout)
        try:
            return t.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=timeout)
        except paramiko.ChannelException as e:
            raise HostFailure(HostStatus.UNREACHABLE, f"jump host {self._jump.host} could not connect: {e.text}")
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise HostFailure(HostStatus.UNREACHABLE, f"jump host {self._jump.host}: {e}")

    def close(self) -> None:
        with self._lock:
            for t in self._conns:
                t.close()
            self._conns.clear()


def _tcp_connect(
    address: str, port: int, timeout: float, what: str = "", register: Callable[[socket.socket], None] | None = None
) -> socket.socket:
    """Connect within ``timeout``; ``register`` sees the socket first (so it can be aborted)."""
    sock: socket.socket | None = None
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        if register is not None:
            register(sock)
        sock.connect(addr)
    except BaseException:
        if sock is not None:
            sock.close()
        raise
    return _tuned(sock)


def _tuned(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _connect_or_fail(
    address: str, port: int, timeout: float, what: str = "", register: Callable[[socket.socket], None] | None = None
) -> socket.socket:
    try:
        return _tcp_connect(address, port, timeout, what, register)
    except ConnectionRefusedError:
        raise HostFailure(HostStatus.UNREACHABLE, f"{what}connection refused")
    except socket.timeout:
        raise HostFailure(HostStatus.UNREACHABLE, f"{what}TCP connect timed out after {timeout:g}s")
    except socket.gaierror as e:
        raise HostFailure(HostStatus.UNREACHABLE, f"{what}cannot resolve {address}: {e.strerror}")
    except OSError as e:
        raise HostFailure(HostStatus.UNREACHABLE, f"{what}{e.strerror or e}")


class ParamikoTransport:
    """SSH over paramiko.

    ``host_key_policy`` overrides every host's ``ssh.host_key_policy`` when
    given (the CLI's ``--host-key-policy``).  ``use_agent``: offer ssh-agent
    keys (``$SSH_AUTH_SOCK``) after the identity files.  ``bastion_pool``:
    connections kept to each jump host.  ``warnings`` collects messages the
    caller should show once (e.g. host key checking is off).
    """

    def __init__(self, *, host_key_policy: str | None = None, use_agent: bool = True, bastion_pool: int = 4):
        self.host_key_policy = host_key_policy
        self.use_agent = use_agent
        self.bastion_pool = bastion_pool
        self.warnings: list[str] = []
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str], KnownHosts] = {}
        self._keys: dict[str, paramiko.PKey | Exception] = {}
        self._agent_keys: list[paramiko.AgentKey] | None = None
        self._agent: paramiko.Agent | None = None
        self._bastions: dict[tuple[Any, ...], _BastionPool] = {}
        self._inflight: set[Any] = set()
        self._closing = False

    # -- shared state, created once -------------------------------------

    def _known_hosts(self, s: SSHSettings) -> KnownHosts:
        policy = self.host_key_policy or s.host_key_policy or "accept-new"
        path = os.path.expanduser(s.known_hosts or DEFAULT_KNOWN_HOSTS)
        with self._lock:
            kh = self._known.get((path, policy))
            if kh is None:
                kh = self._known[(path, policy)] = KnownHosts(path, policy)
                if policy == "off":
                    self.warnings.append(
                        f"host key checking is OFF for {path}: any server key is accepted "
                        "(a changed key is still refused)"
                    )
            return kh

    def _load_key(self, path: str) -> paramiko.PKey | Exception:
        with self._lock:
            if path not in self._keys:
                try:
                    self._keys[path] = paramiko.PKey.from_path(path)
                except Exception as e:  # unreadable, encrypted or unknown format
                    self._keys[path] = e
            return self._keys[path]

    def _client_keys(self, s: SSHSettings) -> tuple[list[paramiko.PKey], list[str]]:
        keys: list[paramiko.PKey] = []
        notes: list[str] = []
        if s.identity_file:
            paths = [os.path.expanduser(s.identity_file)]
        else:
            paths = [p for p in (os.path.expanduser(d) for d in DEFAULT_IDENTITIES) if os.path.exists(p)]
        for p in paths:
            k = self._load_key(p)
            if isinstance(k, Exception):
                notes.append(f"identity file {p} not usable: {k}")
            else:
                keys.append(k)
        if self.use_agent and os.environ.get("SSH_AUTH_SOCK"):
            with self._lock:
                if self._agent_keys is None:
                    try:
                        self._agent = paramiko.Agent()
                        self._agent_keys = list(self._agent.get_keys())
                    except Exception:
                        self._agent_keys = []
            keys.extend(self._agent_keys or [])
        return keys, notes

    def _bastion(self, s: SSHSettings) -> _BastionPool:
        assert s.proxy_jump
        try:
            jump = JumpHost.parse(s.proxy_jump)
        except ValueError as e:
            raise HostFailure(HostStatus.ERROR, str(e))
        key = (jump, s.user, s.identity_file, s.known_hosts, s.host_key_policy)
        with self._lock:
            pool = self._bastions.get(key)
            if pool is None:
                pool = self._bastions[key] = _BastionPool(self, jump, s, self.bastion_pool)
            return pool

    # -- connecting ------------------------------------------------------

    def connect(self, host: Host, *, timeout: float) -> ParamikoConnection:
        s = host.ssh
        port = s.port or 22
        sock: Any
        if self._closing:
            raise HostFailure(HostStatus.ERROR, "transport closed")
        holder: list[Any] = []

        def register(obj: Any) -> None:
            holder.append(obj)
            with self._lock:
                self._inflight.add(obj)

        try:
            if s.proxy_jump:
                sock = self._bastion(s).open_channel(host.address, port, timeout)
                register(sock)
            else:
                sock = _connect_or_fail(host.address, port, timeout, register=register)
            t = self._handshake(sock, host.address, port, s.user or "root", s, timeout)
        except HostFailure:
            if self._closing:
                raise HostFailure(HostStatus.ERROR, "interrupted while connecting")
            raise
        finally:
            with self._lock:
                for obj in holder:
                    self._inflight.discard(obj)
        return ParamikoConnection(t)

    def _handshake(
        self, sock: Any, address: str, port: int, user: str, s: SSHSettings, timeout: float, what: str = ""
    ) -> paramiko.Transport:
        kh = self._known_hosts(s)
        try:
            t = paramiko.Transport(sock)
        except Exception as e:
            sock.close()
            raise HostFailure(HostStatus.ERROR, f"{what}{e}")
        ok = False
        try:
            t.banner_timeout = timeout
            t.handshake_timeout = timeout
            t.auth_timeout = timeout
            known = kh.known_types(address, port)
            if known:  # negotiate a key type we can verify, as OpenSSH does
                opts = t.get_security_options()
                opts.key_types = tuple(dict.fromkeys([k for k in known if k in opts.key_types] + list(opts.key_types)))
            try:
                t.start_client(timeout=timeout)
            except paramiko.SSHException as e:
                msg = str(e)
                if "banner" in msg.lower():
                    raise HostFailure(
                        HostStatus.TIMEOUT,
                        f"{what}no SSH banner within {timeout:g}s (the port accepts TCP but does not speak SSH)",
                    )
                if "timeout" in msg.lower() or "timed out" in msg.lower():
                    raise HostFailure(HostStatus.TIMEOUT, f"{what}SSH handshake timed out after {timeout:g}s")
                raise HostFailure(HostStatus.ERROR, f"{what}SSH handshake failed: {msg}")
            except (EOFError, OSError) as e:
                raise HostFailure(
                    HostStatus.ERROR, f"{what}connection closed during handshake: {e or type(e).__name__}"
                )
            if not t.is_active() or not t.is_authenticated() and t.host_key is None:
                # start_client returns quietly when its timeout passes first
                if not getattr(t, "remote_version", ""):
                    raise HostFailure(
                        HostStatus.TIMEOUT,
                        f"{what}no SSH banner within {timeout:g}s (the port accepts TCP but does not speak SSH)",
                    )
                raise HostFailure(HostStatus.TIMEOUT, f"{what}SSH key exchange not done within {timeout:g}s")
            key = t.get_remote_server_key()
            try:
                kh.check(address, port, key.get_name(), key.get_base64())
            except HostKeyMismatch as e:
                raise HostFailure(HostStatus.HOSTKEY_MISMATCH, f"{what}{e}")
            except HostKeyError as e:
                raise HostFailure(HostStatus.HOSTKEY_MISMATCH, f"{what}{e}")
            self._authenticate(t, user, s, timeout, what)
            ok = True
            return t
        finally:
            if not ok:
                t.close()

    def _authenticate(self, t: paramiko.Transport, user: str, s: SSHSettings, timeout: float, what: str) -> None:
        keys, notes = self._client_keys(s)
        for k in keys:
            try:
                t.auth_publickey(user, k)
            except paramiko.AuthenticationException:
                continue
            except paramiko.SSHException as e:
                if "timeout" in str(e).lower():
                    raise HostFailure(HostStatus.TIMEOUT, f"{what}authentication timed out after {timeout:g}s")
                raise HostFailure(HostStatus.ERROR, f"{what}authentication error: {e}")
            except (EOFError, OSError) as e:
                raise HostFailure(HostStatus.ERROR, f"{what}connection closed during authentication: {e}")
            if t.is_authenticated():
                return
        detail = f"{len(keys)} key(s) offered" + (f"; {'; '.join(notes)}" if notes else "")
        raise HostFailure(HostStatus.AUTH_FAILED, f"{what}server refused every key for user {user!r} ({detail})")

    def close(self) -> None:
        """Abort connects and handshakes in progress, close jump host connections."""
        self._closing = True
        with self._lock:
            inflight = list(self._inflight)
            self._inflight.clear()
        for sock in inflight:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in connect()
            except OSError:
                pass
            sock.close()
        with self._lock:
            pools = list(self._bastions.values())
            self._bastions.clear()
            agent, self._agent = self._agent, None
        for p in pools:
            p.close()
        if agent is not None:
            agent.close()
