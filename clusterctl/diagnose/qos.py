"""RoCE QoS configuration checks (``nics[].qos`` of the facts), against the
inventory's fabric profile and across hosts, naming the odd one out:
``lab07 eth2: PFC on priority 4; the profile and the other 7 hosts use 3``.

Check ``roce.qos``, per RoCE NIC:

- trust mode (``dscp`` expected: with ``pcp`` untagged RoCEv2 lands on
  priority 0, lossy) — CRIT when it differs from the profile;
- PFC-enabled priorities: the profile's priority missing — CRIT; other
  priorities on as well — WARN;
- the DSCP -> priority map: the RoCE DSCP not on the PFC priority — CRIT; the
  CNP DSCP on a priority other than the other hosts' — WARN;
- ECN: notification or reaction point off on the RoCE priority — WARN;
  CNP DSCP different from the profile's — WARN (MLNX_OFED sysfs only);
- RoCE traffic class (MLNX_OFED ``tc/1/traffic_class``): set to a DSCP
  other than the profile's — CRIT; set on some hosts and not others — WARN;
- RDMA-CM default ToS (configfs ``rdma_cm/DEV/ports/PORT/default_roce_tos``,
  kernel default 0): a DSCP (ToS >> 2) other than the profile's — WARN
  (RDMA-CM connections that set no ToS of their own; NCCL programs its QPs
  itself);
- 802.3x global pause on — WARN;
- drift without a profile value (cable length, CNP 802.1p priority, PFC stall prevention, NIC firmware within one device
  family): a host in the minority against a strict majority of 3 or more
  hosts — WARN;
- DCBX under firmware control or lldpad running (settings can be
  overwritten) — WARN;
- QoS unreadable (neither mlnx_qos nor dcb answered) — UNKNOWN.

The counters' own view of the configuration (which ``*_prioN_pause`` names
exist) confirms the PFC priorities where no tool answered.

**Leaf rollup.** When every checked host under one leaf switch (inventory
label ``leaf``, 2 hosts or more) has the same wrong setting (same check, same
value), that is said once for the leaf (subject ``leaf:NAME``, no host),
pointing at the switch: a setting shared by a whole leaf comes from the
switch (DCBX) or from one configuration applied to the leaf, as in the field
report's incident; the per-NIC findings it replaces are its evidence.  The
same setting on every host of several leaves is the cluster's own
configuration: those stay per host.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from clusterctl.diagnose import fabric
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.probe.factgroups import Nic, NicsFact, Qos

CHECK = "roce.qos"


def pfc_from_counters(ethtool_stats: Mapping[str, int] | None) -> list[int] | None:
    """PFC-enabled priorities as mlx5 shows them: ``rx_prioN_pause`` exists only for those."""
    stats = ethtool_stats or {}
    prios = sorted({int(m.group(1)) for n in stats if (m := re.fullmatch(r"rx_prio(\d)_pause", n))})
    if not prios and not any(n.startswith("rx_prio") for n in stats):
        return None  # not an mlx5-style counter set: no readout
    return prios


def settings(nic: Nic, roce_dscp: int, cnp_dscp: int) -> dict[str, Hashable]:
    """The comparable QoS values of one NIC (absent ones left out)."""
    q = nic.qos or Qos()
    out: dict[str, Hashable] = {}
    if q.trust:
        out["trust"] = q.trust
    pfc = q.pfc_enabled if q.pfc_enabled is not None else pfc_from_counters(nic.ethtool_stats)
    if pfc is not None:
        out["pfc"] = tuple(pfc)
    if q.trust == "dscp" and q.dscp2prio is not None:
        out["roce_dscp_prio"] = q.dscp2prio.get(str(roce_dscp))
        out["cnp_dscp_prio"] = q.dscp2prio.get(str(cnp_dscp))
    ecn = q.ecn
    if ecn is not None:
        out["ecn_np"] = ecn.roce_np
        out["ecn_rp"] = ecn.roce_rp
        if ecn.cnp_dscp is not None:
            out["ecn_cnp_dscp"] = ecn.cnp_dscp
    if q.traffic_class is not None or q.traffic_class_reason == "not set":
        out["tclass"] = q.traffic_class
    if q.cm_tos is not None:
        out["cm_tos"] = q.cm_tos
    if q.global_pause is not None:
        out["global_pause"] = bool(q.global_pause.rx or q.global_pause.tx)
    if q.dcbx:
        out["dcbx"] = q.dcbx
    if q.cable_len is not None:
        out["cable_len"] = q.cable_len
    if q.pfc_stall_prevention is not None:
        out["pfc_stall_prevention"] = q.pfc_stall_prevention
    if ecn is not None and ecn.cnp_802p_prio is not None:
        out["cnp_802p_prio"] = ecn.cnp_802p_prio
    fw = nic.rdma.fw_ver if nic.rdma is not None else None
    if fw:  # the major number is the device family (22: ConnectX-6 Dx, 28: ConnectX-7)
        out["fw_ver/" + str(fw).split(".")[0]] = fw
    return out


#: Settings without a profile value, compared across hosts only (WARN for a minority value).
#: (The priority-to-buffer map follows the PFC setting; PFC is compared already.)
DRIFT = {
    "cable_len": "cable length (PFC headroom)",
    "cnp_802p_prio": "CNP 802.1p priority",
    "pfc_stall_prevention": "PFC stall prevention",
    "fw_ver": "NIC firmware",
}  # fw_ver/<major>: compared within one device family


#: Settings ``clusterctl net apply`` puts right (the inventory's fabric profile).
NET_APPLY_KEYS = frozenset(
    {"trust", "pfc", "roce_dscp_prio", "ecn_np", "ecn_rp", "ecn_cnp_dscp", "tclass", "cm_tos", "global_pause"}
)


def fix_command(hosts: list[str]) -> str:
    """The action's tail naming the command that applies the profile on ``hosts``."""
    return (
        f"; `clusterctl net apply --hosts '{fabric.folded(sorted(hosts))}'` sets the inventory's profile "
        "(--plan first shows the changes)"
    )


