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

Where a placement host's facts carry the instance's running unit
(``units[]`` ``clusterctl-NAME.service`` with its ``environment``, read by
the probe from ``systemctl show -p Environment``), that host is judged on
what the unit really runs with — ``NCCL_IB_TC``, ``NCCL_SOCKET_IFNAME`` and
``VLLM_HOST_IP`` (an address of a management NIC, or the host's inventory
address, instead of the data NIC's — WARN) — per host, naming the unit.
Hosts without a running unit fall back to the inventory's env.  Variables
set in an ``EnvironmentFile=`` are not read (only the file's name is known).
An instance on one host uses NVLink/shared memory and is not checked.
"""

from __future__ import annotations


from clusterctl.diagnose import fabric
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.diagnose.sources import instances, unit_name
from clusterctl.probe.gid import ipv4_of_gid
from clusterctl.probe.factgroups import NicsFact, Qos, UnitsFact

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
    for nic in fabric.roce_nics(ctx, host):
        q = nic.qos or Qos()
        glob = q.traffic_class
        if glob is not None:
            dscp = glob >> 2
            src = f"the global traffic class {glob} of {nic.netdev}"
        elif tc is None:
            return f"{nic.netdev} has no global traffic class, so NCCL's default traffic class 0 sends RoCE with DSCP 0"
        else:
            dscp = tc >> 2
            src = f"NCCL_IB_TC={tc}"
        d2p = q.dscp2prio if q.trust == "dscp" else None
        prio = d2p.get(str(dscp)) if d2p is not None else (prof.pfc_priority if dscp == prof.roce_dscp else None)
        if q.trust == "pcp":
            prio = 0
        if prio != prof.pfc_priority:
            return (
                f"{src} is DSCP {dscp}, which lands on priority {prio if prio is not None else '?'} on "
                f"{nic.netdev} (PFC is on {prof.pfc_priority})"
            )
    return None


def running_env(ctx: AnalysisContext, host: str, instance: str) -> dict[str, str | None] | None:
    """The environment of ``clusterctl-INSTANCE.service`` as the host's facts show
    it (name → value, ``None`` for a value withheld as secret); ``None`` when the
    facts have no such unit or no environment for it."""
    units = ctx.fact(host, UnitsFact)
    for u in units.units if units is not None else ():
        if u.unit == unit_name(instance) and u.environment is not None:
            return dict(u.environment)
    return None


def _parse_tc(raw: object) -> tuple[int | None, bool]:
    """``(traffic class, valid)``; ``(None, True)`` when unset."""
    if raw is None:
        return None, True
    try:
        return int(str(raw), 0), True
    except ValueError:
        return None, False


def _data_addresses(ctx: AnalysisContext, host: str) -> set[str]:
    """IPv4 addresses of the host's data NICs: the inventory's ``address`` and
    the IPv4-mapped RoCE GIDs (GIDs follow the netdev's addresses)."""
    inv = ctx.inventory
    names: set[str] = set()
    out: set[str] = set()
    if inv is not None and host in inv.hosts:
        for spec in inv.hosts[host].nics_with_role("data"):
            names.add(spec.netdev)
            if spec.address:
                out.add(spec.address.split("/")[0])
    read = ctx.fact(host, NicsFact)
    for n in read.nics if read is not None else ():
        if names and n.netdev not in names:
            continue
        for g in n.rdma.gids if n.rdma is not None else ():
            addr = ipv4_of_gid(g.gid)
            if addr is not None:
                out.add(str(addr))
    return out


def _mgmt_addresses(ctx: AnalysisContext, host: str) -> set[str]:
    inv = ctx.inventory
    if inv is None or host not in inv.hosts:
        return set()
    h = inv.hosts[host]
    return {h.address} | {n.address.split("/")[0] for n in h.nics_with_role("management") if n.address}


def _host_ip(ctx: AnalysisContext, inst_name: str, host: str, value: object, where: str) -> Finding | None:
    """VLLM_HOST_IP of a running unit: a management address instead of the data NIC's."""
    if value is None:
        return None
    ip = str(value)
    data = _data_addresses(ctx, host)
    if ip in _mgmt_addresses(ctx, host) and ip not in data:
        why = "the management address"
    elif data and ip not in data:
        why = f"not an address of the data NICs ({', '.join(sorted(data))})"
    else:
        return None
    return Finding(
        CHECK,
        Severity.WARN,
        host,
        f"instance:{inst_name}",
        f"{inst_name}: VLLM_HOST_IP={ip} in {where} is {why}: vLLM's and NCCL's bootstrap "
        "traffic crosses the management network",
        "set VLLM_HOST_IP to this host's data NIC address"
        + (f" ({sorted(data)[0]})" if data else "")
        + " and restart the unit",
    )


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
        inv_env: dict[str, str] = dict(inst.env)
        running = {h: running_env(ctx, h, inst.name) for h in inst.hosts}
        from_inventory = [h for h in inst.hosts if running[h] is None]
        problems = 0
        inv_tc, inv_tc_ok = _parse_tc(inv_env.get("NCCL_IB_TC"))
        if from_inventory and not inv_tc_ok:
            out.append(
                Finding(
                    CHECK,
                    Severity.CRIT,
                    None,
                    subj,
                    f"{inst.name}: NCCL_IB_TC={inv_env['NCCL_IB_TC']!r} is not a number",
                    f"set NCCL_IB_TC to {prof.roce_dscp * 4 + 2} (DSCP {prof.roce_dscp})",
                )
            )
            problems += 1
        for host in inst.hosts:
            env = running[host]
            where = f"the running unit {unit_name(inst.name)}" if env is not None else None
            if env is None:
                tc, ok = inv_tc, inv_tc_ok
            else:
                tc, ok = _parse_tc(env.get("NCCL_IB_TC"))
                if not ok:
                    out.append(
                        Finding(
                            CHECK,
                            Severity.CRIT,
                            host,
                            subj,
                            f"{inst.name}: NCCL_IB_TC={env['NCCL_IB_TC']!r} in {where} is not a number",
                            f"set NCCL_IB_TC to {prof.roce_dscp * 4 + 2} (DSCP {prof.roce_dscp})",
                        )
                    )
                    problems += 1
            if prof.kind != "roce" or not ok:
                continue
            why = _tc_problem(ctx, host, tc)
            if why:
                unset = "NCCL_IB_TC unset" if tc is None else f"NCCL_IB_TC={tc}"
                out.append(
                    Finding(
                        CHECK,
                        Severity.CRIT,
                        host,
                        subj,
                        f"{inst.name}: {unset}"
                        + (f" in {where}" if where else "")
                        + f"; on {host} {why}: its tensor-parallel traffic is not lossless",
                        f"set env NCCL_IB_TC: '{prof.roce_dscp * 4 + 2}' (DSCP {prof.roce_dscp}) "
                        f"for {inst.name} in the inventory and redeploy",
                    )
                )
                problems += 1
        mgmt: set[str] = set()
        data: set[str] = set()
        hcas: set[str] = set()
        for h in inst.hosts:
            if inv is not None and h in inv.hosts:
                mgmt |= {n.netdev for n in inv.hosts[h].nics_with_role("management")}
                data |= {n.netdev for n in inv.hosts[h].nics_with_role("data")}
                hcas |= {n.rdma_device for n in inv.hosts[h].nics_with_role("data") if n.rdma_device}
        fix = f"'={sorted(data)[0]}'" if data else "the data NIC"
        if from_inventory:
            problems += _ifname(out, inst.name, None, inv_env.get("NCCL_SOCKET_IFNAME"), mgmt, data, None, fix)
        for host in inst.hosts:
            env = running[host]
            if env is None:
                continue
            where = f"the running unit {unit_name(inst.name)}"
            problems += _ifname(out, inst.name, host, env.get("NCCL_SOCKET_IFNAME"), mgmt, data, where, fix)
            f = _host_ip(ctx, inst.name, host, env.get("VLLM_HOST_IP"), where)
            if f is not None:
                out.append(f)
                problems += 1
        hca = inv_env.get("NCCL_IB_HCA")
        if hca is not None and hcas and not any(_includes(str(hca), d) for d in hcas):
            out.append(
                Finding(
                    CHECK,
                    Severity.CRIT,
                    None,
                    subj,
                    f"{inst.name}: NCCL_IB_HCA={hca} selects none of the data NICs' RDMA devices "
                    f"({', '.join(sorted(hcas))})",
                    "list the data NICs' RDMA devices in NCCL_IB_HCA, or unset it",
                )
            )
            problems += 1
        if not problems:
            out.append(Finding(CHECK, Severity.OK, None, subj, f"{inst.name}: NCCL settings fit the fabric"))
    return out


def _ifname(
    out: list[Finding],
    inst: str,
    host: str | None,
    ifname: object,
    mgmt: set[str],
    data: set[str],
    where: str | None,
    fix: str,
) -> int:
    """NCCL_SOCKET_IFNAME unset or selecting a management NIC: a WARN into ``out``; 1 if so."""
    at = f" in {where}" if where else ""
    if ifname is None and data:
        out.append(
            Finding(
                CHECK,
                Severity.WARN,
                host,
                f"instance:{inst}",
                f"{inst}: NCCL_SOCKET_IFNAME unset{at}: NCCL picks an interface itself, possibly the management one",
                f"set env NCCL_SOCKET_IFNAME: {fix} (the data NIC)",
            )
        )
        return 1
    if ifname is not None:
        on_mgmt = sorted(m for m in mgmt if _includes(str(ifname), m) and m not in data)
        if on_mgmt:
            out.append(
                Finding(
                    CHECK,
                    Severity.WARN,
                    host,
                    f"instance:{inst}",
                    f"{inst}: NCCL_SOCKET_IFNAME={ifname}{at} selects the management NIC {', '.join(on_mgmt)}",
                    f"set NCCL_SOCKET_IFNAME to the data NIC ({fix})"
                    if data
                    else "set NCCL_SOCKET_IFNAME to the data NIC",
                )
            )
            return 1
    return 0
