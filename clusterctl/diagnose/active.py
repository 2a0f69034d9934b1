"""``doctor --active``: RDMA bandwidth between host pairs with ``ib_write_bw``.

Only the "cannot test" path exists: each host gets an UNKNOWN finding under
check ``roce.active`` saying why no bandwidth was measured — perftest's
``ib_write_bw`` is not installed there (facts ``tools.ib_write_bw``), the
host gave no facts, or (where it is installed) this clusterctl does not run
the pair tests yet.  It is not a registered analyzer: the rows appear only
when ``--active`` is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clusterctl.diagnose.findings import Finding, Severity

CHECK = "roce.active"


def active_findings(facts: Mapping[str, Mapping[str, Any]], missing: Mapping[str, str],
                    live: bool = True) -> list[Finding]:
    """One UNKNOWN per host: why no ``ib_write_bw`` result is given for it."""
    out: list[Finding] = []
    for host, doc in facts.items():
        tools = doc.get("tools")
        path = tools.get("ib_write_bw") if isinstance(tools, Mapping) else None
        if not live:
            msg, act = "no active test on a bundle", "run doctor --active against the live hosts"
        elif not isinstance(tools, Mapping):
            msg, act = "the facts do not say whether perftest is installed (an older collector)", \
                "upgrade clusterctl on the control host"
        elif path is None:
            msg, act = "ib_write_bw (perftest) is not installed: no RDMA bandwidth test", \
                "install perftest on the hosts to measure RDMA bandwidth between them"
        else:
            msg, act = (f"ib_write_bw found at {path}, but this clusterctl does not run the pair "
                        "bandwidth tests yet", "measure by hand: ib_write_bw -d DEV on one host, "
                        "ib_write_bw -d DEV HOST on the other")
        out.append(Finding(CHECK, Severity.UNKNOWN, host, "host", msg, act))
    for host, why in missing.items():
        out.append(Finding(CHECK, Severity.UNKNOWN, host, "host", f"no facts: {why}",
                           "make the host reachable and run doctor again"))
    return out
