"""Check ``host.reachable``: a host that gave no facts is UNKNOWN, with the reason.

Never OK and never CRIT: doctor could not look (unreachable, no python3,
authentication, timeout).  ``ctx.missing`` holds host -> reason.
"""

from __future__ import annotations

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer


@analyzer("host.reachable")
def check_reachable(ctx: AnalysisContext) -> list[Finding]:
    out = [
        Finding(
            "host.reachable",
            Severity.UNKNOWN,
            host,
            "host",
            f"no facts: {reason}",
            "check that the host is up and reachable over SSH (clusterctl ping)",
        )
        for host, reason in ctx.missing.items()
    ]
    out += [
        Finding(
            "host.reachable",
            Severity.OK,
            host,
            "host",
            "raw outputs read: " + ", ".join((doc.get("evidence") or {}).get("kinds") or [])
            if isinstance(doc.get("evidence"), dict)
            else "facts collected",
        )
        for host, doc in ctx.facts.items()
    ]
    return out
