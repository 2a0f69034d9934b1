"""An inventory written from what the hosts are, and where an inventory and the hosts disagree.

:func:`discover` turns facts documents (``docs/facts.md``) into inventory data:

* **GPUs** by model and count (``gpus: {count, model, memory_gib, interconnect}``;
  the most common set becomes ``defaults.gpus``, hosts that differ get their own);
* **NICs** with a guessed role: a port with an RDMA device is ``data`` (with
  ``rdma_device``, ``port``, ``speed_gbps``); the first other physical NIC that is
  up is ``management``; virtual interfaces are left out;
* **racks/leaves** from a naming rule: a regular expression with named groups
  ``rack`` and/or ``leaf`` matched against the host name (``--rack-rule``), giving a
  group per rack with ``labels: {rack, leaf}``.  (LLDP neighbours are not in the
  facts: not read.)
* **engines** found (:data:`ENGINE_PROBE` output: vLLM executables and versions).

Everything guessed is said in :attr:`Discovered.notes`, written as comments at the top
of the file: the operator reviews and edits it.

:func:`diff` compares an inventory with facts: per host, GPU count, model and memory,
declared NICs missing or not RDMA, speeds, RDMA ports the inventory does not list, and
engines whose path is missing.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from clusterctl.inventory.model import Inventory
from clusterctl.inventory.nodeset import fold, natural_key
from clusterctl.probe.factgroups import FactsDoc, GpusFact, HostFact, Nic, NicsFact, schema_problem

#: Shell run on each host to find vLLM installations: ``PATH<TAB>VERSION`` lines.
ENGINE_PROBE = (
    "for p in /opt/*/bin/vllm /usr/local/bin/vllm /usr/bin/vllm \"$(command -v vllm 2>/dev/null)\"; do "
    "[ -n \"$p\" ] && [ -x \"$p\" ] || continue; d=$(dirname \"$p\"); py=python3; "
    "[ -x \"$d/python3\" ] && py=\"$d/python3\"; "
    "v=$(\"$py\" -c 'import importlib.metadata as m; print(m.version(\"vllm\"))' 2>/dev/null || echo unknown); "
    "printf '%s\\t%s\\n' \"$p\" \"$v\"; done | sort -u"
)

_VIRTUAL = re.compile(r"^(lo|docker|veth|virbr|br-|cni|flannel|cali|vxlan|tun|tap|kube|bond|dummy|ib\d)")


@dataclass
class Discovered:
    """Inventory data (ready for YAML) and the notes on what was guessed or missing."""

    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def gpu_model(name: str, memory_total: int | None) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100-80GB-HBM3``: the NVML name without the vendor, dashed."""
    n = re.sub(r"^NVIDIA\s+", "", name.strip())
    return re.sub(r"\s+", "-", n) or "unknown"


def gpu_spec(doc: FactsDoc) -> dict[str, Any] | None:
    """``{count, model, memory_gib, interconnect}`` from one facts document, None without GPUs."""
    devs = GpusFact.parse(doc).devices
    if not devs:
        return None
    models = Counter(gpu_model(d.name, d.memory_total) for d in devs if d.name)
    mems = [d.memory_total for d in devs if d.memory_total is not None]
    nvlink = any(any(x.state == "active" for x in d.nvlink) for d in devs)
    return {
        "count": len(devs),
        "model": models.most_common(1)[0][0] if models else "unknown",
        "memory_gib": round(min(mems) / 2**30, 1) if mems else 0.0,
        "interconnect": "nvlink" if nvlink else "pcie",
    }


def _gbps(nic: Nic) -> float | None:
    """The RDMA port's rate, else the netdev's speed (Gbit/s); None when neither is known."""
    rate = nic.rdma.rate_gbps if nic.rdma is not None else None
    return rate or (nic.speed_mbps or 0) / 1000 or None


def nic_specs(doc: FactsDoc) -> tuple[list[dict[str, Any]], list[str]]:
    """The NICs of one facts document with their roles guessed, and notes on the guesses."""
    out: list[dict[str, Any]] = []
    notes: list[str] = []
    mgmt: dict[str, Any] | None = None
    for nic in NicsFact.parse(doc).nics:
        if not nic.netdev:
            continue
        name = nic.netdev
        if nic.rdma is not None:
            speed = _gbps(nic)
            spec: dict[str, Any] = {
                "netdev": name,
                "role": "data",
                "rdma_device": nic.rdma.device,
                "port": nic.rdma.port or 1,
            }
            if speed:
                spec["speed_gbps"] = float(speed)
            out.append(spec)
        elif mgmt is None and not _VIRTUAL.match(name) and nic.operstate in ("up", "unknown", None):
            mgmt = {"netdev": name, "role": "management"}
            if nic.speed_mbps:
                mgmt["speed_gbps"] = round(nic.speed_mbps / 1000, 1)
    if mgmt:
        out.insert(0, mgmt)
    return out, notes