def _drift_what(key: str) -> str | None:
    return DRIFT.get(key.split("/", 1)[0])


def _show(v: object) -> str:
    return ",".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _prios(v: Iterable[object] | None) -> str:
    if not v:
        return "no priority"
    v = list(v)
    return ("priority " if len(v) == 1 else "priorities ") + ",".join(map(str, v))


def _qos_unreadable(nic: Nic) -> str | None:
    q = nic.qos
    if q is None:
        return "the facts have no QoS section (a collector older than this check?)"
    if q.tool is None and q.trust is None:
        reasons = "; ".join(f"{k}: {v}" for k, v in q.reasons.items())
        return f"neither mlnx_qos nor dcb answered ({reasons or 'no reason given'})"
    return None


@analyzer(CHECK)
def check_qos(ctx: AnalysisContext) -> list[Finding]:
    """QoS configuration against the profile and across hosts."""
    if not fabric.is_roce_fabric(ctx):
        return []
    prof = fabric.profile(ctx)
    p = prof.pfc_priority
    per_nic: dict[tuple[str, str], dict[str, Hashable]] = {}
    per_dev: dict[tuple[str, str], str] = {}
    unknown: list[Finding] = []
    order: list[str] = []
    for host in fabric.hosts(ctx):
        read = ctx.fact(host, NicsFact)
        if read is not None and not read.read:
            unknown.append(
                Finding(
                    CHECK,
                    Severity.UNKNOWN,
                    host,
                    "host",
                    "cannot read the QoS configuration: " + "; ".join(read.reasons),
                    "run doctor again with this clusterctl's probe",
                )
            )
            continue
        for entry in fabric.roce_nics(ctx, host):
            name = str(entry.netdev)
            why = _qos_unreadable(entry)
            vals = settings(entry, prof.roce_dscp, prof.cnp_dscp)
            if why and "pfc" not in vals:
                unknown.append(
                    Finding(
                        CHECK,
                        Severity.UNKNOWN,
                        host,
                        f"nic:{name}",
                        f"{name}: cannot read the QoS configuration: {why}",
                        "install mlnx-tools (mlnx_qos) or iproute2's dcb on the node",
                    )
                )
                continue
            per_nic[(host, name)] = vals
            per_dev[(host, name)] = str((entry.rdma.device if entry.rdma is not None else None) or "")
            order.append(host)

    def host_values(key: str) -> dict[str, Hashable]:
        """Per host, the value when all its NICs agree (else a tuple of them)."""
        by_host: dict[str, set[Hashable]] = {}
        for (h, _), vals in per_nic.items():
            if key in vals:
                by_host.setdefault(h, set()).add(vals[key])
        return {h: next(iter(v)) if len(v) == 1 else tuple(sorted(map(str, v))) for h, v in by_host.items()}

    out: list[Finding] = []
    bad_hosts: set[str] = set()
    #: per finding in ``out``: (key, severity, the message without host and NIC, expected, action) for the rollup
    described: list[tuple[str, Severity, str, str, str]] = []

    def add(
        host: str, nic: str, sev: Severity, key: str, msg: str, expected: Hashable | None, action: str, show: Any = str
    ) -> None:
        rel = fabric.odd_one_out(host_values(key), host, expected, show)
        out.append(
            Finding(
                CHECK,
                sev,
                host,
                f"nic:{nic}",
                f"{host} {nic}: {msg}; {rel}",
                action + fix_command([host]) if key in NET_APPLY_KEYS else action,
                (f"{key} = {show(per_nic[(host, nic)].get(key))}",),
            )
        )
        described.append((key, sev, msg, "" if expected is None else show(expected), action))
        bad_hosts.add(host)

    drift_majority: dict[str, Hashable] = {}
    drift_keys = sorted({k for vals in per_nic.values() for k in vals if _drift_what(k)})
    for key in drift_keys:
        hv = host_values(key)
        seen = list(hv.values())
        if len(hv) >= 3:
            top = max(set(seen), key=seen.count)
            if seen.count(top) * 2 > len(seen):  # a strict majority to drift from
                drift_majority[key] = top
    majority: dict[str, Hashable] = {}
    for key in ("cnp_dscp_prio", "tclass", "dcbx"):
        seen = list(host_values(key).values())
        if seen:
            majority[key] = max(set(seen), key=seen.count)

    for (host, nic), v in per_nic.items():
        if "trust" in v and v["trust"] != prof.trust:
            add(
                host,
                nic,
                Severity.CRIT,
                "trust",
                f"trust {v['trust']}",
                prof.trust,
                f"set trust {prof.trust} (mlnx_qos -i {nic} --trust {prof.trust}); with trust pcp, "
                "untagged RoCEv2 traffic is classified to priority 0, which has no PFC",
                show=str,
            )
        if "pfc" in v:
            pfc: tuple[int, ...] = tuple(v["pfc"])  # type: ignore[arg-type]
            if p not in pfc:
                add(
                    host,
                    nic,
                    Severity.CRIT,
                    "pfc",
                    f"PFC on {_prios(pfc)}",
                    (p,),
                    f"enable PFC on priority {p} only (mlnx_qos -i {nic} --pfc "
                    + ",".join("1" if i == p else "0" for i in range(8))
                    + f" or dcb pfc set dev {nic} "
                    f"prio-pfc {p}:on); RoCE on priority {p} is not lossless on this host",
                    show=lambda x: (
                        ",".join(map(str, x))
                        if isinstance(x, tuple) and x and all(isinstance(i, int) for i in x)
                        else str(x)
                    ),
                )
            elif len(pfc) > 1:
                add(
                    host,
                    nic,
                    Severity.WARN,
                    "pfc",
                    f"PFC on {_prios(pfc)}",
                    (p,),
                    f"enable PFC on priority {p} only: pause on other priorities can spread congestion",
                    show=lambda x: ",".join(map(str, x)) if isinstance(x, tuple) else str(x),
                )
        if v.get("trust") == "dscp" and "roce_dscp_prio" in v and v["roce_dscp_prio"] != p:
            add(
                host,
                nic,
                Severity.CRIT,
                "roce_dscp_prio",
                f"DSCP {prof.roce_dscp} (RoCE) maps to priority {v['roce_dscp_prio']}",
                p,
                f"map DSCP {prof.roce_dscp} to priority {p} (mlnx_qos -i {nic} --dscp2prio set,{prof.roce_dscp},{p})",
            )
        if "cnp_dscp_prio" in v and majority.get("cnp_dscp_prio") not in (None, v["cnp_dscp_prio"]):
            add(
                host,
                nic,
                Severity.WARN,
                "cnp_dscp_prio",
                f"DSCP {prof.cnp_dscp} (CNP) maps to priority {v['cnp_dscp_prio']}",
                None,
                f"map DSCP {prof.cnp_dscp} as the other hosts do",
            )
        if "ecn_np" in v and p not in v["ecn_np"]:  # type: ignore[operator]
            add(
                host,
                nic,
                Severity.WARN,
                "ecn_np",
                f"ECN notification point off on priority {p}",
                None,
                f"echo 1 > /sys/class/net/{nic}/ecn/roce_np/enable/{p} (no CNPs are sent otherwise)",
                show=_prios,
            )
        if "ecn_rp" in v and p not in v["ecn_rp"]:  # type: ignore[operator]
            add(
                host,
                nic,
                Severity.WARN,
                "ecn_rp",
                f"ECN reaction point off on priority {p}",
                None,
                f"echo 1 > /sys/class/net/{nic}/ecn/roce_rp/enable/{p} (senders ignore CNPs otherwise)",
                show=_prios,
            )
        if "ecn_cnp_dscp" in v and v["ecn_cnp_dscp"] != prof.cnp_dscp:
            add(
                host,
                nic,
                Severity.WARN,
                "ecn_cnp_dscp",
                f"CNPs are sent with DSCP {v['ecn_cnp_dscp']}",
                prof.cnp_dscp,
                f"set /sys/class/net/{nic}/ecn/roce_np/cnp_dscp to {prof.cnp_dscp}, "
                "the class the switches treat as strict priority",
            )
        if "tclass" in v:
            tc = v["tclass"]
            if tc is not None and int(tc) >> 2 != prof.roce_dscp:  # type: ignore[call-overload]
                add(
                    host,
                    nic,
                    Severity.CRIT,
                    "tclass",
                    f"RoCE traffic class {tc} (DSCP {int(tc) >> 2}) overrides every QP",  # type: ignore[call-overload]
                    prof.roce_dscp * 4 + 2,
                    f"echo {prof.roce_dscp * 4 + 2} > the traffic_class file of this port (DSCP "
                    f"{prof.roce_dscp}), or -1 to let NCCL_IB_TC decide",
                )
            elif tc is None and majority.get("tclass") is not None:
                add(
                    host,
                    nic,
                    Severity.WARN,
                    "tclass",
                    "no global RoCE traffic class set",
                    None,
                    "set the same traffic class as the other hosts, or NCCL_IB_TC in the vLLM units",
                    show=lambda x: "none" if x is None else str(x),
                )
        if "cm_tos" in v and int(v["cm_tos"]) >> 2 != prof.roce_dscp:  # type: ignore[call-overload]
            tos = int(v["cm_tos"])  # type: ignore[call-overload]
            add(
                host,
                nic,
                Severity.WARN,
                "cm_tos",
                f"RDMA-CM default ToS {tos} (DSCP {tos >> 2}): RDMA-CM connections that set no ToS "
                f"of their own are sent with DSCP {tos >> 2}, not the RoCE DSCP {prof.roce_dscp}",
                prof.roce_dscp * 4 + 2,
                f"cma_roce_tos -d {per_dev.get((host, nic)) or 'DEV'} -t {prof.roce_dscp * 4 + 2} (or write it to "
                "/sys/kernel/config/rdma_cm/DEV/ports/1/default_roce_tos)",
            )
        if v.get("global_pause"):
            add(
                host,
                nic,
                Severity.WARN,
                "global_pause",
                "802.3x global pause is on",
                False,
                f"ethtool -A {nic} rx off tx off: global pause stops every priority, not just RoCE",
                show=lambda x: "on" if x else "off",
            )
        if v.get("dcbx") == "firmware":
            add(
                host,
                nic,
                Severity.WARN,
                "dcbx",
                "DCBX is firmware controlled",
                "os",
                "the switch can push a different PFC configuration: set DCBX to OS control "
                "or check what the switch advertises",
            )
        for key in drift_keys:
            common = drift_majority.get(key)
            what = _drift_what(key)
            if key in v and common is not None and v[key] != common:
                add(
                    host,
                    nic,
                    Severity.WARN,
                    key,
                    f"{what} {_show(v[key])}",
                    None,
                    f"make the {what} the same as on the other hosts",
                    show=_show,
                )

    out = _leaf_rollup(ctx, out, described, sorted(set(order)))
    for host in dict.fromkeys(order):
        if host not in bad_hosts:
            out.append(Finding(CHECK, Severity.OK, host, "host", "QoS matches the fabric profile"))
    return out + unknown


