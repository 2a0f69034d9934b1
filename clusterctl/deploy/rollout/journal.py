"""The first error of an instance's current run, read from its unit's journal.

When a unit dies (a failed ``start``, a gate that sees the unit fail or
restart), the operator needs why, not systemd's "see journalctl -xeu".
:func:`first_error` reads, on the instance's host, the journal lines of the
unit's latest invocation (``_SYSTEMD_INVOCATION_ID`` of its ``InvocationID``:
what the engine itself printed in this run) and, when those say nothing,
the unit's last lines (systemd's own messages: a missing executable, the
start limit).  :func:`pick_error` chooses the line to show: the first
exception line (``ValueError: ...``, ``torch.OutOfMemoryError: ...``), else
the first ``ERROR``/``CRITICAL`` log line, else the first line that says
``failed``, else the run's last line (``verify-model: refusing to start:
...`` from the unit's ExecStartPre), and only then systemd's own lines.  Never raises: an unreadable host is a sentence.
"""

from __future__ import annotations

import re

from clusterctl.deploy.spec import unit_name
from clusterctl.fleet import shell
from clusterctl.fleet.fleet import Fleet

#: Lines of one run read back (the end of a long run is where it died).
MAX_LINES = 400
#: Characters of the chosen line shown.
MAX_CHARS = 300
_SEP = "--clusterctl-unit-tail--"
_EXCEPTION = re.compile(r"(?:^|\s)(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)(?::\s|$)")
_LEVEL = re.compile(r"\b(?:ERROR|CRITICAL|FATAL)\b")
_FAILED = re.compile(r"\b(?:[Ff]ailed|[Ee]rror|died|[Kk]illed|[Ss]tart request repeated too quickly)")


def journal_command(instance: str, lines: int = MAX_LINES) -> str:
    """The shell command printing the latest run's lines, a separator, then the unit's last lines."""
    u = shell.quote(unit_name(instance))
    return (
        f"id=$(systemctl show -p InvocationID --value {u} 2>/dev/null); "
        f"if [ -n \"$id\" ]; then journalctl --no-pager -o cat -n {lines} _SYSTEMD_INVOCATION_ID=\"$id\" "
        f"2>/dev/null; fi; echo {_SEP}; journalctl --no-pager -o cat -n 40 -u {u} 2>/dev/null; true"
    )


def pick_error(text: str) -> str | None:
    """The line that says why (module doc), trimmed; ``None`` when no line looks like an error."""
    run, _, tail = text.partition(_SEP)
    for part in (run, tail):
        lines = [ln.strip() for ln in part.splitlines() if ln.strip()]
        for rx in (_EXCEPTION, _LEVEL, _FAILED):
            for ln in lines:
                m = rx.search(ln)
                if m and not ln.startswith("Traceback"):
                    if rx is _EXCEPTION:  # from the exception on: vLLM's "ERROR date [file:line]" prefix says nothing
                        ln = ln[m.start() :].strip()
                    return _trim(ln)
        if part is run and lines:
            return _trim(lines[-1])  # what the run printed last before it ended says more than systemd
    return None


def _trim(line: str) -> str:
    return line[:MAX_CHARS] + ("..." if len(line) > MAX_CHARS else "")


def first_error(fleet: Fleet, host: str, instance: str, timeout: float = 30.0) -> str:
    """``first error in the journal: LINE`` for ``instance`` on ``host``, or why there is none."""
    r = fleet.run({host: journal_command(instance)}, sudo=True, timeout=timeout)[host]
    if r.rc is None:
        return f"journal not readable on {host}: {r.error or r.status.value}"
    line = pick_error(r.stdout or "")
    if line is None:
        return f"no error line in the journal of {unit_name(instance)} (journalctl -u {unit_name(instance)} on {host})"
    return f"first error in the journal: {line}"