#: Said at the top of every discovered inventory.
GUESSES = (
    "NIC roles are guessed: a port with an RDMA device is a data NIC, the first other physical NIC "
    "that is up the management NIC; check both"
)


def discover(
    facts: Mapping[str, FactsDoc],
    base: Mapping[str, Any],
    *,
    engines: Mapping[str, list[tuple[str, str]]] | None = None,
    rack_rule: re.Pattern[str] | None = None,
    missing: Mapping[str, str] | None = None,
) -> Discovered:
    """Inventory data: ``base`` (``version``, ``defaults.ssh``, ``hosts`` with their addresses and
    ssh, ``groups``) completed from ``facts`` (host -> document). ``missing``: hosts without facts
    and why (kept, with a note). ``engines``: host -> [(path, version)] from :data:`ENGINE_PROBE`."""
    data: dict[str, Any] = {k: v for k, v in base.items()}
    data["version"] = 1
    hosts: dict[str, Any] = {h: dict(v or {}) for h, v in (base.get("hosts") or {}).items()}
    notes: list[str] = []
    # a host given by its address is named by its hostname (when that is unique)
    names = {h: HostFact.parse(doc).hostname or "" for h, doc in facts.items() if _is_ip(h)}
    taken = Counter(list(names.values()) + [h for h in hosts if h not in names])
    rename = {h: n for h, n in names.items() if n and taken[n] == 1 and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n)}
    if rename:
        hosts = {rename.get(h, h): v for h, v in hosts.items()}
        facts = {rename.get(h, h): v for h, v in facts.items()}
        engines = {rename.get(h, h): v for h, v in (engines or {}).items()} if engines is not None else None
    specs = {h: gpu_spec(doc) for h, doc in facts.items()}
    common = Counter(tuple(sorted(s.items())) for s in specs.values() if s)
    defaults = dict(data.get("defaults") or {})
    if common:
        defaults["gpus"] = dict(common.most_common(1)[0][0])
    nic_sets: dict[str, list[dict[str, Any]]] = {}
    for h in sorted(facts, key=natural_key):
        entry = hosts.setdefault(h, {})
        s = specs[h]
        if s is None:
            entry["gpus"] = {"count": 0}
            notes.append(f"{h}: no GPU seen ({GpusFact.parse(facts[h]).reason or 'NVML lists none'})")
        elif s != defaults.get("gpus"):
            entry["gpus"] = s
        nics, nnotes = nic_specs(facts[h])
        notes += [f"{h}: {n}" for n in nnotes]
        nic_sets[h] = nics
        if not any(n["role"] == "management" for n in nics):
            notes.append(f"{h}: no management NIC guessed (no physical non-RDMA NIC up)")
    shapes = Counter(repr(v) for v in nic_sets.values())
    if shapes:
        usual = shapes.most_common(1)[0][0]
        defaults["nics"] = next(v for v in nic_sets.values() if repr(v) == usual)
        for h, v in nic_sets.items():
            if repr(v) != usual:
                hosts[h]["nics"] = v
    if defaults:
        data["defaults"] = defaults
    for h, why in (missing or {}).items():
        hosts.setdefault(h, {})
        notes.append(f"{h}: not reached ({why}): its GPUs and NICs are not filled in")
    if rack_rule is not None:
        groups = dict(data.get("groups") or {})
        racks: dict[str, dict[str, Any]] = {}
        for h in sorted(hosts, key=natural_key):
            m = rack_rule.search(h)
            if not m:
                notes.append(f"{h}: the rack rule does not match its name")
                continue
            labels = {k: v for k, v in m.groupdict().items() if v is not None and k in ("rack", "leaf")}
            key = labels.get("rack") or labels.get("leaf") or "?"
            g = racks.setdefault(f"rack-{key}", {"hosts": [], "labels": labels})
            g["hosts"].append(h)
        for name, g in racks.items():
            groups[name] = {"hosts": fold(g["hosts"]), "labels": g["labels"]}
        if groups:
            data["groups"] = groups
    found: dict[str, dict[str, str]] = {}
    for h, items in sorted((engines or {}).items()):
        for path, version in items:
            name = (
                "vllm-" + re.sub(r"[^A-Za-z0-9.]+", "-", version)
                if version != "unknown"
                else "vllm-" + re.sub(r"[^A-Za-z0-9]+", "-", path.strip("/"))
            )
            prev = found.get(name)
            if prev and prev["path"] != path:
                name = name + "-" + re.sub(r"[^A-Za-z0-9]+", "-", path.strip("/"))
            found.setdefault(name, {"path": path, "version": version})
    if found:
        data["engines"] = {**(data.get("engines") or {}), **found}
    elif engines is not None:
        notes.append("no vLLM installation found on any host (looked in /opt/*/bin, /usr/local/bin, PATH)")
    data["hosts"] = {h: (v if v else None) for h, v in sorted(hosts.items(), key=lambda kv: natural_key(kv[0]))}
    order = ["version", "defaults", "groups", "hosts", "engines"]
    data = {k: data[k] for k in order if k in data} | {k: v for k, v in data.items() if k not in order}
    return Discovered(data, [GUESSES] + notes)