def _leaf_rollup(
    ctx: AnalysisContext, found: list[Finding], what: list[tuple[str, Severity, str, str, str]], checked: list[str]
) -> list[Finding]:
    """One finding per leaf for a wrong setting every checked host under it shares (module doc)."""
    members: dict[str, list[str]] = {}
    for h in checked:
        leaf = fabric.leaf_of(ctx, h)
        if leaf is not None:
            members.setdefault(leaf, []).append(h)
    groups: dict[tuple[str, str, Severity, str], list[int]] = {}
    for i, (f, (key, sev, msg, _, _)) in enumerate(zip(found, what)):
        leaf = fabric.leaf_of(ctx, f.host or "")
        if leaf is not None:
            groups.setdefault((leaf, key, sev, msg), []).append(i)
    drop: set[int] = set()
    rolled: list[Finding] = []
    for (leaf, key, sev, msg), idx in groups.items():
        hosts = sorted({found[i].host or "" for i in idx})
        if len(members.get(leaf, [])) < 2 or hosts != sorted(members[leaf]):
            continue
        everywhere = {
            found[i].host for (_, k, sv, m), ix in groups.items() if (k, sv, m) == (key, sev, msg) for i in ix
        }
        if len(members) > 1 and everywhere >= set(checked):
            continue  # every host of every leaf: the cluster's configuration, not one switch's
        others = [h for h in checked if h not in everywhere]
        expected, action = what[idx[0]][3], what[idx[0]][4]
        if key in NET_APPLY_KEYS:
            action += fix_command(hosts)
        rel = (f"the profile says {expected}" if expected else "") + (
            f"{'; ' if expected else ''}{fabric.folded(others)} under other leaves do not" if others else ""
        )
        rolled.append(
            Finding(
                CHECK,
                sev,
                None,
                f"leaf:{leaf}",
                f"every host under leaf {leaf} ({fabric.folded(hosts)}): {msg}" + (f"; {rel}" if rel else ""),
                f"look at the leaf switch {leaf}: one setting on all its hosts comes from the switch "
                f"(DCBX) or one configuration for the leaf; fix it there, then on each host: {action}",
                tuple(f"{found[i].host} {found[i].subject.removeprefix('nic:')}: {found[i].evidence[0]}" for i in idx),
            )
        )
        drop.update(idx)
    return rolled + [f for i, f in enumerate(found) if i not in drop]
