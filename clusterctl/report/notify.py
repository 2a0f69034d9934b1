"""``--notify-cmd``: tell a person when problems change, and again while they last.

As NHC's nhc-wrapper: the command runs only when something changed (a problem
new, resolved or escalated) or when a problem has lasted ``renotify_s``
since it was last notified.  It receives the JSON of what changed on stdin
and runs without a shell (``shlex.split``), so nothing is interpolated.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass
from typing import Any

from clusterctl.diagnose.findings import Finding
from clusterctl.errors import ClusterctlError
from clusterctl.report.diff import Diff, Key, key

#: Seconds a notify command may run before it is killed.
NOTIFY_TIMEOUT_S = 60.0
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``"6h"``, ``"30m"``, ``"1d"``, ``"90s"`` or plain seconds → seconds (0 turns re-notifying off)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise ClusterctlError(f"bad duration {text!r}: use a number with s, m, h or d (e.g. 6h)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


@dataclass
class Decision:
    """Whether to notify, the payload to send, and the notification state to store afterwards."""

    send: bool
    payload: dict[str, Any]
    state: dict[Key, tuple[str, float]]


def decide(
    change: Diff,
    current: list[Finding],
    state: dict[Key, tuple[str, float]],
    *,
    now: float,
    renotify_s: float,
    run: dict[str, Any] | None = None,
) -> Decision:
    """Notify on change, or re-notify the problems last notified ``renotify_s`` ago or more."""
    problems = {key(f): f for f in change.new + change.ongoing}
    # never notified (an earlier command failed) or last notified renotify_s ago
    due = [f for k, f in problems.items() if k not in state or (renotify_s > 0 and now - state[k][1] >= renotify_s)]
    send = change.changed or bool(due)
    new_state: dict[Key, tuple[str, float]] = {}
    for k, f in problems.items():
        if send or k not in state:
            new_state[k] = (f.severity.name, now)
        else:
            new_state[k] = state[k]
    payload = {
        "reason": "change" if change.changed else "renotify",
        "run": run or {},
        **change.to_json(),
        "reminder": [f.to_json() for f in due if f not in change.new],
    }
    return Decision(send, payload, new_state)


def run_notify(cmd: str, payload: dict[str, Any], timeout_s: float = NOTIFY_TIMEOUT_S) -> str | None:
    """Run ``cmd`` with the JSON on stdin; ``None`` on success, else why it failed (never raises)."""
    try:
        argv = shlex.split(cmd)
    except ValueError as e:
        return f"--notify-cmd: {e}"
    if not argv:
        return "--notify-cmd is empty"
    try:
        p = subprocess.run(argv, input=json.dumps(payload), text=True, capture_output=True, timeout=timeout_s)
    except FileNotFoundError:
        return f"--notify-cmd: {argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return f"--notify-cmd: {argv[0]}: still running after {timeout_s:g} s, killed"
    except OSError as e:
        return f"--notify-cmd: {argv[0]}: {e.strerror}"
    if p.returncode != 0:
        tail = (p.stderr or "").strip().splitlines()[-1:] or [""]
        return f"--notify-cmd: {argv[0]} exited {p.returncode}: {tail[0]}"
    return None
