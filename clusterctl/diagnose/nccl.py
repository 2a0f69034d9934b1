"""NCCL settings of instances whose tensor-parallel group spans hosts.

Check ``nccl.env`` reads each multi-host instance's environment as the
inventory defines it (``instances.NAME.env``, what the deploy step puts in
the unit) together with the facts of its hosts:

- ``NCCL_IB_TC`` unset: NCCL's default traffic class is 0, so its RoCE
  traffic carries DSCP 0 and lands on priority 0, which has no PFC — CRIT on
  each placement host whose RoCE NICs do not override the class with a global
  traffic class (MLNX_OFED ``tc/1/traffic_class``) of the profile's DSCP;
- ``NCCL_IB_TC`` set: its DSCP (``tc >> 2``) must map to the PFC priority on
  every placement host (the host's DSCP map, else the profile) — CRIT;
- ``NCCL_SOCKET_IFNAME`` unset (NCCL picks an interface itself) or matching
  a management NIC — WARN;
- ``NCCL_IB_HCA`` set without any data NIC's RDMA device — CRIT.

The running units' real environment is not read (the facts do not carry
it); an instance on one host uses NVLink/shared memory and is not checked.
"""

from __future__ import annotations

from typing import Any

from clusterctl.diagnose import fabric
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.diagnose.sources import instances

CHECK = "nccl.env"


def _matches(pattern: str, name: str) -> bool:
    """NCCL interface/HCA list semantics: ``=x`` exact, else prefix; ``:port`` dropped."""
    p = pattern.split(":", 1)[0].strip()
    return name == p[1:] if p.startswith("=") else bool(p) and name.startswith(p)


def _includes(value: str, name: str) -> bool | None:
    """Whether a NCCL list selects ``name``; ``None`` for an exclusion list (``^x``)."""
    if value.startswith("^"):
        return not any(_matches(p, name) for p in value[1:].split(","))
    return any(_matches(p, name) for p in value.split(","))


def _tc_problem(ctx: AnalysisContext, host: str, tc: int | None) -> str | None:
    """Why RoCE of this host would not land on the PFC priority, or None."""
    prof = fabric.profile(ctx)
    facts = ctx.facts.get(host)
    if facts is None:
        return None
    for nic in fabric.roce_nics(facts):
        q = nic.get("qos") or {}
        glob = q.get("traffic_class")
        if glob is not None:
            dscp = int(glob) >> 2
            src = f"the global traffic class {glob} of {nic['netdev']}"
        elif tc is None:
            return (f"{nic['netdev']} has no global traffic class, so NCCL's default traffic class 0 "
                    "sends RoCE with DSCP 0")
        else:
            dscp = tc >> 2
            src = f"NCCL_IB_TC={tc}"
        d2p = q.get("dscp2prio") if q.get("trust") == "dscp" else None
        prio = d2p.get(str(dscp)) if isinstance(d2p, dict) else (prof.pfc_priority if dscp == prof.roce_dscp
                                                                  else None)
        if q.get("trust") == "pcp":
            prio = 0
        if prio != prof.pfc_priority:
            return (f"{src} is DSCP {dscp}, which lands on priority {prio if prio is not None else '?'} on "
                    f"{nic['netdev']} (PFC is on {prof.pfc_priority})")
    return None


@analyzer(CHECK)
def check_nccl_env(ctx: AnalysisContext) -> list[Finding]:
    """NCCL traffic class, socket interface and HCA list of multi-host instances."""
    inv = ctx.inventory
    prof = fabric.profile(ctx)
    out: list[Finding] = []
    for inst in instances(inv):
        if len(inst.hosts) < 2:
            continue
        subj = f"instance:{inst.name}"
        env: dict[str, Any] = dict(inst.env)
        problems = 0
        raw_tc = env.get("NCCL_IB_TC")
        tc: int | None = None
        if raw_tc is not None:
            try:
                tc = int(str(raw_tc), 0)
            except ValueError:
                out.append(Finding(CHECK, Severity.CRIT, None, subj,
                                   f"{inst.name}: NCCL_IB_TC={raw_tc!r} is not a number",
                                   f"set NCCL_IB_TC to {prof.roce_dscp * 4 + 2} (DSCP {prof.roce_dscp})"))
                problems += 1
                raw_tc = None
        if prof.kind == "roce" and not (raw_tc is not None and tc is None):
            for host in inst.hosts:
                why = _tc_problem(ctx, host, tc)
                if why:
                    unset = "NCCL_IB_TC unset" if tc is None else f"NCCL_IB_TC={tc}"
                    out.append(Finding(CHECK, Severity.CRIT, host, subj,
                                       f"{inst.name}: {unset}; on {host} {why}: its tensor-parallel traffic "
                                       "is not lossless",
                                       f"set env NCCL_IB_TC: '{prof.roce_dscp * 4 + 2}' (DSCP {prof.roce_dscp}) "
                                       f"for {inst.name} in the inventory and redeploy"))
                    problems += 1
        mgmt: set[str] = set()
        data: set[str] = set()
        hcas: set[str] = set()
        for h in inst.hosts:
            if inv is not None and h in inv.hosts:
                mgmt |= {n.netdev for n in inv.hosts[h].nics_with_role("management")}
                data |= {n.netdev for n in inv.hosts[h].nics_with_role("data")}
                hcas |= {n.rdma_device for n in inv.hosts[h].nics_with_role("data") if n.rdma_device}
        ifname = env.get("NCCL_SOCKET_IFNAME")
        if ifname is None and data:
            out.append(Finding(CHECK, Severity.WARN, None, subj,
                               f"{inst.name}: NCCL_SOCKET_IFNAME unset: NCCL picks an interface itself, "
                               "possibly the management one",
                               f"set env NCCL_SOCKET_IFNAME: '={sorted(data)[0]}' (the data NIC)"))
            problems += 1
        elif ifname is not None:
            on_mgmt = sorted(m for m in mgmt if _includes(str(ifname), m) and m not in data)
            if on_mgmt:
                out.append(Finding(CHECK, Severity.WARN, None, subj,
                                   f"{inst.name}: NCCL_SOCKET_IFNAME={ifname} selects the management NIC "
                                   f"{', '.join(on_mgmt)}",
                                   f"set NCCL_SOCKET_IFNAME to the data NIC ('={sorted(data)[0]}')"
                                   if data else "set NCCL_SOCKET_IFNAME to the data NIC"))
                problems += 1
        hca = env.get("NCCL_IB_HCA")
        if hca is not None and hcas and not any(_includes(str(hca), d) for d in hcas):
            out.append(Finding(CHECK, Severity.CRIT, None, subj,
                               f"{inst.name}: NCCL_IB_HCA={hca} selects none of the data NICs' RDMA devices "
                               f"({', '.join(sorted(hcas))})",
                               "list the data NICs' RDMA devices in NCCL_IB_HCA, or unset it"))
            problems += 1
        if not problems:
            out.append(Finding(CHECK, Severity.OK, None, subj, f"{inst.name}: NCCL settings fit the fabric"))
    return out
