"""Kernel log lines (NVRM Xid, OOM killer, mlx5 link) appended to one lab host's log.

The hosts share the control machine's kernel, so real kernel messages would
appear on every host; injected ones go instead to the host's own
``/var/log/kern.log`` in rsyslog's format, a file the probe also reads on real
nodes.  Each line is appended with one ``write`` so no reader sees half a line.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path

from clusterctl.errors import LabError

KERN_LOG = "var/log/kern.log"


def kern_log_path(host_dir: Path) -> Path:
    """Where the host's ``/var/log/kern.log`` is on the control side.

    The merged overlay root (``host_dir/root``) while the host runs, else the
    overlay's upper directory (``host_dir/upper``), which becomes visible at the
    next boot.  Raises :class:`LabError` when neither exists.
    """
    host_dir = Path(host_dir)
    if (host_dir / "root" / "etc").is_dir():
        return host_dir / "root" / KERN_LOG
    if (host_dir / "upper").is_dir():
        return host_dir / "upper" / KERN_LOG
    raise LabError(f"{host_dir}: no root file system (neither root/ nor upper/) to write kern.log into")


def uptime_s() -> float:
    """Seconds since boot of the shared kernel (what dmesg timestamps count)."""
    with open("/proc/uptime", encoding="ascii") as f:
        return float(f.read().split()[0])


def syslog_line(hostname: str, message: str, now: float | None = None, uptime: float | None = None) -> str:
    """One kern.log line as Debian 12's rsyslog writes it (RFC 3339 time, kernel timestamp)."""
    t = time.time() if now is None else now
    up = uptime_s() if uptime is None else uptime
    stamp = datetime.fromtimestamp(t, timezone.utc).astimezone().isoformat(timespec="microseconds")
    return f"{stamp} {hostname} kernel: [{up:12.6f}] {message}\n"


def append(host_dir: Path, hostname: str, messages: list[str]) -> Path:
    """Append kernel ``messages`` for ``hostname`` to its kern.log; returns the file's path."""
    path = kern_log_path(host_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(syslog_line(hostname, m) for m in messages)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
    return path
