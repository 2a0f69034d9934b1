"""``clusterctl node setup``: converge a node's prerequisites for instance units.

Per host, from the probe's facts (GPUs, NVSwitch fabric) and one read of the
node (:func:`read_command`: unit states, the service user, kernel parameters,
data-NIC MTUs, the files this command owns, its state file):

* **plan** (:func:`host_plan`): the items that differ, each with the current
  and wanted value.  An item whose current value could not be read is an
  error of the host, never "unchanged".
  - ``nvidia-persistenced`` enabled and active (hosts with GPUs; where the
    driver ships no unit and every GPU is already in persistence mode there is
    nothing to do);
  - ``nvidia-fabricmanager`` enabled and active on NVSwitch systems (the probe
    found a GPU fabric: ``gpus.fabric_manager`` is not null);
  - the service user of the instance units (``vllm``, or ``vars.service_user``)
    with its home, as deploy creates it;
  - ``/etc/security/limits.d/90-clusterctl-USER.conf``: memlock unlimited and
    nofile as the units' ``LimitNOFILE`` for that user's login sessions (units
    get theirs from ``LimitMEMLOCK=``/``LimitNOFILE=``, pam_limits does not
    apply to services);
  - kernel parameters (:func:`wanted_sysctls`): each value now, and the
    drop-in ``/etc/sysctl.d/90-clusterctl.conf`` that keeps them;
  - the data NICs' MTU (RoCE fabrics: the fabric profile's ``mtu``), kept by
    ``/etc/clusterctl/node-mtu.sh`` run by ``node-mtu.service`` at boot.
* **apply** (:class:`NodeSetup`): hosts with changes in batches (``--serial``,
  ``--max-fail-percentage``), one root ``sh`` script per host; each host read
  again afterwards: anything still differing fails it.
* **revert**: every value a change replaced is recorded first in
  ``/etc/clusterctl/node-setup.json`` (the first value seen wins over later
  applies); ``--revert`` puts those back, removes the files it wrote and the
  state file, and deletes a user it created (home kept) unless a unit uses it.

Files are written temp + rename.  Nothing here prints: progress goes to
``on_event(kind, message, host)``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NotRequired, Sequence, TypedDict

from clusterctl.deploy.units.nodesetup import ensure_user_script, user_home
from clusterctl.bringup.batch import (
    ApplyReport,
    HostOutcome,
    boot_unit_text,
    facts_of,
    failed_run,
    recheck_outcome,
    run_batches,
    settle,
)
from clusterctl.deploy.units.render import UnitPolicy
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.factory import FleetFactory
from clusterctl.fleet.shell import quote
from clusterctl.inventory.model import FabricProfile, Host, Inventory
from clusterctl.fleet.fleet import Fleet
from clusterctl.probe.factgroups import FactsDoc, GpusFact, NicsFact
from clusterctl.probe import run as probe_run

STATE_PATH = "/etc/clusterctl/node-setup.json"
SYSCTL_PATH = "/etc/sysctl.d/90-clusterctl.conf"
MTU_SCRIPT = "/etc/clusterctl/node-mtu.sh"
MTU_UNIT = "node-mtu.service"
MTU_UNIT_PATH = f"/etc/systemd/system/{MTU_UNIT}"
PERSISTENCED = "nvidia-persistenced.service"
FABRICMANAGER = "nvidia-fabricmanager.service"

_KEY = re.compile(r"^[a-z0-9_]+(\.[A-Za-z0-9_-]+)+$")
_VALUE = re.compile(r"^[A-Za-z0-9 _.:,/-]{1,200}$")
_NETDEV = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$")

OnEvent = Callable[[str, str, "str | None"], None]

#: Kernel parameters set by default, with the condition and the reason (docs/bring-up.md).
SYSCTL_REASONS = {
    "kernel.numa_balancing": "instances are pinned to their GPUs' NUMA node; automatic NUMA balancing "
    "unmaps and migrates their pages (kernel sysctl doc; NVIDIA CUDA best practices)",
    "net.ipv4.conf.all.arp_ignore": "several RDMA NICs in one subnet: answer ARP only on the NIC that owns the "
    "address, or RDMA-CM connects to the wrong port",
    "net.ipv4.conf.all.arp_announce": "several RDMA NICs in one subnet: use the outgoing NIC's own address in ARP",
}


def limits_path(user: str) -> str:
    return f"/etc/security/limits.d/90-clusterctl-{user}.conf"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _norm(v: Any) -> str:
    return " ".join(str(v).split())


@dataclass
class Change:
    """One item of one host that differs (or, for a revert, that will be put back)."""

    item: str
    current: str
    wanted: str
    kind: str = ""  # unit, user, file, sysctl, mtu
    key: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"item": self.item, "current": self.current, "wanted": self.wanted}

    def line(self) -> str:
        return f"{self.item}: {self.current} -> {self.wanted}"


@dataclass
class Wanted:
    """What node setup wants on one host (from the inventory and the facts)."""

    user: str
    nofile: int
    units: list[str]
    sysctls: dict[str, str]
    mtus: dict[str, int]

    def limits_text(self) -> str:
        return (
            f"# Written by clusterctl node setup (docs/bring-up.md): the vLLM service user's limits in\n"
            f"# login sessions (sudo -u {self.user}); its units set LimitMEMLOCK= and LimitNOFILE=.\n"
            f"{self.user} - memlock unlimited\n{self.user} - nofile {self.nofile}\n"
        )

    def sysctl_text(self) -> str:
        lines = ["# Written by clusterctl node setup (docs/bring-up.md); removed by node setup --revert."]
        for k, v in sorted(self.sysctls.items()):
            if k in SYSCTL_REASONS:
                lines.append(f"# {SYSCTL_REASONS[k]}")
            lines.append(f"{k} = {v}")
        return "\n".join(lines) + "\n"

    def mtu_script(self) -> str:
        lines = [
            "#!/bin/sh",
            f"# The data NICs' MTU: written by clusterctl node setup (docs/bring-up.md); run by {MTU_UNIT}.",
            "rc=0",
        ]
        for dev, mtu in sorted(self.mtus.items()):
            d = quote(dev)
            lines += [
                f"i=0; while [ ! -e /sys/class/net/{d} ] && [ $i -lt 30 ]; do sleep 1; i=$((i + 1)); done",
                f"[ \"$(cat /sys/class/net/{d}/mtu 2>/dev/null)\" = {mtu} ] || ip link set dev {d} mtu {mtu} "
                f"|| {{ echo 'failed: MTU {mtu} on {dev}' >&2; rc=1; }}",
            ]
        return "\n".join(lines + ["exit $rc"]) + "\n"

    def files(self) -> dict[str, str]:
        out = {limits_path(self.user): self.limits_text()}
        if self.sysctls:
            out[SYSCTL_PATH] = self.sysctl_text()
        if self.mtus:
            out[MTU_SCRIPT] = self.mtu_script()
            out[MTU_UNIT_PATH] = MTU_UNIT_TEXT
        return out


MTU_UNIT_TEXT = boot_unit_text("Data NIC MTU of the inventory (written by clusterctl node setup)", MTU_SCRIPT)


def _numa_nodes(facts: FactsDoc) -> set[int]:
    """NUMA nodes the facts document shows GPUs or NICs on (-1, "none", is left out)."""
    nodes = {d.numa_node for d in GpusFact.parse(facts).devices}
    nodes |= {n.numa_node for n in NicsFact.parse(facts).nics}
    return {n for n in nodes if n is not None and n >= 0}


def wanted_sysctls(host: Host, facts: FactsDoc) -> dict[str, str]:
    """The kernel parameters of ``host``: the defaults that apply, then the inventory's ``vars.sysctl``.

    Defaults: ``kernel.numa_balancing = 0`` where the facts show GPUs or NICs on
    more than one NUMA node; ``arp_ignore = 1`` and ``arp_announce = 2`` where
    the host has two or more data NICs.  ``vars.sysctl`` (key: value) adds or
    replaces; a null value drops a default.  Raises ClusterctlError for a key or
    value that is not plain (they go into files and shell commands).
    """
    out: dict[str, str] = {}
    if len(_numa_nodes(facts)) > 1:
        out["kernel.numa_balancing"] = "0"
    if len(host.nics_with_role("data")) >= 2:
        out["net.ipv4.conf.all.arp_ignore"] = "1"
        out["net.ipv4.conf.all.arp_announce"] = "2"
    extra = host.vars.get("sysctl")
    if extra is not None and not isinstance(extra, Mapping):
        raise ClusterctlError(f"host {host.name}: vars.sysctl must be a mapping of kernel parameter: value")
    for k, v in (extra or {}).items():
        k = str(k)
        if not _KEY.match(k):
            raise ClusterctlError(f"host {host.name}: vars.sysctl: {k!r} is not a kernel parameter name")
        if v is None:
            out.pop(k, None)
            continue
        if not _VALUE.match(_norm(v)):
            raise ClusterctlError(f"host {host.name}: vars.sysctl.{k}: {v!r} is not a plain value")
        out[k] = _norm(v)
    return out


def wanted_for(inv: Inventory, host: Host, facts: FactsDoc) -> Wanted:
    user = str(host.vars.get("service_user") or UnitPolicy().user)
    UnitPolicy(user=user)  # validates the name (ClusterctlError)
    gpus = GpusFact.parse(facts)
    units = []
    if gpus.available and (gpus.count or 0) > 0:
        units.append(PERSISTENCED)
    if gpus.fabric_manager is not None:
        units.append(FABRICMANAGER)
    mtus: dict[str, int] = {}
    prof = inv.fabric if isinstance(getattr(inv, "fabric", None), FabricProfile) else FabricProfile()
    if prof.kind == "roce":
        for n in host.nics_with_role("data"):
            if not _NETDEV.match(n.netdev):
                raise ClusterctlError(f"host {host.name}: {n.netdev!r} is not a network device name")
            mtus[n.netdev] = prof.mtu
    return Wanted(
        user=user, nofile=UnitPolicy().limit_nofile, units=units, sysctls=wanted_sysctls(host, facts), mtus=mtus
    )


# ----------------------------------------------------------------- read


def _proc(key: str) -> str:
    return "/proc/sys/" + key.replace(".", "/")


#: Every node path in the scripts is prefixed with $R (``NODE_SETUP_ROOT``, empty on a node) so
#: the unit tests can run them against a directory tree.
ROOT = 'R=${NODE_SETUP_ROOT:-}'


def _p(path: str) -> str:
    """``path`` on the node, quoted, under ``$R``."""
    return f'"$R"{quote(path)}'


def read_command(w: Wanted) -> str:
    """One shell command printing what :func:`parse_read` understands (every item of ``w``)."""
    parts = []
    for u in w.units:
        q = quote(u)
        parts.append(
            f"echo \"unit {u} $(systemctl show -p LoadState --value {q} 2>/dev/null || echo -) "
            f"$(systemctl is-enabled {q} 2>/dev/null || true) $(systemctl is-active {q} 2>/dev/null || true)\""
        )
    u = quote(w.user)
    parts.append(f"if getent passwd {u} >/dev/null; then echo 'user present'; else echo 'user absent'; fi")
    for k in sorted(w.sysctls):
        p = _p(_proc(k))
        parts.append(
            f"if v=$(cat {p} 2>/dev/null); then if [ -w {p} ]; then w=rw; else w=ro; fi; "
            f"echo \"sysctl {k} $w $v\"; else echo 'sysctl-unread {k}'; fi"
        )
    for dev in sorted(w.mtus):
        p = _p(f"/sys/class/net/{dev}/mtu")
        parts.append(f"if v=$(cat {p} 2>/dev/null); then echo \"mtu {dev} $v\"; else echo 'mtu-unread {dev}'; fi")
    files = " ".join(
        quote(f) for f in sorted(set(w.files()) | {SYSCTL_PATH, MTU_SCRIPT, MTU_UNIT_PATH, limits_path(w.user)})
    )
    parts.append(
        f"for f in {files}; do if [ -e \"$R$f\" ]; then echo \"file $f $(sha256sum < \"$R$f\" | cut -c1-64)\"; fi; done"
    )
    parts.append(f"echo \"mtu-unit $(systemctl is-enabled {MTU_UNIT} 2>/dev/null || true)\"")
    parts.append(f"if [ -e {_p(STATE_PATH)} ]; then echo \"state $(base64 -w0 < {_p(STATE_PATH)})\"; fi")
    return "; ".join([ROOT] + parts)


class UnitRead(TypedDict):
    """One unit as ``systemctl`` said: ``load``, ``enabled``, ``active`` ("" when it said nothing)."""

    load: str
    enabled: str
    active: str


class NodeRead(TypedDict):
    """What :func:`read_command` read on one node (:func:`parse_read`).

    ``user`` None: the passwd database could not be read; ``sysctl`` name -> value now,
    ``sysctl_ro`` the read-only ones; ``mtu`` netdev -> MTU (None: not a number);
    ``files`` path -> sha256; ``state`` the revert record (JSON as node setup wrote it;
    ``{"unreadable": True}`` when it is not JSON), None when there is none."""

    units: dict[str, UnitRead]
    user: bool | None
    sysctl: dict[str, str]
    sysctl_unread: list[str]
    sysctl_ro: NotRequired[list[str]]
    mtu: dict[str, int | None]
    mtu_unread: list[str]
    files: dict[str, str]
    state: dict[str, Any] | None
    mtu_unit: str


def parse_read(text: str) -> NodeRead:
    """:func:`read_command`'s output as ``{units, user, sysctl, sysctl_unread, mtu, mtu_unread, files, state}``."""
    out: NodeRead = {
        "units": {},
        "user": None,
        "sysctl": {},
        "sysctl_unread": [],
        "mtu": {},
        "mtu_unread": [],
        "files": {},
        "state": None,
        "mtu_unit": "",
    }
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if head == "unit":
            f = rest.split()
            if f:
                out["units"][f[0]] = {
                    "load": f[1] if len(f) > 1 else "",
                    "enabled": f[2] if len(f) > 2 else "",
                    "active": f[3] if len(f) > 3 else "",
                }
        elif head == "user":
            out["user"] = rest.strip() == "present"
        elif head == "sysctl":
            k, _, v = rest.partition(" ")
            mode, _, v = v.partition(" ")
            out["sysctl"][k] = _norm(v)
            if mode == "ro":
                out.setdefault("sysctl_ro", []).append(k)
        elif head == "sysctl-unread":
            out["sysctl_unread"].append(rest.strip())
        elif head == "mtu":
            dev, _, v = rest.partition(" ")
            out["mtu"][dev] = int(v) if v.strip().isdigit() else None
        elif head == "mtu-unread":
            out["mtu_unread"].append(rest.strip())
        elif head == "file":
            path, _, digest = rest.rpartition(" ")
            out["files"][path] = digest.strip()
        elif head == "mtu-unit":
            out["mtu_unit"] = rest.strip()
        elif head == "state":
            try:
                out["state"] = json.loads(base64.b64decode(rest.strip()).decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                out["state"] = {"unreadable": True}
    return out


# ----------------------------------------------------------------- plan


@dataclass
class HostPlan:
    host: str
    changes: list[Change] = field(default_factory=list)
    error: str | None = None
    script: str = ""
    notes: list[str] = field(default_factory=list)
    #: read, and the change is refused (``error`` says why: engine remove while a unit runs it), not unread
    refused: bool = False

    @property
    def pending(self) -> bool:
        return bool(self.changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "changes": [c.to_dict() for c in self.changes],
            "error": self.error,
            "notes": self.notes,
            "refused": self.refused,
        }


def host_plan(
    host: Host,
    inv: Inventory,
    facts: FactsDoc | None,
    read: NodeRead | None,
    why_unread: str | None = None,
) -> HostPlan:
    """The changes of one host (module doc), and the root script that makes them."""
    plan = HostPlan(host.name)
    if facts is None or read is None:
        plan.error = why_unread or "no facts"
        return plan
    try:
        w = wanted_for(inv, host, facts)
    except ClusterctlError as e:
        plan.error = str(e)
        return plan
    errors: list[str] = []
    gpus = GpusFact.parse(facts)
    if host.gpus.count and not gpus.available:
        errors.append(
            f"GPUs not readable ({gpus.reason or 'NVML unavailable'}): the persistence daemon "
            "and fabric manager cannot be planned"
        )
    for unit in w.units:
        st = read["units"].get(unit)
        if st is None or st["load"] in ("", "-"):
            errors.append(f"{unit}: systemctl could not say")
            continue
        if st["load"] == "not-found":
            if unit == PERSISTENCED and all(d.persistence_mode is True for d in gpus.devices):
                plan.notes.append(f"{unit} not installed; every GPU is in persistence mode")
                continue
            pkg = (
                "nvidia-fabricmanager (the driver branch's package)"
                if unit == FABRICMANAGER
                else "the driver's nvidia-persistenced"
            )
            errors.append(f"{unit} is not installed: install {pkg}")
            continue
        cur = f"{st['enabled'] or 'unknown'}/{st['active'] or 'unknown'}"
        if st["enabled"] != "enabled" or st["active"] != "active":
            plan.changes.append(Change(unit, cur, "enabled/active", "unit", unit))
    if read["user"] is None:
        errors.append("could not read the passwd database")
    elif not read["user"]:
        plan.changes.append(
            Change(f"service user {w.user}", "absent", f"present (home {user_home(w.user)})", "user", w.user)
        )
    for k in read["sysctl_unread"]:
        if k in w.sysctls:
            errors.append(f"{k}: cannot be read (no {_proc(k)})")
    for k, v in sorted(w.sysctls.items()):
        now = read["sysctl"].get(k)
        if now is not None and now != v:
            if k in read.get("sysctl_ro", []):
                errors.append(f"{k} is {now}, wanted {v}, but {_proc(k)} is read-only here (a container?)")
                continue
            plan.changes.append(Change(f"sysctl {k}", now, v, "sysctl", k))
    for dev in read["mtu_unread"]:
        errors.append(f"{dev}: MTU cannot be read (no such network device)")
    for dev, mtu in sorted(w.mtus.items()):
        cur_mtu = read["mtu"].get(dev)
        if dev in read["mtu"] and cur_mtu != mtu:
            plan.changes.append(Change(f"{dev} MTU", str(cur_mtu), str(mtu), "mtu", dev))
    files = read["files"]
    for path, text in w.files().items():
        if files.get(path) != _sha(text):
            plan.changes.append(Change(path, "differs" if path in files else "absent", "written", "file", path))
    if w.mtus and read["mtu_unit"] != "enabled":
        plan.changes.append(Change(MTU_UNIT, read["mtu_unit"] or "not installed", "enabled", "unit", MTU_UNIT))
    if errors:
        plan.error = "; ".join(errors)
        return plan
    if plan.changes:
        plan.script = apply_script(w, plan.changes, read)
    return plan


# --------------------------------------------------------------- scripts

_PRELUDE = (
    ROOT
    + """
set -u
umask 022
rc=0
step() { "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; rc=1; }; }
put() {  # put PATH MODE BASE64: write by temp + rename
  d=$(dirname "$1"); mkdir -p "$d" || { echo "failed: mkdir $d" >&2; rc=1; return 0; }
  t="$d/.$(basename "$1").tmp.$$"
  printf %s "$3" | base64 -d > "$t" && chmod "$2" "$t" && mv -f "$t" "$1" || { rm -f "$t"; echo "failed: write $1" >&2; rc=1; }
}"""
)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def new_state(old: Mapping[str, Any] | None, changes: Sequence[Change], read: NodeRead) -> dict[str, Any]:
    """The revert record after applying ``changes``: what each replaced, the first value seen kept."""
    items: dict[str, Any] = dict((old or {}).get("items") or {})
    for c in changes:
        key = f"{c.kind}:{c.key}"
        if key in items:
            continue
        if c.kind == "unit":
            st = read["units"].get(c.key)
            items[key] = (
                {"enabled": st["enabled"] if st else "", "active": st["active"] if st else ""}
                if c.key != MTU_UNIT
                else {"installed": True}
            )
        elif c.kind == "user":
            items[key] = {"created": True}
        elif c.kind == "sysctl":
            items[key] = {"value": c.current}
        elif c.kind == "mtu":
            items[key] = {"value": int(c.current)}
        elif c.kind == "file":
            items[key] = {"existed": c.current != "absent"}
    return {"version": 1, "written_by": "clusterctl node setup", "items": items}


def apply_script(w: Wanted, changes: Sequence[Change], read: NodeRead) -> str:
    """Root ``sh``: record the revert state, then make ``changes``; exits non-zero naming what failed."""
    state = new_state(read.get("state"), changes, read)
    files = w.files()
    lines = [
        "#!/bin/sh",
        "# clusterctl node setup",
        _PRELUDE,
        f"put {_p(STATE_PATH)} 0600 {quote(_b64(json.dumps(state, indent=1, sort_keys=True) + chr(10)))}",
        "[ $rc = 0 ] || exit 1  # no change without its revert record",
    ]
    for c in changes:
        if c.kind == "file":
            # a file that was there and not ours: kept beside as PATH.clusterctl-orig for --revert
            if c.current != "absent" and f"file:{c.key}" not in ((read.get("state") or {}).get("items") or {}):
                lines.append(
                    f"[ -e {_p(c.key + '.clusterctl-orig')} ] || cp -p {_p(c.key)} {_p(c.key + '.clusterctl-orig')}"
                )
            mode = "0755" if c.key == MTU_SCRIPT else "0644"
            lines.append(f"put {_p(c.key)} {mode} {quote(_b64(files[c.key]))}")
    for c in changes:
        if c.kind == "user":
            lines.append(f"( {ensure_user_script(w.user)} ) || {{ echo 'failed: create user {w.user}' >&2; rc=1; }}")
        elif c.kind == "sysctl":
            lines.append(f"step sysctl -w {quote(c.key + '=' + w.sysctls[c.key])}")
        elif c.kind == "mtu":
            lines.append(f"step ip link set dev {quote(c.key)} mtu {w.mtus[c.key]}")
    if any(c.kind == "file" and c.key == MTU_UNIT_PATH for c in changes) or any(c.kind == "unit" for c in changes):
        lines.append("step systemctl daemon-reload")
    for c in changes:
        if c.kind == "unit":
            lines.append(f"step systemctl enable {quote(c.key)}")
            if c.key != MTU_UNIT:
                lines.append(f"step systemctl start {quote(c.key)}")
    lines.append("exit $rc")
    return "\n".join(lines) + "\n"


def revert_plan(host: str, read: NodeRead | None, why_unread: str | None = None) -> HostPlan:
    """What ``--revert`` puts back on one host, from its state file."""
    plan = HostPlan(host)
    if read is None:
        plan.error = why_unread or "could not read the node"
        return plan
    state = read.get("state")
    if state is None:
        return plan
    if not isinstance(state, dict) or state.get("unreadable") or not isinstance(state.get("items"), dict):
        plan.error = f"{STATE_PATH} is not readable: revert by hand (docs/bring-up.md)"
        return plan
    lines = ["#!/bin/sh", "# clusterctl node setup --revert", _PRELUDE]
    tail: list[str] = []
    for key, rec in sorted(state["items"].items()):
        kind, _, name = key.partition(":")
        if kind == "file":
            orig = name + ".clusterctl-orig"
            if rec.get("existed"):
                plan.changes.append(Change(name, "written", "restored", kind, name))
                lines.append(f"if [ -e {_p(orig)} ]; then mv -f {_p(orig)} {_p(name)}; fi")
            else:
                plan.changes.append(Change(name, "written", "removed", kind, name))
                lines.append(f"rm -f {_p(name)}")
        elif kind == "unit" and name == MTU_UNIT:
            plan.changes.append(Change(name, "enabled", "removed", kind, name))
            lines.insert(3, f"step systemctl disable {quote(name)}")
        elif kind == "unit":
            en, act = rec.get("enabled") or "", rec.get("active") or ""
            plan.changes.append(Change(name, "enabled/active", f"{en or 'unknown'}/{act or 'unknown'}", kind, name))
            if en in ("disabled", "masked") and en:
                tail.append(f"step systemctl {'mask' if en == 'masked' else 'disable'} {quote(name)}")
            if act and act != "active":
                tail.append(f"step systemctl stop {quote(name)}")
        elif kind == "user":
            u = quote(name)
            plan.changes.append(
                Change(f"service user {name}", "present", "removed (home kept) unless a unit uses it", kind, name)
            )
            tail.append(
                f"if grep -lsx 'User={name}' \"$R\"/etc/systemd/system/clusterctl-*.service >/dev/null 2>&1; then "
                f"echo 'kept: user {name} is the User= of clusterctl units' >&2; "
                f"elif id -u {u} >/dev/null 2>&1; then step userdel {u}; fi"
            )
        elif kind == "sysctl":
            plan.changes.append(Change(f"sysctl {name}", "set", str(rec.get("value")), kind, name))
            val = _norm(rec.get("value"))
            tail.append(
                f"[ \"$(cat {_p(_proc(name))} 2>/dev/null | tr -s ' \\t' '  ')\" = {quote(val)} ] || "
                f"step sysctl -w {quote(name + '=' + val)}"
            )
        elif kind == "mtu":
            plan.changes.append(Change(f"{name} MTU", "set", str(rec.get("value")), kind, name))
            mtu = int(rec.get("value") or 1500)
            tail.append(
                f"[ \"$(cat {_p(f'/sys/class/net/{name}/mtu')} 2>/dev/null)\" = {mtu} ] || "
                f"step ip link set dev {quote(name)} mtu {mtu}"
            )
    lines += [
        "step systemctl daemon-reload",
        *tail,
        f"if [ $rc = 0 ]; then rm -f {_p(STATE_PATH)}; else echo 'kept {STATE_PATH} for another --revert' >&2; fi",
        "exit $rc",
    ]
    plan.script = "\n".join(lines) + "\n"
    return plan


# ------------------------------------------------------------------- run


class NodeSetup:
    """Plan, apply or revert the node prerequisites on ``hosts`` (module doc)."""

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
        revert: bool = False,
        on_event: OnEvent | None = None,
    ) -> None:
        self.inventory = inventory
        self.hosts = list(hosts)
        self.by_name = {h.name: h for h in self.hosts}
        self.make_fleet = make_fleet
        self.serial = list(serial) or ["1"]
        self.max_fail = max_fail_percentage
        self.timeout = probe_timeout
        self.sudo = sudo
        self.revert = revert
        self.on_event = on_event or (lambda kind, msg, host: None)
        self._facts: dict[str, FactsDoc] = {}

    def _probe(self, fleet: Fleet) -> tuple[dict[str, FactsDoc], dict[str, str]]:
        return facts_of(probe_run.collect_facts(fleet, timeout=self.timeout, sudo=self.sudo))

    def _plans(self, fleet: Fleet, hosts: Sequence[Host], reuse_facts: bool = False) -> list[HostPlan]:
        """Plans of ``hosts``; ``reuse_facts``: the plan's facts (GPUs, fabric, NUMA: nothing node setup
        changes) with a fresh read of the node, for the re-check after a batch."""
        if self.revert:
            reads, missing = self._read(fleet, {h.name: read_command(Wanted("root", 0, [], {}, {})) for h in hosts})
            return [revert_plan(h.name, reads.get(h.name), missing.get(h.name)) for h in hosts]
        if reuse_facts and all(h.name in self._facts for h in hosts):
            facts, missing = self._facts, {}
        else:
            facts, missing = self._probe(fleet)
            self._facts.update(facts)
        cmds: dict[str, str] = {}
        plans: dict[str, HostPlan] = {}
        for h in hosts:
            if h.name not in facts:
                continue
            try:
                cmds[h.name] = read_command(wanted_for(self.inventory, h, facts[h.name]))
            except ClusterctlError as e:
                plans[h.name] = HostPlan(h.name, error=str(e))
        reads, rmissing = self._read(fleet, cmds) if cmds else ({}, {})
        for h in hosts:
            if h.name not in plans:
                plans[h.name] = host_plan(
                    h, self.inventory, facts.get(h.name), reads.get(h.name), missing.get(h.name) or rmissing.get(h.name)
                )
        return [plans[h.name] for h in hosts]

    def _read(self, fleet: Fleet, cmds: Mapping[str, str]) -> tuple[dict[str, NodeRead], dict[str, str]]:
        reads: dict[str, NodeRead] = {}
        missing: dict[str, str] = {}
        for row in fleet.run(dict(cmds), sudo=self.sudo, timeout=30):
            if row.ok:
                reads[row.host] = parse_read(row.stdout)
            else:
                missing[row.host] = row.error or (row.stderr or "").strip() or f"exit {row.rc}"
        return reads, missing

    def plan(self) -> list[HostPlan]:
        what = "the revert records" if self.revert else "the node prerequisites"
        self.on_event("phase", f"reading {what} of {len(self.hosts)} hosts", None)
        with self.make_fleet(self.hosts) as fleet:
            return self._plans(fleet, self.hosts)

    def run(self, plans: list[HostPlan] | None = None) -> ApplyReport:
        plans = self.plan() if plans is None else plans
        return run_batches(
            plans, [h.name for h in self.hosts], self.serial, self.max_fail, self._apply_batch, self.on_event
        )

    def _apply_batch(self, plans: list[HostPlan], n: int) -> list[HostOutcome]:
        hosts = [self.by_name[p.host] for p in plans]
        out: dict[str, HostOutcome] = {}
        done = "reverted" if self.revert else "changed"
        with self.make_fleet(hosts) as fleet:
            cmds = {p.host: "sh -c " + quote(p.script) for p in plans}
            for row in fleet.run(cmds, sudo=self.sudo, timeout=180):
                if not row.ok:
                    out[row.host] = failed_run(row, n)
            ok_hosts = [h for h in hosts if h.name not in out]
            if ok_hosts:
                for p in self._plans(fleet, ok_hosts, reuse_facts=True):  # read again: nothing may still differ
                    out[p.host] = recheck_outcome(p, n, done)
        return settle(plans, out, self.on_event)
