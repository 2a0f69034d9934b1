"""``clusterctl net apply``: make every RoCE NIC match the inventory's QoS profile.

Per host, from the facts doctor's probe collects (``nics[].qos``, docs/facts.md):

* **plan** (:func:`host_plan`): each setting that differs from the profile —
  trust mode, the PFC priorities, the RoCE DSCP's priority, ECN notification
  and reaction point on the PFC priority, the CNP DSCP, the global RoCE
  traffic class and the RDMA-CM default ToS (both ``4 × DSCP + 2``), 802.3x
  global pause — and whether the
  persistence unit is installed as rendered.  Only what the host's tools can
  show is compared: ECN, CNP DSCP and the traffic class exist in MLNX_OFED's
  sysfs only; a DSCP map is not known while trust is pcp (set anyway).
* **script** (:func:`render_script`): one POSIX ``sh`` file per host that sets
  the whole profile, idempotently: ``mlnx_qos`` where the probe found it,
  iproute2 ``dcb`` otherwise; sysfs files written only when they differ.
* **persistence**: the script is installed as ``/etc/clusterctl/roce-qos.sh``
  and run by ``roce-qos.service`` (oneshot, enabled, ``WantedBy=multi-user``),
  so the settings come back after a reboot or a driver reload that resets the
  NIC; applying is ``systemctl restart roce-qos.service``, the same path as at
  boot.  Files are written temp + rename.
* **apply** (:class:`NetApply`): hosts with changes, in batches (``--serial``,
  default one host at a time; ``--max-fail-percentage`` as deploy), each host
  re-probed and checked by doctor's ``roce.qos`` analyzer afterwards; a batch
  over the failure limit stops the run (the rest are not touched).

Nothing here prints: progress goes to ``on_event(kind, message, host)``.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TypedDict

from clusterctl.bringup.batch import ApplyReport, HostOutcome, boot_unit_text, facts_of, failed_run, run_batches, settle
from clusterctl.diagnose import fabric, qos
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext
from clusterctl.fleet.factory import FleetFactory
from clusterctl.inventory.model import FabricProfile, Host, Inventory
from clusterctl.fleet.fleet import Fleet
from clusterctl.probe.factgroups import FactsDoc, Nic, NicsFact, Qos
from clusterctl.probe import run as probe_run

UNIT = "roce-qos.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
SCRIPT_PATH = "/etc/clusterctl/roce-qos.sh"
#: Netdev / RDMA device names the script will quote into commands (anything else is refused).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,31}$")

OnEvent = Callable[[str, str, "str | None"], None]


def tclass_for(dscp: int) -> int:
    """The RoCE traffic class byte for ``dscp`` (ECN bits 10: ECN-capable), as NVIDIA documents: 26 -> 106."""
    return dscp * 4 + 2


@dataclass
class Change:
    """One setting of one NIC (or the host's persistence unit) that differs."""

    nic: str
    item: str
    current: str
    wanted: str

    def to_dict(self) -> dict[str, str]:
        return {"nic": self.nic, "item": self.item, "current": self.current, "wanted": self.wanted}

    def line(self) -> str:
        where = f"{self.nic} " if self.nic else ""
        return f"{where}{self.item}: {self.current} -> {self.wanted}"


@dataclass
class NicTarget:
    """What the script does for one NIC: its tool and which optional sysfs files it has."""

    netdev: str
    tool: str  # "mlnx_qos" or "dcb"
    rdma_device: str | None = None
    port: int = 1
    ecn: bool = False
    tclass: bool = False
    cm_tos: bool = False


@dataclass
class HostPlan:
    host: str
    changes: list[Change] = field(default_factory=list)
    nics: list[NicTarget] = field(default_factory=list)
    script: str = ""
    error: str | None = None

    @property
    def pending(self) -> bool:
        return bool(self.changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "changes": [c.to_dict() for c in self.changes],
            "error": self.error,
            "nics": [n.netdev for n in self.nics],
        }


# ------------------------------------------------------------------ plan


def _prios(v: Sequence[int] | None) -> str:
    return "none" if not v else ",".join(str(p) for p in v)


def nic_changes(nic: Nic, prof: FabricProfile) -> list[Change]:
    """What differs between one NIC's QoS facts and the profile (only what the facts show)."""
    name = str(nic.netdev)
    q = nic.qos or Qos()
    p = prof.pfc_priority
    out: list[Change] = []
    if q.trust and q.trust != prof.trust:
        out.append(Change(name, "trust", q.trust, prof.trust))
    pfc: Sequence[int] | None = q.pfc_enabled
    if pfc is None:
        pfc = qos.pfc_from_counters(nic.ethtool_stats)
    if pfc is not None and list(pfc) != [p]:
        out.append(Change(name, "PFC priorities", _prios(pfc), str(p)))
    if prof.trust == "dscp" and q.trust == "dscp" and q.dscp2prio is not None:
        cur = q.dscp2prio.get(str(prof.roce_dscp))
        if cur != p:
            out.append(Change(name, f"DSCP {prof.roce_dscp} priority", "unmapped" if cur is None else str(cur), str(p)))
    if q.ecn is not None:
        for on, what in ((q.ecn.roce_np, "ECN notification point"), (q.ecn.roce_rp, "ECN reaction point")):
            if p not in on:
                out.append(Change(name, f"{what} on priority {p}", "off", "on"))
        if q.ecn.cnp_dscp is not None and q.ecn.cnp_dscp != prof.cnp_dscp:
            out.append(Change(name, "CNP DSCP", str(q.ecn.cnp_dscp), str(prof.cnp_dscp)))
    if q.traffic_class is not None or q.traffic_class_reason == "not set":
        want = tclass_for(prof.roce_dscp)
        if q.traffic_class != want:
            cur_tc = q.traffic_class
            out.append(Change(name, "RoCE traffic class", "not set" if cur_tc is None else str(cur_tc), str(want)))
    if q.cm_tos is not None and q.cm_tos != tclass_for(prof.roce_dscp):
        out.append(Change(name, "RDMA-CM default ToS", str(q.cm_tos), str(tclass_for(prof.roce_dscp))))
    if q.global_pause is not None and (q.global_pause.rx or q.global_pause.tx):
        out.append(Change(name, "802.3x global pause", "on", "off"))
    return out


def nic_target(nic: Nic) -> NicTarget:
    """The script's view of one NIC; raises ValueError for a tool-less NIC or an unsafe name."""
    name = nic.netdev or ""
    q = nic.qos or Qos()
    dev = nic.rdma.device if nic.rdma is not None else None
    if not _NAME.match(name) or (dev is not None and not _NAME.match(dev)):
        raise ValueError(f"{name!r}: not a network or RDMA device name this tool writes into commands")
    tool = q.tool
    if tool not in ("mlnx_qos", "dcb"):
        why = "; ".join(f"{k}: {v}" for k, v in q.reasons.items()) or "no tool answered"
        raise ValueError(
            f"{name}: neither mlnx_qos nor dcb can set its QoS ({why}); "
            "install mlnx-tools or iproute2 (dcb) on the node"
        )
    return NicTarget(
        netdev=name,
        tool=tool,
        rdma_device=dev or None,
        port=(nic.rdma.port if nic.rdma is not None else None) or 1,
        ecn=q.ecn is not None,
        tclass=q.traffic_class is not None or q.traffic_class_reason == "not set",
        cm_tos=q.cm_tos is not None,
    )


class Installed(TypedDict):
    """:func:`read_installed_command`'s output: path -> sha256 of the installed files, and
    whether the persistence unit is enabled."""

    sums: dict[str, str]
    enabled: bool


def installed_state(text: str) -> Installed:
    """Parse :func:`read_installed_command`'s output: file hashes and whether the unit is enabled."""
    sums: dict[str, str] = {}
    enabled = False
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and re.fullmatch(r"[0-9a-f]{64}", parts[0]):
            sums[parts[1]] = parts[0]
        elif line.startswith("enabled="):
            enabled = line.split("=", 1)[1].strip() == "enabled"
    return {"sums": sums, "enabled": enabled}


def read_installed_command() -> str:
    return f"sha256sum {SCRIPT_PATH} {UNIT_PATH} 2>/dev/null; echo enabled=$(systemctl is-enabled {UNIT} 2>/dev/null)"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def host_plan(
    host: str,
    facts: FactsDoc | None,
    prof: FabricProfile,
    installed: Installed | None,
    why_unread: str | None = None,
) -> HostPlan:
    """The plan of one host from its facts and what :func:`read_installed_command` printed."""
    plan = HostPlan(host)
    if facts is None:
        plan.error = why_unread or "no facts"
        return plan
    nics = NicsFact.parse(facts)
    if not nics.read:
        plan.error = "facts not readable: " + "; ".join(nics.reasons)
        return plan
    roce = nics.roce
    if not roce:
        plan.error = "no RoCE NIC in the facts (nothing with an RDMA port on Ethernet)"
        return plan
    try:
        plan.nics = [nic_target(n) for n in roce]
    except ValueError as e:
        plan.error = str(e)
        return plan
    for n in roce:
        plan.changes += nic_changes(n, prof)
    plan.script = render_script(host, plan.nics, prof)
    if installed is None:
        plan.error = why_unread or "could not read the installed persistence unit"
        return plan
    sums = installed["sums"]
    if sums.get(SCRIPT_PATH) != _sha(plan.script) or sums.get(UNIT_PATH) != _sha(UNIT_TEXT):
        plan.changes.append(
            Change(
                "",
                f"persistence ({UNIT}, {SCRIPT_PATH})",
                "differs" if SCRIPT_PATH in sums else "not installed",
                "installed",
            )
        )
    elif not installed["enabled"]:
        plan.changes.append(Change("", f"persistence ({UNIT})", "not enabled", "enabled"))
    return plan


# ---------------------------------------------------------------- script

UNIT_TEXT = boot_unit_text(
    "RoCE QoS profile of the inventory (written by clusterctl net apply)", SCRIPT_PATH, "man:dcb(8) man:mlnx_qos(8)"
)

_PRELUDE = """set -u
SYS=${ROCE_QOS_SYSFS:-/sys}
PATH=${PATH:-/usr/bin:/bin}:/usr/sbin:/usr/bin:/sbin:/bin
rc=0
step() { "$@" >/dev/null || { echo "failed: $*" >&2; rc=1; }; }
put() {  # put FILE VALUE [SHOWN]: write VALUE unless the file's first line already reads SHOWN (default VALUE)
  if [ ! -e "$1" ]; then echo "missing: $1" >&2; rc=1; return 0; fi
  [ "$(head -n 1 "$1")" = "${3-$2}" ] && return 0
  echo "$2" > "$1" || { echo "failed: write $2 to $1" >&2; rc=1; }
}
cm_tos() {  # cm_tos DEV PORT TOS: the RDMA-CM default ToS (configfs; cma_roce_tos where it exists), read back
  if command -v cma_roce_tos >/dev/null 2>&1; then
    got=$(cma_roce_tos -d "$1" -p "$2" -t "$3" 2>/dev/null | tail -n 1)
  else
    cm="$SYS/kernel/config/rdma_cm"
    [ -d "$cm" ] || [ "$SYS" != /sys ] || modprobe rdma_cm 2>/dev/null  # rdma-core loads it on most nodes
    [ -d "$cm" ] || { echo "missing: $cm (configfs not mounted or rdma_cm not loaded)" >&2; rc=1; return 0; }
    made=
    [ -d "$cm/$1" ] || { mkdir "$cm/$1" && made=1; }
    f="$cm/$1/ports/$2/default_roce_tos"
    [ "$(head -n 1 "$f" 2>/dev/null)" = "$3" ] || echo "$3" > "$f" 2>/dev/null
    got=$(head -n 1 "$f" 2>/dev/null)
    [ -z "$made" ] || rmdir "$cm/$1" 2>/dev/null
  fi
  [ "$got" = "$3" ] || { echo "failed: RDMA-CM default ToS of $1 port $2 reads ${got:-nothing}, not $3" >&2; rc=1; }
}
wait_nic() {  # a NIC whose driver is still loading at boot: up to 30 s
  i=0
  while [ ! -e "$SYS/class/net/$1" ] && [ "$i" -lt 30 ]; do sleep 1; i=$((i + 1)); done
  [ -e "$SYS/class/net/$1" ] || { echo "missing: network device $1" >&2; rc=1; return 1; }
}
"""


def _default_map(prof: FabricProfile) -> list[tuple[int, int]]:
    """The DSCP -> priority map a trust-dscp port gets: the firmware default (DSCP d -> d >> 3,
    what ``mlnx_qos --trust dscp`` installs without sysfs) with the RoCE DSCP on the PFC priority."""
    return [(d, prof.pfc_priority if d == prof.roce_dscp else d >> 3) for d in range(64)]


def render_script(host: str, nics: Sequence[NicTarget], prof: FabricProfile) -> str:
    """The host's ``roce-qos.sh``: the whole profile, safe to run again (module doc)."""
    p = prof.pfc_priority
    pfc_list = ",".join("1" if i == p else "0" for i in range(8))
    lines = [
        "#!/bin/sh",
        f"# RoCE QoS profile of {host}: written by clusterctl net apply (docs/bring-up.md); run by {UNIT}.",
        f"# trust {prof.trust}, PFC on priority {p} only"
        + (f", DSCP {prof.roce_dscp} -> priority {p}" if prof.trust == "dscp" else "")
        + f", ECN on priority {p}, CNP DSCP {prof.cnp_dscp}, RoCE traffic class and RDMA-CM default ToS "
        f"{tclass_for(prof.roce_dscp)}",
        _PRELUDE.rstrip("\n"),
    ]
    for n in nics:
        i = shlex.quote(n.netdev)
        lines.append(f"# {n.netdev} ({n.tool})")
        lines.append(f"if wait_nic {i}; then")
        if n.tool == "mlnx_qos":
            lines.append(f"  step mlnx_qos -i {i} --trust {prof.trust}")
            lines.append(f"  step mlnx_qos -i {i} --pfc {pfc_list}")
            if prof.trust == "dscp":
                lines.append(f"  step mlnx_qos -i {i} --dscp2prio set,{prof.roce_dscp},{p}")
        else:
            lines.append(f"  step dcb pfc set dev {i} prio-pfc all:off {p}:on")
            if prof.trust == "dscp":
                pairs = " ".join(f"{d}:{q}" for d, q in _default_map(prof))
                lines.append(f"  step dcb app replace dev {i} dscp-prio {pairs}")
            else:
                lines.append(f"  step dcb app flush dev {i} dscp-prio")
        if n.ecn:
            base = f'"$SYS/class/net/"{i}"/ecn'
            lines.append(f'  put {base}/roce_np/enable/{p}" 1')
            lines.append(f'  put {base}/roce_rp/enable/{p}" 1')
            lines.append(f'  put {base}/roce_np/cnp_dscp" {prof.cnp_dscp}')
        if n.tclass and n.rdma_device:
            tc = tclass_for(prof.roce_dscp)
            lines.append(
                f'  put "$SYS/class/infiniband/"{shlex.quote(n.rdma_device)}"/tc/{n.port}/traffic_class" '
                f'{tc} "Global tclass={tc}"'
            )
        if n.cm_tos and n.rdma_device:
            lines.append(f"  cm_tos {shlex.quote(n.rdma_device)} {n.port} {tclass_for(prof.roce_dscp)}")
        lines.append(
            f"  if ethtool -a {i} 2>/dev/null | grep -Eq '^(RX|TX):[[:space:]]+on'; then "
            f"step ethtool -A {i} rx off tx off; fi"
        )
        lines.append("fi")
    lines.append("exit $rc")
    return "\n".join(lines) + "\n"


def install_command(script: str) -> str:
    """Root shell: write the script and the unit (temp + rename), enable it, run it (restart)."""

    def put(path: str, text: str, mode: str) -> str:
        d, base = path.rsplit("/", 1)
        tmp = f"{d}/.{base}.tmp.$$"
        b64 = base64.b64encode(text.encode("utf-8")).decode("ascii")
        return (
            f"mkdir -p {shlex.quote(d)} && printf %s {shlex.quote(b64)} | base64 -d > {tmp} && "
            f"chmod {mode} {tmp} && mv -f {tmp} {shlex.quote(path)}"
        )

    return " && ".join(
        [
            "set -e",
            "umask 022",
            put(SCRIPT_PATH, script, "0755"),
            put(UNIT_PATH, UNIT_TEXT, "0644"),
            "systemctl daemon-reload",
            f"systemctl enable {UNIT} >/dev/null 2>&1",
        ]
    ) + (
        f"; if ! systemctl restart {UNIT}; then journalctl -u {UNIT} -n 20 --no-pager -o cat 2>/dev/null >&2; "
        f"echo '{UNIT} failed on this host' >&2; exit 1; fi"
    )


# --------------------------------------------------------------- re-check


def recheck(
    inventory: Inventory | None, facts: Mapping[str, FactsDoc], thresholds: Mapping[str, Any] | None = None
) -> dict[str, list[Finding]]:
    """Doctor's ``roce.qos`` on fresh facts; per host, its findings worse than OK.

    A leaf-wide finding (no host) counts for each of those hosts under that leaf.
    """
    ctx = AnalysisContext(inventory=inventory, facts=dict(facts), thresholds=thresholds or {})
    out: dict[str, list[Finding]] = {h: [] for h in facts}
    for f in qos.check_qos(ctx):
        if f.severity == Severity.OK:
            continue
        if f.host is not None:
            out.setdefault(f.host, []).append(f)
            continue
        leaf = f.subject.removeprefix("leaf:")
        for h in facts:
            if fabric.leaf_of(ctx, h) == leaf:
                out[h].append(f)
    return out


# ------------------------------------------------------------------- run


class NetApply:
    """Plan and apply the fabric profile on ``hosts`` (module doc)."""

    def __init__(
        self,
        inventory: Inventory,
        hosts: Sequence[Host],
        make_fleet: FleetFactory,
        *,
        serial: Sequence[str] = ("1",),
        max_fail_percentage: float = 0.0,
        probe_timeout: float = 60.0,
        sudo: bool = True,
        on_event: OnEvent | None = None,
    ) -> None:
        self.inventory = inventory
        self.hosts = list(hosts)
        self.make_fleet = make_fleet
        self.serial = list(serial) or ["1"]
        self.max_fail = max_fail_percentage
        self.timeout = probe_timeout
        self.sudo = sudo
        self.on_event = on_event or (lambda kind, msg, host: None)
        self.profile = (
            inventory.fabric if isinstance(getattr(inventory, "fabric", None), FabricProfile) else FabricProfile()
        )

    def _probe(self, fleet: Fleet) -> tuple[dict[str, FactsDoc], dict[str, str]]:
        return facts_of(probe_run.collect_facts(fleet, timeout=self.timeout, sudo=self.sudo))

    def _read(self, fleet: Fleet) -> tuple[dict[str, FactsDoc], dict[str, str], dict[str, Installed]]:
        facts, missing = self._probe(fleet)
        installed: dict[str, Installed] = {}
        for row in fleet.run(read_installed_command(), sudo=self.sudo, timeout=30):
            if row.ok:
                installed[row.host] = installed_state(row.stdout)
            else:
                missing.setdefault(row.host, row.error or row.stderr.strip() or f"exit {row.rc}")
        return facts, missing, installed

    def plan(self) -> list[HostPlan]:
        self.on_event("phase", f"reading the QoS of {len(self.hosts)} hosts", None)
        with self.make_fleet(self.hosts) as fleet:
            facts, missing, installed = self._read(fleet)
        return [
            host_plan(h.name, facts.get(h.name), self.profile, installed.get(h.name), missing.get(h.name))
            for h in self.hosts
        ]

    def run(self, plans: list[HostPlan] | None = None) -> ApplyReport:
        plans = self.plan() if plans is None else plans
        by_name = {h.name: h for h in self.hosts}
        return run_batches(
            plans,
            [h.name for h in self.hosts],
            self.serial,
            self.max_fail,
            lambda batch, n: self._apply_batch([by_name[p.host] for p in batch], batch, n),
            self.on_event,
        )

    def _apply_batch(self, hosts: list[Host], plans: list[HostPlan], n: int) -> list[HostOutcome]:
        out: dict[str, HostOutcome] = {}
        with self.make_fleet(hosts) as fleet:
            cmds = {p.host: install_command(p.script) for p in plans}
            for row in fleet.run(cmds, sudo=self.sudo, timeout=120):
                if not row.ok:
                    out[row.host] = failed_run(row, n)
            ok_hosts = [h for h in hosts if h.name not in out]
            if ok_hosts:
                facts, missing = self._probe(fleet)  # the re-check needs the facts only
                bad = recheck(self.inventory, {h.name: facts[h.name] for h in ok_hosts if h.name in facts})
                for h in ok_hosts:
                    if h.name not in facts:
                        out[h.name] = HostOutcome(
                            h.name, "failed", error="re-check: " + missing.get(h.name, "no facts"), batch=n
                        )
                    elif bad.get(h.name):
                        out[h.name] = HostOutcome(
                            h.name,
                            "failed",
                            error="re-check: doctor's roce.qos still finds "
                            + "; ".join(f.message for f in bad[h.name]),
                            findings=bad[h.name],
                            batch=n,
                        )
                    else:
                        out[h.name] = HostOutcome(h.name, "changed", batch=n)
        return settle(plans, out, self.on_event)
