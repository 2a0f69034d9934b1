"""Check ``gpu.dcgm``: the results of a ``dcgmi diag -j`` run found among the raw outputs.

``dcgm_diag`` (built by :func:`clusterctl.diagnose.nvsmi.parse_dcgmi_diag`)
holds one entry per test result.  A failed test is CRIT (DCGM's diagnostics
fail on hardware faults: memory, PCIe, NVLink, thermal), a warning WARN; a run
where every result passed or was skipped is OK.  Hosts without a DCGM run get
no row from this check.
"""

from __future__ import annotations

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer

CHECK = "gpu.dcgm"


@analyzer(CHECK)
def check_dcgm(ctx: AnalysisContext) -> list[Finding]:
    out: list[Finding] = []
    for host, doc in ctx.facts.items():
        diag = doc.get("dcgm_diag") if isinstance(doc, dict) else None
        if not isinstance(diag, dict):
            continue
        results = [r for r in diag.get("results") or [] if isinstance(r, dict)]
        bad = False
        for r in results:
            status = str(r.get("status") or "").lower()
            sev = (
                Severity.CRIT
                if status in ("fail", "failed", "error")
                else Severity.WARN
                if status in ("warn", "warning")
                else None
            )
            if sev is None:
                continue
            bad = True
            gpu = r.get("gpu") or ""
            msgs = [str(m) for m in r.get("messages") or []]
            out.append(
                Finding(
                    CHECK,
                    sev,
                    host,
                    f"gpu:{gpu}" if gpu not in ("", "None") else "host",
                    f"dcgmi diag {r.get('category')}/{r.get('test')}: {status}"
                    + (f": {msgs[0][:200]}" if msgs else ""),
                    "drain the GPU and rerun `dcgmi diag -r 3`; a repeated failure is an RMA case",
                    tuple(m[:300] for m in msgs),
                )
            )
        if not bad:
            out.append(
                Finding(CHECK, Severity.OK, host, "host", f"dcgmi diag: {len(results)} result(s), none failed")
                if results
                else Finding(CHECK, Severity.UNKNOWN, host, "host", "dcgmi diag JSON holds no result")
            )
    return out
