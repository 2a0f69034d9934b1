"""What changed since the last run: new, ongoing and resolved problems.

A problem is a finding that is not OK, identified by ``(check, host,
subject)``; its severity and message may change while it stays "ongoing"
(a WARN that became CRIT is ``escalated``).  UNKNOWN counts as a problem:
a host that could not be checked is worth a notification.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from clusterctl.diagnose.findings import Finding, Severity

Key = tuple[str, str, str]


def key(f: Finding) -> Key:
    """The identity of a problem across runs: check, host ("" for cluster-wide), subject."""
    return (f.check, f.host or "", f.subject)


@dataclass
class Diff:
    """The problems of this run against the previous one (each list sorted worst first)."""

    new: list[Finding] = field(default_factory=list)
    ongoing: list[Finding] = field(default_factory=list)
    resolved: list[Finding] = field(default_factory=list)
    escalated: list[Finding] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """True when a problem appeared, cleared or got worse."""
        return bool(self.new or self.resolved or self.escalated)

    def to_json(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "new": [f.to_json() for f in self.new],
            "ongoing": [f.to_json() for f in self.ongoing],
            "resolved": [f.to_json() for f in self.resolved],
            "escalated": [f.to_json() for f in self.escalated],
        }


def _problems(findings: Iterable[Finding]) -> dict[Key, Finding]:
    out: dict[Key, Finding] = {}
    for f in findings:
        if f.severity != Severity.OK:
            k = key(f)
            if k not in out or f.severity.rank > out[k].severity.rank:
                out[k] = f
    return out


def _sorted(fs: Iterable[Finding]) -> list[Finding]:
    return sorted(fs, key=lambda f: (-f.severity.rank, f.check, f.host or "", f.subject))


def diff(previous: Iterable[Finding] | None, current: Iterable[Finding]) -> Diff:
    """Compare two runs; with no previous run every problem is new."""
    before = _problems(previous or [])
    now = _problems(current)
    return Diff(
        new=_sorted(f for k, f in now.items() if k not in before),
        ongoing=_sorted(f for k, f in now.items() if k in before),
        resolved=_sorted(f for k, f in before.items() if k not in now),
        escalated=_sorted(f for k, f in now.items() if k in before and f.severity.rank > before[k].severity.rank),
    )
