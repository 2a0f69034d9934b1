"""Run a system command for the lab and turn failures into :class:`LabError`.

Every lab step that touches the machine (``ip``, ``mount``, ``debootstrap``,
``tc``, ``nft``) goes through :func:`run`, so a failure names the command
and shows the tail of its stderr instead of a traceback.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence

from clusterctl.errors import LabError

#: Default limit for one lab command, in seconds.
DEFAULT_TIMEOUT_S = 60.0


def run(
    argv: Sequence[str], *, check: bool = True, input: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (no shell) and return the completed process.

    With ``check`` (default) a non-zero exit, a missing binary or a time-out
    raises :class:`LabError` naming the command and the last stderr lines.
    """
    try:
        cp = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise LabError(f"{argv[0]}: command not found (is it installed?)") from e
    except subprocess.TimeoutExpired as e:
        raise LabError(f"`{shlex.join(argv)}` did not finish within {timeout:.0f} s") from e
    if check and cp.returncode != 0:
        tail = "\n".join((cp.stderr or cp.stdout or "").strip().splitlines()[-8:])
        raise LabError(f"`{shlex.join(argv)}` failed (rc {cp.returncode}): {tail}")
    return cp


def ok(argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S) -> bool:
    """Run ``argv`` and report whether it exited 0 (never raises on failure)."""
    try:
        return run(argv, check=False, timeout=timeout).returncode == 0
    except LabError:
        return False