@dataclass(frozen=True)
class Difference:
    """One place where the inventory and a host disagree."""

    host: str
    what: str
    inventory: str
    facts: str
    severity: str = "WARN"  # WARN: they differ; UNKNOWN: the host gave no facts

    def to_json(self) -> dict[str, str]:
        return {
            "host": self.host,
            "what": self.what,
            "inventory": self.inventory,
            "facts": self.facts,
            "severity": self.severity,
        }


def diff(
    inv: Inventory,
    facts: Mapping[str, FactsDoc],
    *,
    missing: Mapping[str, str] | None = None,
    engines: Mapping[str, list[tuple[str, str]]] | None = None,
) -> list[Difference]:
    """Where the inventory ``inv`` and the facts of its hosts disagree, host by host."""
    out: list[Difference] = []
    for h, why in (missing or {}).items():
        out.append(Difference(h, "reachable", "a host", f"no facts: {why}", "UNKNOWN"))
    for name in [n for n in inv.hosts if n in facts]:
        host, doc = inv.hosts[name], facts[name]
        if (unreadable := schema_problem(doc)) is not None:
            out.append(Difference(name, "facts", "readable", unreadable, "UNKNOWN"))
            continue
        want, seen = host.gpus, gpu_spec(doc)
        have = seen["count"] if seen else 0
        if want.count != have:
            out.append(Difference(name, "gpus.count", str(want.count), str(have)))
        if seen and want.count:
            if want.model and not same_model(want.model, seen["model"]):
                out.append(Difference(name, "gpus.model", want.model, seen["model"]))
            if want.memory_gib and abs(want.memory_gib - seen["memory_gib"]) > max(1.0, 0.02 * want.memory_gib):
                out.append(Difference(name, "gpus.memory_gib", f"{want.memory_gib:g}", f"{seen['memory_gib']:g}"))
        nics = {str(n.netdev): n for n in NicsFact.parse(doc).nics}
        declared = set()
        for spec in host.nics:
            declared.add(spec.netdev)
            n = nics.get(spec.netdev)
            if n is None:
                out.append(Difference(name, f"nic {spec.netdev}", spec.role, "absent"))
                continue
            rdma = n.rdma
            if spec.role == "data" and spec.rdma_device and not rdma:
                out.append(Difference(name, f"nic {spec.netdev}.rdma_device", spec.rdma_device, "no RDMA port"))
            elif spec.role == "data" and spec.rdma_device and rdma and rdma.device != spec.rdma_device:
                out.append(Difference(name, f"nic {spec.netdev}.rdma_device", spec.rdma_device, str(rdma.device)))
            speed = _gbps(n)
            if spec.speed_gbps and speed and abs(float(speed) - spec.speed_gbps) > 0.5:
                out.append(
                    Difference(name, f"nic {spec.netdev}.speed_gbps", f"{spec.speed_gbps:g}", f"{float(speed):g}")
                )
        for nd, n in sorted(nics.items()):
            if nd not in declared and n.rdma is not None:
                out.append(Difference(name, f"nic {nd}", "not listed", f"RDMA port {n.rdma.device}"))
        if engines is not None and name in engines:  # the engines the host's instances run on
            paths = dict(engines[name])
            used = sorted({i.engine for i in inv.instances.values() if name in i.hosts and i.engine in inv.engines})
            for ename in used:
                e = inv.engines[ename]
                if e.path not in paths:
                    out.append(Difference(name, f"engine {e.name}", e.path, "not found"))
                elif paths[e.path] not in ("unknown", e.version):
                    out.append(Difference(name, f"engine {e.name}.version", e.version, paths[e.path]))
    return out


def _model_key(model: str) -> tuple[str, str]:
    """(family, memory) of a GPU model string: ``H100-SXM5-80GB`` and ``NVIDIA H100 80GB HBM3`` both
    give ``("H100", "80")``; the form (SXM, PCIe, NVL) is not compared (names differ by source)."""
    text = model.upper().replace("NVIDIA", " ")
    family = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b", re.sub(r"[-_]", " ", text))
    mem = re.search(r"(\d+)\s*GB", text)
    return (family.group(1) if family else re.sub(r"[^A-Z0-9]", "", text), mem.group(1) if mem else "")


def same_model(a: str, b: str) -> bool:
    """Whether two GPU model strings name the same GPU (:func:`_model_key`; a missing memory matches)."""
    (fa, ma), (fb, mb) = _model_key(a), _model_key(b)
    return fa == fb and (ma == mb or not ma or not mb)


def parse_engines(stdout: str) -> list[tuple[str, str]]:
    """:data:`ENGINE_PROBE` output -> ``[(path, version)]``."""
    out = []
    for line in stdout.splitlines():
        path, _, version = line.partition("\t")
        if path.startswith("/"):
            out.append((path, version.strip() or "unknown"))
    return out
