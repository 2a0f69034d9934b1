"""Real OpenSSH servers on loopback addresses for tier-2 tests.

Built on the light lab (``clusterctl.lab.light``): every server is a real
``/usr/sbin/sshd`` in its own mount/UTS/PID namespace on ``127.x.y.z:22``
with a fresh host key.  Also here: a TCP server that accepts and never
speaks SSH, and a listener whose accept queue is full (connects hang as
with a host that drops packets).  Needs root; callers skip otherwise.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

from clusterctl.inventory.model import Host, SSHSettings
from clusterctl.lab import light


def can_run() -> str | None:
    """``None`` when real sshd tests can run here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root (starts sshd in new namespaces)"
    if not os.access(light.SSHD, os.X_OK):
        return f"{light.SSHD} is not installed"
    return None


class SshdHarness:
    """A set of sshd hosts under a root-owned directory; ``close()`` stops them all."""

    def __init__(self, base: str = "127.77"):
        self.dir = Path(tempfile.mkdtemp(prefix="harness-", dir=self._parent()))
        os.chmod(self.dir, 0o755)
        self.base = base
        self.key, self.pubkey = light.client_key(self.dir)
        self.known_hosts = self.dir / "known_hosts"
        self.known_hosts.touch()
        self.specs: dict[str, light.HostSpec] = {}
        self.host_keys: dict[str, str] = {}
        self._servers: list[socket.socket] = []
        self._held: list[socket.socket] = []

    @staticmethod
    def _parent() -> Path:
        p = Path("/var/lib/clusterctl-lab/test-sshd")
        p.mkdir(parents=True, exist_ok=True, mode=0o755)
        return p

    def start(self, specs: list[light.HostSpec], *, record_keys: bool = True) -> None:
        keys = light.start_hosts(self.dir, specs, client_pubkey=self.pubkey)
        for s in specs:
            self.specs[s.name] = s
        self.host_keys.update(keys)
        if record_keys:
            with open(self.known_hosts, "a") as f:
                for s in specs:
                    f.write(f"{s.address} {keys[s.name]}\n")

    def host(self, name: str, address: str | None = None, **ssh: object) -> Host:
        """A Host for ``name`` with the harness key and known_hosts, overridable."""
        settings = SSHSettings(
            user="root",
            port=22,
            identity_file=str(self.key),
            known_hosts=str(self.known_hosts),
            host_key_policy="strict",
            connect_timeout=5,
        )
        settings = replace(settings, **ssh)  # type: ignore[arg-type]
        spec = self.specs.get(name)
        return Host(name, address or (spec.address if spec else "127.0.0.1"), ssh=settings)

    def log(self, name: str) -> str:
        return (self.dir / "hosts" / name / "sshd.log").read_text(errors="replace")

    def silent_server(self, address: str, port: int = 22) -> None:
        """Accept TCP connections and never send a byte (not an SSH server)."""
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((address, port))
        srv.listen(16)
        self._servers.append(srv)

        def accept() -> None:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                self._held.append(conn)

        threading.Thread(target=accept, daemon=True).start()

    def blackhole(self, address: str, port: int = 22) -> None:
        """A listener whose accept queue is full: new SYNs are dropped, connects hang."""
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((address, port))
        srv.listen(0)
        self._servers.append(srv)
        for _ in range(3):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex((address, port))
            self._held.append(c)

    def close(self) -> None:
        for s in self._held + self._servers:
            s.close()
        try:
            light.stop_hosts(self.dir)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
