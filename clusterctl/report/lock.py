"""An exclusive ``flock`` so two scheduled report runs never overlap.

The lock is advisory and dies with the process (the kernel releases it), so a
crashed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from clusterctl.errors import ClusterctlError


class LockBusy(ClusterctlError):
    """Another run holds the lock and ``wait_s`` passed."""


class RunLock:
    """``with RunLock(path, wait_s=0):`` — exclusive lock on ``path`` (created 0600).

    ``wait_s`` is how long to wait for another holder, in seconds (0: fail at
    once); :class:`LockBusy` names the lock file when it cannot be taken.
    """

    def __init__(self, path: str | Path, wait_s: float = 0.0) -> None:
        self.path = Path(path)
        self.wait_s = wait_s
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        end = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    os.close(fd)
                    raise LockBusy(f"{self.path}: another report run holds the lock") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
