"""Unit files (or a cron line) that run ``clusterctl report run`` on a schedule.

The service is ``Type=oneshot``; the run itself takes a lock, so a timer that
fires while a slow run is still going never races it (systemd also never
starts a oneshot unit that is still active).  Every value that reaches a
command line is quoted with :func:`shlex.quote`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from clusterctl.errors import ClusterctlError

_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\-]+$")


@dataclass(frozen=True)
class Schedule:
    """``every``: a systemd time span (``5min``) for the timer, or minutes for cron."""

    argv: tuple[str, ...]
    every_min: int = 5
    name: str = "clusterctl-report"
    user: str | None = None

    def __post_init__(self) -> None:
        if not _UNIT_NAME.match(self.name):
            raise ClusterctlError(f"bad unit name {self.name!r}: letters, digits, ':', '_', '.', '-' only")
        if not 1 <= self.every_min <= 1440:
            raise ClusterctlError(f"--every must be 1 to 1440 minutes (got {self.every_min})")

    @property
    def command(self) -> str:
        return " ".join(shlex.quote(a) for a in self.argv)


def _systemd_escape(cmd: str) -> str:
    # systemd expands % specifiers and $VARIABLES in ExecStart=
    return cmd.replace("%", "%%").replace("$", "$$")


def service_unit(s: Schedule) -> str:
    user = f"User={s.user}\n" if s.user else ""
    return (f"[Unit]\nDescription=clusterctl health report\nAfter=network-online.target\n"
            f"Wants=network-online.target\n\n[Service]\nType=oneshot\n{user}"
            f"ExecStart={_systemd_escape(s.command)}\n"
            # the report's exit code is the cluster's health, not a unit failure
            "SuccessExitStatus=1 2 3\nNice=10\nTimeoutStartSec=30min\n")


def timer_unit(s: Schedule) -> str:
    return (f"[Unit]\nDescription=Run the clusterctl health report every {s.every_min} min\n\n"
            f"[Timer]\nOnBootSec=2min\nOnUnitActiveSec={s.every_min}min\nAccuracySec=30s\nPersistent=true\n\n"
            f"[Install]\nWantedBy=timers.target\n")


def cron_line(s: Schedule) -> str:
    """A line for /etc/cron.d (with a user field): every ``every_min`` minutes, output to syslog via logger."""
    minute = "*" if s.every_min == 1 else (f"*/{s.every_min}" if s.every_min < 60 else "0")
    hour = "*" if s.every_min <= 60 else f"*/{s.every_min // 60}"
    # cron treats % as a newline: escape it
    cmd = s.command.replace("%", "\\%")
    return (f"# clusterctl health report (installed by clusterctl report install-timer --cron)\n"
            f"{minute} {hour} * * * {s.user or 'root'} {cmd} >/dev/null 2>&1\n")
