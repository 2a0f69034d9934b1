"""A running lab as test suites and scripts use it (no pytest dependency).

``LabSession.start()`` brings the lab up (or finds it up) and gives the
inventory path, the hosts and :meth:`LabSession.run` to run a command on a
host over real SSH.  ``tests/support/lab_fixture.py`` wraps it in a session-scoped
fixture that tiers 2 and 3 share.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.lab import manager, ready
from clusterctl.lab.config import HostSpec, LabConfig


def unavailable_reason() -> str | None:
    """Why no lab can run here (``None`` when one can): not root, no nspawn."""
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, mounts, systemd-nspawn)"
    if shutil.which("systemd-nspawn") is None:
        return "systemd-nspawn is not installed (apt package systemd-container)"
    return None


@dataclass
class LabSession:
    cfg: LabConfig
    hosts: list[HostSpec] = field(default_factory=list)
    up_result: manager.UpResult | None = None

    @classmethod
    def start(
        cls, cfg: LabConfig, hosts: int = 4, gpus_per_host: int = 8, on_event: Callable[[str], None] = lambda s: None
    ) -> "LabSession":
        res = manager.up(cfg, hosts=hosts, gpus_per_host=gpus_per_host, on_event=on_event)
        return cls(cfg, [h.spec for h in res.state.hosts], res)

    def stop(self, on_event: Callable[[str], None] = lambda s: None) -> None:
        manager.down(self.cfg, on_event=on_event)

    @property
    def inventory(self) -> Path:
        return self.cfg.inventory_file

    @property
    def lab_dir(self) -> Path:
        return self.cfg.lab_dir

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def host(self, name: str) -> HostSpec:
        return next(h for h in self.hosts if h.name == name)

    def host_dir(self, name: str) -> Path:
        return self.cfg.hosts_dir / name

    def ssh_argv(self, name: str, command: str, user: str = "root") -> list[str]:
        return ready.ssh_argv(self.cfg, self.host(name), command, user=user)

    def run(
        self,
        name: str,
        command: str,
        *,
        user: str = "root",
        timeout: float = 30,
        input: str | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run the shell ``command`` on host ``name`` over SSH (OpenSSH client).

        Raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds and, with
        ``check``, ``CalledProcessError`` on a non-zero status.
        """
        return subprocess.run(
            self.ssh_argv(name, command, user),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
