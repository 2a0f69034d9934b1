"""Doctor's core: choose the checks, run them, order the findings.

:func:`resolve_checks` turns ``--checks`` words into analyzer names: an exact
name (``gpu.xid``), a prefix (``gpu`` selects ``gpu.*``) or a last part
(``xid`` selects ``gpu.xid``, ``foreign`` selects ``gpu.foreign``).
``host.reachable`` always runs, so a host that could not be checked is never
silently missing.  An unknown word raises ``UnknownCheckError`` naming the known checks.
"""

from __future__ import annotations

import time
from typing import Any

from clusterctl.diagnose.findings import Finding
from clusterctl.diagnose.registry import AnalysisContext, registered, run_analyzers
from clusterctl.errors import ClusterctlError
from clusterctl.diagnose import acks as ack
from clusterctl.diagnose.evidence import not_checked
from clusterctl.diagnose.current import history, split_context

ALWAYS = "host.reachable"


class UnknownCheckError(ClusterctlError):
    """``--checks`` names no registered check."""


def resolve_checks(words: list[str] | None) -> list[str] | None:
    """Analyzer names for ``words`` (None: every check)."""
    if not words:
        return None
    names = sorted(registered())
    out: list[str] = []
    for w in (x.strip() for x in words if x.strip()):
        hit = [n for n in names if n == w or n.startswith(w + ".") or n.rsplit(".", 1)[-1] == w]
        if not hit:
            groups = sorted({n.split(".")[0] for n in names})
            raise UnknownCheckError(f"--checks: unknown check {w!r}; known: {', '.join(groups + names)}")
        out += [n for n in hit if n not in out]
    return out + ([ALWAYS] if ALWAYS not in out else [])


def diagnose(
    ctx: AnalysisContext,
    checks: list[str] | None = None,
    *,
    since: float | None = None,
    acks: list[dict[str, Any]] | None = None,
    now: float | None = None,
) -> list[Finding]:
    """Run ``checks`` (analyzer names; None = all) on ``ctx``.

    Log lines count from the unit's current run and the current boot (or from
    ``since``, epoch seconds); problems only older lines show are OK rows
    ``history: ...``; ``acks`` (:mod:`clusterctl.diagnose.acks`) unexpired at
    ``now`` make their findings OK rows ``acknowledged until ...``.

    Hosts known only from raw outputs (``doctor --from`` on loose files) get an
    UNKNOWN row for every selected check their outputs cannot feed, and no OK
    row from such a check (:func:`clusterctl.diagnose.evidence.not_checked`)."""
    ctx, older = split_context(ctx, since)
    findings = run_analyzers(ctx, only=checks)
    if older is not None:
        findings += history(findings, run_analyzers(older, only=checks))
    if acks:
        findings = ack.apply(findings, acks, time.time() if now is None else now)
    names = [n for n in sorted(registered()) if checks is None or any(n == c or n.startswith(c + ".") for c in checks)]
    optional = {"gpu.dcgm"} | ({"gpu.baseline"} if not (ctx.thresholds or {}).get("baseline") else set())
    return not_checked(findings, ctx.facts, names, skip=lambda c: c in optional)
