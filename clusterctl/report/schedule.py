"""Unit files (or a cron line) that run ``clusterctl report run`` on a schedule.

The service is ``Type=oneshot``; the run itself takes a lock, so a timer that
fires while a slow run is still going never races it (systemd also never
starts a oneshot unit that is still active).  Every value that reaches a
command line is quoted with :func:`shlex.quote`; a value holding a control
character (a newline would start a new ``ExecStartPost=`` or cron line) is
refused, and ``--user`` must be a plain user name.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from clusterctl.deploy.units.sdquote import systemd_quote
from clusterctl.errors import ClusterctlError

_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\-]+$")


#: ``--on-calendar`` shorthands that cron can express too (minute hour day month weekday).
CRON_CALENDAR = {"hourly": "0 * * * *", "daily": "0 0 * * *", "weekly": "0 0 * * 1"}

_CALENDAR = re.compile(r"^[A-Za-z0-9 :*/,.~+-]{1,100}$")
#: A user name systemd's ``User=`` and cron's user field take (useradd's default rule, plus '.').
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$")
#: Characters no argument of the scheduled command may hold (C0/C1 controls, DEL, Unicode line breaks).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass(frozen=True)
class Schedule:
    """Every ``every_min`` minutes after the last run, or at ``on_calendar`` (a systemd calendar
    expression such as ``daily`` or ``Mon..Fri 06:00``; then ``every_min`` is not used)."""

    argv: tuple[str, ...]
    every_min: int = 5
    name: str = "clusterctl-report"
    user: str | None = None
    on_calendar: str | None = None

    def __post_init__(self) -> None:
        if not _UNIT_NAME.fullmatch(self.name):
            raise ClusterctlError(f"bad unit name {self.name!r}: letters, digits, ':', '_', '.', '-' only")
        if not 1 <= self.every_min <= 1440:
            raise ClusterctlError(f"--every must be 1 to 1440 minutes (got {self.every_min})")
        for arg in self.argv:
            bad = _CONTROL.search(arg)
            if bad:
                raise ClusterctlError(
                    f"{arg!r}: a control character (U+{ord(bad.group()):04X}) cannot be part of "
                    "a scheduled command (it would start a new line of the unit or cron entry)"
                )
        if self.user is not None and not _USER.fullmatch(self.user):
            raise ClusterctlError(f"--user {self.user!r}: not a user name (lower-case letters, digits, '_', '-', '.')")
        if self.on_calendar is not None and not _CALENDAR.fullmatch(self.on_calendar):
            raise ClusterctlError(
                f"--on-calendar {self.on_calendar!r}: not a systemd calendar expression "
                "(e.g. daily, hourly, 'Mon..Fri 06:00')"
            )

    @property
    def command(self) -> str:
        return " ".join(shlex.quote(a) for a in self.argv)


def _exec_line(s: Schedule) -> str:
    """The command for ``ExecStart=``: each word quoted for systemd (its C escapes, ``%``, ``$``)."""
    return " ".join(systemd_quote(a) for a in s.argv)


def service_unit(s: Schedule) -> str:
    user = f"User={s.user}\n" if s.user else ""
    return (
        f"[Unit]\nDescription=clusterctl health report\nAfter=network-online.target\n"
        f"Wants=network-online.target\n\n[Service]\nType=oneshot\n{user}"
        f"ExecStart={_exec_line(s)}\n"
        # the report's exit code is the cluster's health, not a unit failure
        "SuccessExitStatus=1 2 3\nNice=10\nTimeoutStartSec=30min\n"
    )


def timer_unit(s: Schedule) -> str:
    if s.on_calendar is not None:
        # Persistent=: a run missed while the host was down happens at the next boot
        return (
            f"[Unit]\nDescription=Run {s.name} at {s.on_calendar}\n\n"
            f"[Timer]\nOnCalendar={s.on_calendar}\nRandomizedDelaySec=5min\nPersistent=true\n\n"
            f"[Install]\nWantedBy=timers.target\n"
        )
    return (
        f"[Unit]\nDescription=Run the clusterctl health report every {s.every_min} min\n\n"
        f"[Timer]\nOnBootSec=2min\nOnUnitActiveSec={s.every_min}min\nAccuracySec=30s\nPersistent=true\n\n"
        f"[Install]\nWantedBy=timers.target\n"
    )


def cron_line(s: Schedule) -> str:
    """A line for /etc/cron.d (with a user field): every ``every_min`` minutes, or at ``on_calendar``
    (only the :data:`CRON_CALENDAR` names; others raise), output discarded."""
    if s.on_calendar is not None:
        if s.on_calendar not in CRON_CALENDAR:
            raise ClusterctlError(
                f"--on-calendar {s.on_calendar!r} with --cron: use one of "
                f"{', '.join(CRON_CALENDAR)} (or a systemd timer)"
            )
        when = CRON_CALENDAR[s.on_calendar]
    else:
        minute = "*" if s.every_min == 1 else (f"*/{s.every_min}" if s.every_min < 60 else "0")
        hour = "*" if s.every_min <= 60 else f"*/{s.every_min // 60}"
        when = f"{minute} {hour} * * *"
    # cron treats % as a newline: escape it
    cmd = s.command.replace("%", "\\%")
    return (
        f"# clusterctl health report (installed by clusterctl report install-timer --cron)\n"
        f"{when} {s.user or 'root'} {cmd} >/dev/null 2>&1\n"
    )
