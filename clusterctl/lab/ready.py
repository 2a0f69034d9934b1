"""Wait until lab hosts are up: sshd answers and systemd finished booting.

A host is *ready* when ``systemctl is-system-running --wait`` prints
``running`` over a real SSH login (OpenSSH client, strict host key check
against the lab's ``known_hosts``).  ``degraded`` is reported with the failed
units, since a test suite on a degraded host tests the wrong thing.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from clusterctl.lab.config import HostSpec, LabConfig

#: Seconds between TCP probes of a host's port 22 while it boots.
POLL_S = 0.1


@dataclass
class HostReadiness:
    name: str
    state: str  # running, degraded, ..., or "unreachable"
    detail: str = ""
    seconds: float = 0.0


def ssh_argv(
    cfg: LabConfig,
    h: HostSpec,
    command: str | None = None,
    *,
    user: str = "root",
    connect_timeout: float = 5,
    tty: bool = False,
) -> list[str]:
    """An OpenSSH client command line for host ``h``: the lab key, strict host keys.

    ``command`` is passed to the remote shell as one string; quote its parts
    with :func:`shlex.quote` before building it.
    """
    argv = [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(cfg.key_file),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={cfg.known_hosts}",
        "-o",
        "LogLevel=ERROR",
        "-o",
        f"ConnectTimeout={int(connect_timeout)}",
    ]
    argv += ["-t"] if tty else ["-o", "BatchMode=yes"]
    argv.append(f"{user}@{h.address}")
    if command is not None:
        argv += ["--", command]
    return argv


def _port_open(address: str, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=timeout):
            return True
    except OSError:
        return False


def wait_host(cfg: LabConfig, h: HostSpec, deadline: float) -> HostReadiness:
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        if not _port_open(h.address):
            time.sleep(POLL_S)
            continue
        left = max(1.0, deadline - time.monotonic())
        try:
            cp = subprocess.run(
                ssh_argv(cfg, h, "systemctl is-system-running --wait"),
                capture_output=True,
                text=True,
                timeout=left,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            break
        state = cp.stdout.strip()
        if state == "running":
            return HostReadiness(h.name, state, seconds=time.monotonic() - t0)
        if state in ("degraded", "maintenance", "stopping", "offline"):
            failed = subprocess.run(
                ssh_argv(cfg, h, "systemctl --failed --no-legend --plain"),
                capture_output=True,
                text=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
            )
            units = " ".join(line.split()[0] for line in failed.stdout.splitlines() if line.strip())
            return HostReadiness(h.name, state, f"failed units: {units or '?'}", time.monotonic() - t0)
        # sshd up before the login path is complete: try again shortly.
        time.sleep(POLL_S)
    return HostReadiness(h.name, "unreachable", "no answer before the deadline", time.monotonic() - t0)


def wait_all(
    cfg: LabConfig,
    hosts: Sequence[HostSpec],
    timeout_s: float,
    on_ready: Callable[[HostReadiness], None] = lambda r: None,
) -> list[HostReadiness]:
    """Wait for every host in parallel, at most ``timeout_s`` seconds in all."""
    deadline = time.monotonic() + timeout_s
    results: list[HostReadiness] = []
    with ThreadPoolExecutor(max_workers=min(64, max(1, len(hosts)))) as ex:
        futures = [ex.submit(wait_host, cfg, h, deadline) for h in hosts]
        for f in futures:
            r = f.result()
            on_ready(r)
            results.append(r)
    return results
