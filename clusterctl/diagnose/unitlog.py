"""Why an instance's unit is down, from its journal and systemd's ``Result=``.

Shared by ``clusterctl status`` / ``gateway sync`` (the deploy node program's
read returns the journal tail of a unit that is not running) and doctor's
``serving.unit`` check (the instance's journal in the snapshot).

:func:`down_reason` reads two things: what systemd did last (the lines
systemd 230-256 writes for a service: ``Main process exited, code=exited,
status=1/FAILURE``, ``Deactivated successfully``, ``Start request repeated
too quickly``, ``Stopped ...``, ``Scheduled restart job``) and vLLM's root
cause: the first ``XxxError: ...`` line of the last run, skipping vLLM's
``RuntimeError: Engine core initialization failed. See root cause above``,
which only points back at it; or the refusal of clusterctl's own start-up
checks (``verify-model: refusing to start: ...``, ``check-gpus: ...``).
"""

from __future__ import annotations

import re

_EXITED = re.compile(r"(?P<which>Main|Control) process exited, code=(?P<code>\w+), status=(?P<status>[\w/+-]+)")
#: clusterctl's own ExecStartPre refusals (verify-model, check-gpus): "<tool>: refusing to start: why".
_REFUSED = re.compile(r"(?P<tool>verify-model|check-gpus): refusing to start: (?P<why>.+)")
_EXCEPTION = re.compile(r"(?P<kind>(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception)): (?P<msg>.+)")
_RUN_START = re.compile(r"(^|: )(Started|Starting) |: Scheduled restart job")


def _systemd_part(lines: list[str], result: str, exit_status: str) -> str | None:
    for line in reversed(lines):
        if "Start request repeated too quickly" in line or result == "start-limit-hit":
            return "systemd gave up restarting it: start request repeated too quickly (a crash loop)"
        m = _EXITED.search(line)
        if m:
            if m["which"] == "Control":
                return f"a start-up check (ExecStartPre) failed with status {m['status']}"
            if m["code"] == "exited":
                st = m["status"]
                if st.split("/")[0] == "0":
                    return "the process exited with status 0 (vLLM does so when its engine dies)"
                return f"the process exited with status {st}"
            return f"the process was {m['code']} (signal {m['status']})"
        if "Deactivated successfully" in line:
            return "the process exited with status 0 (vLLM does so when its engine dies)"
        if line.startswith(("Stopped ", "Stopping ")) or ": Stopped " in line or ": Stopping " in line:
            return "stopped on request (systemctl stop)"
    if result and result != "success":
        return f"systemd result: {result}" + (f", exit status {exit_status}" if exit_status not in ("", "0") else "")
    return None


def root_cause(lines: list[str]) -> str | None:
    """vLLM's first exception of the last run that logged one (``Kind: message``, at most 240 characters)."""
    starts = [0] + [i for i, line in enumerate(lines) if _RUN_START.search(line)]
    for begin, end in reversed(list(zip(starts, starts[1:] + [len(lines)]))):
        found = []
        for line in lines[begin:end]:
            refused = _REFUSED.search(line)
            if refused:
                return f"{refused['tool']}: {refused['why'].strip()}"[:240]
            m = _EXCEPTION.search(line)
            if m:
                found.append(f"{m['kind']}: {m['msg'].strip()}")
        if found:
            useful = [f for f in found if "See root cause above" not in f]
            pick = useful[0] if useful else found[-1]
            return pick if len(pick) <= 240 else pick[:237] + "..."
    return None


def down_reason(journal: str, result: str = "", exit_status: str = "") -> str:
    """One line: what systemd did and vLLM's root cause; "no reason in the journal" when neither is there."""
    lines = [ln for ln in journal.splitlines() if ln.strip()]
    parts = [p for p in (_systemd_part(lines, result, exit_status), root_cause(lines)) if p]
    return "; ".join(parts) if parts else "no reason in the journal"
