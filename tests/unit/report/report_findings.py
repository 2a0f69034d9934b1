"""Findings built by hand for the report tests (no lab, no SSH)."""

from __future__ import annotations

from clusterctl.diagnose.findings import Finding, Severity


def crit(host: str = "gpu01", subject: str = "gpu:3", check: str = "gpu.xid") -> Finding:
    return Finding(check, Severity.CRIT, host, subject, "XID 79: GPU fell off the bus", "drain the host")


def warn(host: str = "gpu02", subject: str = "nic:eth2", check: str = "roce.pfc") -> Finding:
    return Finding(check, Severity.WARN, host, subject, "paused 3% of the time", "check PFC")


def ok(host: str = "gpu03", check: str = "gpu.xid") -> Finding:
    return Finding(check, Severity.OK, host, "host", "no XIDs")
