"""Supervisor of one lab host: ``python3 -m clusterctl.lab.hostrun``.

Usage: ``hostrun CGROUP PIDFILE -- systemd-nspawn ARGS...``

1. Moves itself into its own cgroup ``CGROUP`` (a path relative to the
   ``name=systemd`` and ``unified`` hierarchies), so that every nspawn gets
   its own ``supervisor``/``payload`` cgroups instead of sharing one (lab.md P10).
2. Runs the nspawn command, writing its PID to ``PIDFILE``.
3. Relaunches it when the container rebooted (nspawn exits 133), so
   ``systemctl reboot`` on a host behaves like a reboot.
4. On SIGTERM/SIGINT forwards SIGTERM to nspawn (a clean poweroff of the
   container) and exits with nspawn's status.

Exit status: nspawn's last exit status (0 after a poweroff).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
HIERARCHIES = ("systemd", "unified")
#: systemd-nspawn's exit status when the container asked for a reboot.
REBOOT_STATUS = 133
#: Relaunch at most this many reboots per minute (a crash loop stops).
MAX_REBOOTS_PER_MINUTE = 5


def join_cgroup(rel: str) -> None:
    for h in HIERARCHIES:
        base = CGROUP_ROOT / h
        if not base.is_dir():
            continue
        d = base / rel
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text(f"{os.getpid()}\n")


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: hostrun CGROUP PIDFILE -- COMMAND...", file=sys.stderr)
        return 2
    cgroup, pidfile, cmd = argv[0], Path(argv[1]), argv[3:]
    join_cgroup(cgroup)
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    reboots: list[float] = []
    while True:
        child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        tmp = pidfile.with_name(pidfile.name + ".tmp")
        tmp.write_text(f"{child.pid}\n")
        tmp.rename(pidfile)
        if stopping:  # a signal arrived while we were starting it
            child.send_signal(signal.SIGTERM)
        rc = child.wait()
        now = time.monotonic()
        reboots = [t for t in reboots if now - t < 60] + [now]
        if stopping or rc != REBOOT_STATUS or len(reboots) > MAX_REBOOTS_PER_MINUTE:
            pidfile.unlink(missing_ok=True)
            return rc
        print(f"hostrun: container rebooted (status {rc}); starting it again", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
