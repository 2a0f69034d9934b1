"""What is wrong now: log findings of the current run, history, acknowledgements.

A finding read from a log line belongs to what runs now: a unit's journal line
counts from the unit's last start (systemd's ``Starting UNIT`` line, or a
``-- Boot``/``-- Reboot --`` marker, in the ``journalctl -o short-iso`` text),
a kernel line from the current boot (the facts' ``boot_id`` where the lines
carry one, else after the last ``Linux version`` banner or boot marker).  An
operator's ``since`` (epoch seconds; ``doctor --since``) widens the window to
every line stamped at or after it.

:func:`split_context` gives the context of the current lines and the context
of the older ones; :func:`settle` turns the older ones' problems into OK rows
``history: ...`` (never current CRIT), and acknowledged findings into OK rows
``acknowledged until ...`` (see :mod:`clusterctl.diagnose.acks`).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import replace
from typing import Callable, Iterable

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext
from clusterctl.diagnose.sources import KERNEL_LOG
from clusterctl.probe.factgroups import KernelLog, KernelLogFact
from clusterctl.diagnose.sources import unit_name

_TS = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:?\d{2}|Z)?)\s")
_BOOT = re.compile(r"^-- (?:Boot [0-9a-f]+|Reboot) --")
_BANNER = re.compile(r"\bkernel: Linux version \d|^\[\s*0\.0+\] Linux version \d|^Linux version \d")

HISTORY = "history: "


def line_time(line: str) -> float | None:
    """Epoch seconds of a ``short-iso`` (or ISO-prefixed) line, else None."""
    m = _TS.match(line)
    if not m:
        return None
    text = m.group(1).replace("Z", "+00:00")
    if re.search(r"[+-]\d{4}$", text):
        text = text[:-2] + ":" + text[-2:]
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    return t.timestamp()


def _split(lines: list[str], is_start: Callable[[str], bool], since: float | None) -> tuple[list[str], list[str]]:
    start = 0
    for i, line in enumerate(lines):
        if is_start(line):
            start = i
    if since is not None:
        for i, line in enumerate(lines[:start]):
            t = line_time(line)
            if t is not None and t >= since:
                start = i
                break
    return lines[:start], lines[start:]


def split_unit_log(text: str, unit: str, since: float | None = None) -> tuple[str, str]:
    """``(history, current)`` of a unit's journal text: current from its last start.

    ``journalctl -u UNIT`` shows only systemd's messages about UNIT, and systemd
    before 250 names the unit by its description (``Starting vLLM qwen-a...``), so
    any ``systemd[PID]: Starting`` line of the text (or one naming ``unit``) is a start."""
    starting = re.compile(r"systemd\[\d+\]: Starting (?:" + re.escape(unit) + r"\b|.*\.\.\.$)")

    def is_start(line: str) -> bool:
        return bool(starting.search(line) or _BOOT.match(line))

    old, now = _split(text.splitlines(), is_start, since)
    return "".join(x + "\n" for x in old), "".join(x + "\n" for x in now)


def split_kernel_lines(lines: list[str], since: float | None = None) -> tuple[list[str], list[str]]:
    """``(history, current)`` kernel-log lines: current from the last boot banner or marker."""
    return _split(lines, lambda x: bool(_BANNER.search(x) or _BOOT.match(x)), since)


def _facts_kernel(kl: KernelLog, since: float | None) -> tuple[list[str], list[str]] | None:
    """The probe's kernel-log lines split by their boot id (and time), or None without them."""
    if not kl.source:
        return None
    old: list[str] = []
    now: list[str] = []
    for x in kl.lines:
        other_boot = bool(kl.boot_id and x.boot_id and x.boot_id != kl.boot_id)
        wanted = since is not None and x.time is not None and x.time >= since
        (old if other_boot and not wanted else now).append(x.text)
    o2, n2 = split_kernel_lines(now, since)
    return old + o2, n2


def split_context(ctx: AnalysisContext, since: float | None = None) -> tuple[AnalysisContext, AnalysisContext | None]:
    """``(current, history)`` contexts: raw logs cut at the current run / boot.

    ``history`` is None when no line is older than the window."""
    cur: dict[str, dict[str, str]] = {}
    old: dict[str, dict[str, str]] = {}
    any_old = False
    for host in set(ctx.raw) | set(ctx.facts):
        raw = dict(ctx.raw.get(host, {}))
        hist = {k: v for k, v in raw.items()}
        for name, text in raw.items():
            if name == KERNEL_LOG:
                o, n = split_kernel_lines(text.splitlines(), since)
                raw[name], hist[name] = "".join(x + "\n" for x in n), "".join(x + "\n" for x in o)
            elif name.endswith(".log"):
                hist[name], raw[name] = split_unit_log(text, unit_name(name[:-4]), since)
            else:
                continue
            any_old = any_old or bool(hist[name].strip())
        kl = ctx.fact(host, KernelLogFact)
        if KERNEL_LOG not in raw and kl is not None:
            got = _facts_kernel(kl, since)
            if got is not None:
                raw[KERNEL_LOG] = "".join(x + "\n" for x in got[1])
                hist[KERNEL_LOG] = "".join(x + "\n" for x in got[0])
                any_old = any_old or bool(got[0])
        if raw:
            cur[host], old[host] = raw, hist
    current = replace(ctx, raw=cur)
    return current, (replace(ctx, raw=old) if any_old else None)


def history(current: Iterable[Finding], older: Iterable[Finding]) -> list[Finding]:
    """Problems only the older lines show, as OK rows ``history: ...`` (never current CRIT)."""
    seen = {(f.check, f.host, f.subject, f.message) for f in current}
    out: list[Finding] = []
    for f in older:
        if f.severity in (Severity.CRIT, Severity.WARN) and (f.check, f.host, f.subject, f.message) not in seen:
            seen.add((f.check, f.host, f.subject, f.message))
            out.append(
                replace(
                    f,
                    severity=Severity.OK,
                    message=f"{HISTORY}{f.severity.name} before the current run or boot: {f.message}",
                    action="nothing now (it is from an earlier run or boot; doctor --since to count it)",
                )
            )
    return out


def parse_when(text: str, now: float, *, option: str = "--since", ahead: bool = False) -> float:
    """A duration (``90m``, ``2h``, ``3d``, ``45s``) back from ``now`` (forward with ``ahead``),
    or an ISO time (UTC unless it says otherwise).  Raises ``ValueError`` naming the forms."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if m:
        step = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return now + step if ahead else now - step
    t = line_time(text.strip().replace(" ", "T", 1) + " ")
    if t is None:
        raise ValueError(f"{option} {text!r}: give a duration (45s, 90m, 2h, 3d) or a time (2026-11-30T10:00:00Z)")
    return t
