"""``doctor ack``: a known problem acknowledged until a time.

Kept as ``acks.json`` in the state directory: ``{"acks": [{check, subject,
host, until, reason, at}]}`` (``host`` None: every host), written through a
temporary file and a rename.  An acknowledged finding is shown as an OK row
``acknowledged until T (reason): ...`` and does not count in the exit code
until ``until`` passes; then it counts again.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.errors import ClusterctlError
from clusterctl.files import write_atomic

FILENAME = "acks.json"


class AckError(ClusterctlError):
    """An unreadable acks file or a bad ``--until``."""


def ack_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / FILENAME


def load(state_dir: str | Path) -> list[dict[str, Any]]:
    p = ack_path(state_dir)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise AckError(f"{p}: cannot read the acknowledgements: {e}") from None
    acks = doc.get("acks") if isinstance(doc, dict) else None
    if not isinstance(acks, list) or not all(
        isinstance(a, dict) and {"check", "subject", "until"} <= set(a) for a in acks
    ):
        raise AckError(f"{p}: not an acknowledgements file (expected {{\"acks\": [{{check, subject, until}}]}})")
    return acks


def save(state_dir: str | Path, acks: list[dict[str, Any]]) -> Path:
    p = ack_path(state_dir)
    write_atomic(p, json.dumps({"acks": acks}, indent=2) + "\n", mode=0o600)
    return p


def add(
    state_dir: str | Path,
    check: str,
    subject: str,
    until: float,
    *,
    host: str | None = None,
    reason: str = "",
    now: float,
) -> dict[str, Any]:
    """Acknowledge ``check`` on ``subject`` (on ``host``, or every host) until ``until``; replaces an earlier one."""
    if until <= now:
        raise AckError(f"--until {_iso(until)} is not in the future")
    acks = [a for a in load(state_dir) if (a["check"], a["subject"], a.get("host")) != (check, subject, host)]
    entry = {"check": check, "subject": subject, "host": host, "until": _iso(until), "reason": reason, "at": _iso(now)}
    save(state_dir, acks + [entry])
    return entry


def remove(state_dir: str | Path, check: str, subject: str, host: str | None = None) -> int:
    """Remove the acknowledgements of ``check`` on ``subject`` (any host unless ``host``); how many."""
    acks = load(state_dir)
    kept = [
        a
        for a in acks
        if not (a["check"] == check and a["subject"] == subject and (host is None or a.get("host") == host))
    ]
    if len(kept) != len(acks):
        save(state_dir, kept)
    return len(acks) - len(kept)


def _iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def until_epoch(entry: dict[str, Any]) -> float:
    try:
        return datetime.datetime.fromisoformat(str(entry["until"]).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise AckError(
            f"acknowledgement of {entry.get('check')} {entry.get('subject')}: bad until {entry.get('until')!r}"
        ) from None


def apply(findings: Iterable[Finding], acks: list[dict[str, Any]], now: float) -> list[Finding]:
    """Findings an unexpired acknowledgement covers become OK rows ``acknowledged until T (reason): ...``."""
    live = [a for a in acks if until_epoch(a) > now]
    out: list[Finding] = []
    for f in findings:
        a = next(
            (
                a
                for a in live
                if f.severity in (Severity.CRIT, Severity.WARN)
                and a["check"] == f.check
                and a["subject"] == f.subject
                and a.get("host") in (None, f.host)
            ),
            None,
        )
        if a is not None:
            why = f"; {a['reason']}" if a.get("reason") else ""
            f = replace(
                f, severity=Severity.OK, message=f"acknowledged until {a['until']}{why}: {f.severity.name}: {f.message}"
            )
        out.append(f)
    return out
