"""Processes and cgroups of lab hosts: signal recorded PIDs, freeze, clean up.

Each host's process tree lives in the cgroup ``CGROUP`` (relative path) of
the ``name=systemd`` and ``unified`` (cgroup2) hierarchies.  Freezing uses
cgroup2's ``cgroup.freeze``; killing by cgroup is the fallback that makes
``lab down`` leave no process even when a recorded PID was lost.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
HIERARCHIES = ("systemd", "unified")


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (a zombie child is reaped)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def is_ours(pid: int, marker: str) -> bool:
    """True if ``pid`` is alive and its command line contains ``marker``.

    A recorded PID may have been reused after a crash or a reboot of this
    machine; the marker (the host's directory) proves it is still ours.
    """
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return marker.encode() in cmdline and alive(pid)


def signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def read_pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def cgroup_dirs(rel: str) -> list[Path]:
    """The existing directories of cgroup ``rel`` in the lab's hierarchies."""
    return [CGROUP_ROOT / h / rel for h in HIERARCHIES if (CGROUP_ROOT / h / rel).is_dir()]


def cgroup_pids(rel: str) -> set[int]:
    """Every PID in cgroup ``rel`` and its descendants (all hierarchies)."""
    pids: set[int] = set()
    for top in cgroup_dirs(rel):
        for d, _, _ in os.walk(top):
            try:
                text = Path(d, "cgroup.procs").read_text()
            except OSError:
                continue
            pids.update(int(x) for x in text.split())
    return pids


def freeze_cgroup(rel: str) -> bool:
    """Freeze every process of cgroup ``rel`` (cgroup2); False if unsupported."""
    return _set_frozen(rel, True)


def thaw_cgroup(rel: str) -> bool:
    return _set_frozen(rel, False)


def is_frozen(rel: str) -> bool:
    f = CGROUP_ROOT / "unified" / rel / "cgroup.freeze"
    try:
        return f.read_text().strip() == "1"
    except OSError:
        return False


def _set_frozen(rel: str, frozen: bool) -> bool:
    d = CGROUP_ROOT / "unified" / rel
    try:
        (d / "cgroup.freeze").write_text("1\n" if frozen else "0\n")
    except OSError:
        return False
    want = "frozen 1" if frozen else "frozen 0"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if want in (d / "cgroup.events").read_text():
                return True
        except OSError:
            return False
        time.sleep(0.02)
    return False


def kill_cgroup(rel: str, timeout_s: float = 5.0) -> None:
    """SIGKILL every process left in cgroup ``rel`` until it is empty or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = {p for p in cgroup_pids(rel) if alive(p)}
        if not pids or time.monotonic() > deadline:
            return
        for p in pids:
            signal_pid(p, signal.SIGKILL)
        time.sleep(0.05)


def remove_cgroup_tree(rel: str) -> None:
    """rmdir cgroup ``rel`` and its descendants, deepest first (empty ones only)."""
    for top in cgroup_dirs(rel):
        for d, _, _ in sorted(os.walk(top), key=lambda t: -len(Path(t[0]).parts)):
            try:
                os.rmdir(d)
            except OSError:
                pass
