"""File helpers every part shares: atomic writes and an exclusive run lock.

Nothing a user or vLLM reads is ever half-written: :func:`write_atomic` writes a
temporary file in the target's directory and renames it over the target.
:class:`RunLock` is an advisory ``flock`` that dies with its process (the kernel
releases it), so a crashed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path
from types import TracebackType

from clusterctl.errors import ClusterctlError


def write_atomic(path: str | Path, text: str, mode: int = 0o644, *, make_dirs: bool = True) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename (readers see old or new, never half);
    ``make_dirs``: create missing parent directories (else a missing one is an OSError)."""
    target = Path(path)
    if make_dirs:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


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
