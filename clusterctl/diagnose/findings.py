"""Findings: what an analyzer says about one subject on one host.

A finding is ``{check, severity, host, subject, message, evidence, action}``:

- ``check``: the analyzer's dotted name, e.g. ``gpu.xid`` or ``roce.pfc``.
- ``severity``: :class:`Severity`.  ``UNKNOWN`` means "could not check"
  (no data, tool missing), never "broken".
- ``host``: the host name, or ``None`` for a cluster-wide finding.
- ``subject``: what it is about, as ``kind:name`` — ``gpu:3``, ``nic:eth2``,
  ``instance:qwen-a``, ``tp-group:qwen-a``, ``host`` for the host itself.
- ``message``: one sentence for a person; ``action``: what to do about it.
- ``evidence``: the raw lines or numbers the verdict rests on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any, Iterable


class Severity(IntEnum):
    """Severities with the monitoring exit code as their value."""

    OK = 0
    WARN = 1
    CRIT = 2
    UNKNOWN = 3

    @property
    def rank(self) -> int:
        """Order for "worst of": OK < UNKNOWN < WARN < CRIT.

        UNKNOWN ranks below WARN: a cluster with one warning and one host that
        could not be checked exits 1 (WARN), so real problems are not hidden
        behind "could not check".
        """
        return {Severity.OK: 0, Severity.UNKNOWN: 1, Severity.WARN: 2, Severity.CRIT: 3}[self]


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    host: str | None
    subject: str
    message: str
    action: str = ""
    evidence: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.name
        d["evidence"] = list(self.evidence)
        return d


def worst(findings: Iterable[Finding]) -> Severity:
    """The worst severity (by :attr:`Severity.rank`); OK when there are none."""
    out = Severity.OK
    for f in findings:
        if f.severity.rank > out.rank:
            out = f.severity
    return out


def exit_code(findings: Iterable[Finding]) -> int:
    """The monitoring exit code for a set of findings: 0, 1, 2 or 3."""
    return int(worst(findings))
