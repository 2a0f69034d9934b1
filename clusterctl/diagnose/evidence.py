"""Raw outputs an operator has, recognised by content and read as probe facts.

A support engineer is handed ``ethtool -S eth2``, ``mlnx_qos -i eth2``,
``nvidia-smi -q``, a ``dmesg -T``, an ``nvidia-bug-report.log.gz``...  For
each file :func:`recognise` says what it is from its content (the name is
only a hint: which NIC, which instance); :func:`host_evidence` turns one
host's files into what the analyzers read: a partial facts document built
with the probe's own parsers (``clusterctl/node/collector.py`` for the NIC
tools, :mod:`clusterctl.diagnose.nvsmi` for NVIDIA's), raw texts (kernel
log, vLLM logs, ``/metrics``) and one :class:`Seen` per file saying what was
recognised or why it was ignored (``doctor --explain-input``).

A partial document has ``evidence.covers``: the checks its data can
answer.  :func:`not_checked` turns every other selected check of such a host
into an UNKNOWN row, so a host is never declared healthy on data nobody saw.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping

from clusterctl.diagnose import nvsmi, sources
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.inputs import MAX_FILE_BYTES, bounded_text, load_json
from clusterctl.node import collector as col
from clusterctl.probe.factgroups import FactsDoc

ROCE_CHECKS = (
    "roce.pfc",
    "roce.discards",
    "roce.congestion",
    "roce.link",
    "roce.rxpath",
    "roce.priority",
    "roce.transport",
)
#: The RoCE checks whose counters are all RDMA hw counters (``rdma statistic`` alone answers them).
HW_COUNTER_CHECKS = ("roce.congestion", "roce.transport")


@dataclass
class Seen:
    """One input file: what it was recognised as (``kind``, None when ignored) and a note."""

    path: str
    kind: str | None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "note": self.note}


@dataclass
class HostEvidence:
    """What one host's raw files gave: a partial facts document (None when nothing for it),
    raw texts by :mod:`sources` names, and the per-file record."""

    facts: dict[str, Any] | None = None
    raw: dict[str, str] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)


# ------------------------------------------------------------- recognising

_KERNEL = re.compile(
    r"^(?:\[\s*\d+\.\d+\]"  # dmesg
    r"|\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} [ \d]\d [\d:]{8} \d{4}\]"  # dmesg -T
    r"|(?:\w{3} [ \d]\d [\d:]{8}|\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d\d:?\d\d|Z)?) \S+ kernel:)"
)  # journal, syslog
_VLLM = re.compile(r"vllm|APIServer pid=|EngineCore|api_server\.py", re.I)
_CSV_HEAD = re.compile(
    r"^\s*[a-z_]+(?:\.[a-z_0-9]+)*(?: \[[^\]]*\])?(?:\s*,\s*[a-z_]+(?:\.[a-z_0-9]+)*(?: \[[^\]]*\])?)+\s*$"
)
_BUG_SEP = re.compile(r"^_{20,}\s*$", re.M)


def _lines(text: str, n: int = 200) -> list[str]:
    """The first ``n`` non-blank lines (only the head of the text is split)."""
    return [x for x in text[: 256 * 1024].splitlines()[: n * 2] if x.strip()][:n]


def recognise(text: str) -> tuple[str | None, str]:
    """``(kind, note)`` of a text by its content; ``(None, why)`` when it is nothing doctor reads."""
    head = _lines(text)
    if not head:
        return None, "empty"
    first = head[0].strip()
    body = "\n".join(head)
    if first.startswith("{") and _journal_json(first):
        return "kernel log", "journalctl -k -o json"
    if first.startswith(("{", "[")):
        kind, note = _recognise_json(text)
        if kind is not None or first.startswith("{"):
            return kind, note
    if "nvidia-bug-report" in body.lower() and _BUG_SEP.search(text):
        return "nvidia-bug-report", ""
    if "NVSMI LOG" in body or (
        re.search(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:", body, re.M) and "Product Name" in body
    ):
        return "nvidia-smi -q", ""
    if any(x.strip() == "NIC statistics:" for x in head[:5]):
        return "ethtool -S", ""
    if any(x.startswith("Pause parameters for") for x in head[:3]):
        return "ethtool -a", ""
    if any(x.strip().startswith(("DCBX mode:", "Priority trust state:", "PFC configuration:")) for x in head):
        return "mlnx_qos", ""
    words = {x.split()[0] for x in head}
    if "prio-pfc" in words or "pfc-cap" in words:
        return "dcb pfc", ""
    if "dscp-prio" in words or words <= {
        "default-prio",
        "pcp-prio",
        "ethtype-prio",
        "stream-port-prio",
        "dgram-port-prio",
        "dscp-prio",
    }:
        return "dcb app", ""
    if "order:" in words:
        return "dcb apptrust", ""
    if "prio-tc" in words or "tc-tsa" in words or "tc-bw" in words:
        return "dcb ets", ""
    if "Global tclass=" in body or first.startswith("Global tclass"):
        return "traffic_class", ""
    if col.parse_ecn_dump(body) is not None:
        return "ecn sysfs", ""
    if sum(" ==> " in x for x in head) * 2 >= len(head):
        return "ibdev2netdev", ""
    if first.split()[:4] == ["DEV", "PORT", "INDEX", "GID"]:
        return "show_gids", ""
    if first.startswith("link ") and "/" in first.split()[1]:
        return "rdma statistic", ""
    if len(head) > 1 and parse_time(first.lstrip("#").strip()) is not None:  # a `date` line, then the output
        kind, note = recognise(text.split("\n", 1)[1] if "\n" in text else "")
        if kind in ("rdma statistic", "ethtool -S"):
            return kind, note
    if re.match(r"^\s*GPU\d+\s+GPU\d+", first) or (first.split()[:1] == ["GPU0"] and "X" in body):
        return "nvidia-smi topo -m", ""
    if re.match(r"^GPU \d+: .*\(UUID: ", first) and re.search(r"^\s*Link \d+:", body, re.M):
        return "nvidia-smi nvlink", ""
    if _CSV_HEAD.match(first) and "," in first and any(k in first for k in ("index", "pci.bus_id", "uuid", "name")):
        return "nvidia-smi --query-gpu", ""
    if any(x.startswith(("# HELP vllm:", "# TYPE vllm:")) or x.startswith("vllm:") for x in head):
        return "vllm metrics", ""
    kernel = sum(1 for x in head if _KERNEL.match(x))
    if kernel and kernel * 2 >= len(head):
        return "kernel log", ""
    if any(_VLLM.search(x) for x in head):
        return "vllm log", ""
    return None, "not an output doctor recognises (see docs/bundles.md for the list)"


def _journal_json(line: str) -> dict[str, Any] | None:
    """One ``journalctl -o json`` line with a kernel message, or None."""
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return (
        doc
        if isinstance(doc, dict)
        and "MESSAGE" in doc
        and (doc.get("_TRANSPORT") == "kernel" or doc.get("SYSLOG_IDENTIFIER") == "kernel")
        else None
    )


def journal_text(text: str) -> str:
    """``journalctl -k -o json`` as one message per line, as the live probe turns it
    (:func:`clusterctl.node.collector.journal_line`)."""
    out = []
    for line in text.splitlines():
        doc = _journal_json(line) if line.startswith("{") else None
        if doc is not None:
            out.append(str(col.journal_line(doc)["text"]))
    return "\n".join(out) + "\n"


def _recognise_json(text: str) -> tuple[str | None, str]:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None, "starts like JSON but is not valid JSON"
    if isinstance(doc, dict) and "schema" in doc and "gpus" in doc:
        return "facts.json", ""
    if isinstance(doc, dict) and any(isinstance(v, dict) and "test_categories" in v for v in doc.values()):
        return "dcgmi diag -j", ""
    if isinstance(doc, list) and doc and all(isinstance(x, dict) and "ifname" in x for x in doc):
        return "rdma statistic", ""
    return None, "JSON of no known kind"


def split_bug_report(text: str) -> list[tuple[str, str]]:
    """The sections of an ``nvidia-bug-report.log``: ``(title, text)`` per block between its
    ``____`` separator lines (the title is the block's first line: a command or a file name)."""
    out = []
    for i, block in enumerate(_BUG_SEP.split(text)):
        lines = block.strip("\n").splitlines()
        if not lines:
            continue
        title = lines[0].strip()[:120]
        rest = "\n".join(x for x in lines[1:] if not x.startswith("*** ls:"))
        out.append((f"section {i}: {title}", rest.strip("\n") + "\n"))
    return out


def decode(data: bytes) -> tuple[str | None, str]:
    """Text of a file's bytes (gunzipped when gzip, bounded); ``(None, why)`` for binary data."""
    if data[:2] == b"\x1f\x8b":
        out = bytearray()
        rest = data
        try:
            while rest[:2] == b"\x1f\x8b":  # nvidia-bug-report.sh appends one gzip member per section
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                out += d.decompress(rest, MAX_FILE_BYTES + 1 - len(out))
                if len(out) > MAX_FILE_BYTES or d.unconsumed_tail:
                    return None, f"gzip content larger than {MAX_FILE_BYTES // 2**20} MiB; not read"
                if not d.eof:
                    return None, "damaged gzip file (truncated)"
                rest = d.unused_data
        except zlib.error as e:
            return None, f"damaged gzip file: {e}"
        data = bytes(out)
    if b"\0" in data[:4096]:
        return None, "binary data"
    return bounded_text(data), ""


# --------------------------------------------------------------- the names

_NETDEV = re.compile(
    r"(?<![A-Za-z0-9])((?:eth|ens|enp|eno|enx|ib|bond|mlx5_|rdma|p\d+p|em|roce)[A-Za-z0-9]*"
    r"(?:np\d+|v\d+)?)(?![A-Za-z0-9])"
)


def netdev_hint(*texts: str | None) -> str | None:
    """A NIC name in a command line or a file name (``ethtool -S eth2``, ``ethtool_S_ens1f0np0.txt``)."""
    for t in texts:
        if not t:
            continue
        for tok in re.split(r"[\s/]+", t):
            tok = re.sub(r"\.(txt|log|out)$", "", tok)
            for part in re.split(r"[_.]+|-(?=[a-z])", tok) + [tok]:
                if _NETDEV.fullmatch(part) and not part.startswith("mlx5_") and any(c.isdigit() for c in part):
                    return part
    return None


def parse_time(text: str | None) -> float | None:
    """Epoch seconds from an ISO 8601 stamp, a Unix epoch, or ``date``'s default output."""
    if not text:
        return None
    t = text.strip()
    if re.fullmatch(r"\d{9,10}(?:\.\d+)?", t):
        return float(t)
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
        return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    except ValueError:
        pass
    m = re.fullmatch(r"\w{3} (\w{3}) +(\d{1,2}) (\d\d:\d\d:\d\d)(?: \w+)? (\d{4})", t)
    if m:
        try:
            return (
                datetime.strptime(f"{m.group(1)} {m.group(2)} {m.group(3)} {m.group(4)}", "%b %d %H:%M:%S %Y")
                .replace(tzinfo=timezone.utc)
                .timestamp()
            )
        except ValueError:
            return None
    return None


# ---------------------------------------------------------------- building


@dataclass
class _Item:
    path: str
    kind: str
    text: str
    argv: str | None = None
    at: float | None = None


def _sample_time(item: _Item) -> float | None:
    if item.at is not None:
        return item.at
    for line in item.text[:4096].splitlines()[:3]:
        if line.strip() == "NIC statistics:":
            break
        t = parse_time(line.strip().lstrip("#").strip().removeprefix("time:").strip())
        if t is not None:
            return t
    return None


def host_evidence(files: Iterable[tuple[str, bytes]], index: dict[str, dict[str, Any]] | None = None) -> HostEvidence:
    """One host's files (``(relative path, bytes)``) as a :class:`HostEvidence`.

    ``index``: per file name, the ``commands/index.json`` record (argv, started_at)."""
    ev = HostEvidence()
    items: list[_Item] = []
    index = index or {}

    def add(path: str, text: str, rec: dict[str, Any] | None) -> None:
        kind, note = recognise(text)
        if kind is None:
            ev.seen.append(Seen(path, None, note))
            return
        if kind == "nvidia-bug-report":
            parts = split_bug_report(text)
            ev.seen.append(Seen(path, kind, f"split into {len(parts)} sections"))
            for title, part in parts:
                k, n = recognise(part)
                if k is not None and k != "nvidia-bug-report":
                    add(f"{path} [{title}]", part, None)
            return
        argv = " ".join(map(str, rec["argv"])) if rec and isinstance(rec.get("argv"), list) else None
        at = parse_time(str(rec.get("started_at") or rec.get("at") or "")) if rec else None
        items.append(_Item(path, kind, text, argv, at))
        ev.seen.append(Seen(path, kind, note))

    for path, data in files:
        name = path.rsplit("/", 1)[-1]
        if name in ("index.json", "bundle.json"):
            continue
        text, why = decode(data)
        if text is None:
            ev.seen.append(Seen(path, None, why))
            continue
        add(path, text, index.get(name))
    _build(ev, items)
    return ev


def _build(ev: HostEvidence, items: list[_Item]) -> None:
    doc: dict[str, Any] = {"schema": 1, "collected_at": None, "errors": []}
    covers: set[str] = set()
    seen_kinds = sorted({i.kind for i in items})
    for it in items:
        if it.kind == "facts.json":
            ev.seen.append(
                Seen(it.path, None, "a facts document belongs in hosts/NAME/facts.json; not merged with raw outputs")
            )
    gpu_items = [i for i in items if i.kind in ("nvidia-smi -q", "nvidia-smi --query-gpu")]
    topo_items = [i for i in items if i.kind == "nvidia-smi topo -m"]
    topo = nvsmi.parse_topo_matrix(topo_items[-1].text) if topo_items else None
    for i in topo_items[:-1]:
        _note(ev, i.path, f"not used: another topo -m; {topo_items[-1].path} is used")
    if topo is not None and not gpu_items:
        _note(ev, topo_items[-1].path, "not used: no nvidia-smi -q or --query-gpu for the same GPUs")
        topo = None
    if gpu_items:
        best = max(gpu_items, key=lambda i: (i.kind == "nvidia-smi -q", len(i.text)))
        gpus = (nvsmi.parse_nvidia_smi_q if best.kind == "nvidia-smi -q" else nvsmi.parse_query_gpu_csv)(best.text)
        for other in gpu_items:
            if other is not best:
                ev.seen.append(Seen(other.path, None, f"another GPU listing; {best.path} is used"))
        links: dict[int, list[dict[str, Any]]] = {}
        for i in (x for x in items if x.kind == "nvidia-smi nvlink"):
            for g, ls in nvsmi.parse_nvlink(i.text).items():
                merged = {lk["link"]: lk for lk in links.get(g, [])}
                for lk in ls:
                    old = merged.get(lk["link"])
                    if old:
                        old["state"] = old["state"] or lk["state"]
                        old["errors"].update({k: v for k, v in lk["errors"].items() if v is not None})
                    else:
                        merged[lk["link"]] = lk
                links[g] = [merged[k] for k in sorted(merged)]
        for d in gpus.get("devices") or []:
            got = links.get(d.get("index"))
            if got and all(lk["state"] is not None for lk in got):
                d["nvlink"] = got
            elif got:
                d.setdefault("field_errors", {})["nvlink"] = "nvlink states unknown (give nvidia-smi nvlink -s too)"
        doc["gpus"] = gpus
        covers |= nvsmi.covered_checks(gpus)
        if topo is not None:
            _topo_gpus(ev, gpus, topo, topo_items[-1].path)
    elif any(i.kind == "nvidia-smi nvlink" for i in items):
        for i in items:
            if i.kind == "nvidia-smi nvlink":
                ev.seen.append(
                    Seen(i.path, "nvidia-smi nvlink", "not used: no nvidia-smi -q or --query-gpu for the same GPUs")
                )
    dcgm = [i for i in items if i.kind == "dcgmi diag -j"]
    if dcgm:
        try:
            doc["dcgm_diag"] = nvsmi.parse_dcgmi_diag(load_json(dcgm[-1].path, dcgm[-1].text.encode()))
            covers.add("gpu.dcgm")
        except (ValueError, Exception) as e:  # noqa: BLE001 - a bad file is noted, not fatal
            ev.seen.append(Seen(dcgm[-1].path, None, f"not read: {e}"))
    nics = _nics(ev, items)
    if topo is not None and topo["nics"]:
        nics = _topo_nics(ev, nics or [], topo, doc["gpus"], topo_items[-1].path)
    if nics is not None:
        doc["nics"] = nics
        if any(n.get("rdma") for n in nics):
            if any(n.get("ethtool_stats") is not None for n in nics):
                covers |= set(ROCE_CHECKS)
            elif any(n.get("rdma") and n["rdma"].get("hw_counters") for n in nics):
                covers |= set(HW_COUNTER_CHECKS)  # the checks that read only the RDMA hw counters
            if any(n.get("qos") and n["qos"].get("tool") for n in nics):
                covers.add("roce.qos")
    kernel = [i for i in items if i.kind == "kernel log"]
    if kernel:
        ev.raw[sources.KERNEL_LOG] = (
            "\n".join(
                (journal_text(i.text) if i.text.lstrip().startswith("{") else i.text).rstrip("\n") for i in kernel
            )
            + "\n"
        )
        covers |= {"gpu.xid", "oom.cause"}
    for i in items:
        stem = re.sub(r"\.(log|txt|prom|out)$", "", i.path.rsplit("/", 1)[-1].split(" [")[0])
        if i.kind == "vllm log":
            ev.raw[f"{stem}.log"] = i.text
            covers |= {"serving.engine", "oom.cause"}
        elif i.kind == "vllm metrics":
            inst, _, n = stem.rpartition(".")
            inst, n = (inst, n) if n.isdigit() and inst else (stem, "1")
            ev.raw[f"{inst}.metrics" + ("" if n == "1" else f".{n}")] = i.text
            covers.add("serving.metrics")
    if not items:
        return
    doc["evidence"] = {"kinds": seen_kinds, "covers": sorted(covers), "files": [s.path for s in ev.seen if s.kind]}
    ev.facts = doc


def _topo_gpus(ev: HostEvidence, gpus: dict[str, Any], topo: dict[str, Any], path: str) -> None:
    """``nvidia-smi topo -m`` into the ``gpus`` section the probe fills from NVML: each GPU's NUMA
    node (``NUMA Affinity``) and ``topology`` (one entry per GPU pair, the NVML level of its
    PCIe path), each entry with ``nvlinks``: the bonded NVLinks between the two (0 for a PCIe path;
    an NVLink pair has no PCIe level in the matrix, so ``level`` None with the reason)."""
    by_index = {d.get("index"): d for d in gpus.get("devices") or []}
    for idx, g in topo["gpus"].items():
        d = by_index.get(idx)
        if d is not None and d.get("numa_node") is None and g["numa_node"] is not None:
            d["numa_node"] = g["numa_node"]
            (d.get("field_errors") or {}).pop("numa_node", None)
    gpus["topology"] = [
        {
            "gpus": p["gpus"],
            "level": p["level"],
            "reason": None if p["level"] else f"NVLink ({p['link']}): topo -m shows no PCIe level",
            "nvlinks": p["nvlinks"] or 0,
        }
        for p in topo["pairs"]
    ]
    missing = sorted(set(topo["gpus"]) - set(by_index))
    if missing:
        _note(ev, path, f"GPU(s) {', '.join(map(str, missing))} of the matrix not in the GPU listing")


def _topo_nics(
    ev: HostEvidence, nics: list[dict[str, Any]], topo: dict[str, Any], gpus: dict[str, Any], path: str
) -> list[dict[str, Any]]:
    """Each RDMA NIC of ``topo -m`` gets the NUMA node of the GPUs it reaches without crossing
    sockets (PIX, PXB, PHB, NODE: within one NUMA node; SYS crosses).  A NIC every GPU reaches
    only through SYS is on a node with no GPU: its node number is not in the matrix (left None).
    A NIC no other output names (no ``ibdev2netdev``) is an entry under its RDMA device name."""
    numa = {d.get("index"): d.get("numa_node") for d in gpus.get("devices") or []}
    by_dev = {(n.get("rdma") or {}).get("device"): n for n in nics if n.get("rdma")}
    notes = []
    for dev in topo["nics"].values():
        near = {numa.get(x["gpu"]) for x in topo["gpu_nic"] if x["nic"] == dev and x["level"] != "SYSTEM"}
        near.discard(None)
        nic = by_dev.get(dev)
        if nic is None:
            nic = _nic(ev, dev, [], {"device": dev, "port": 1, "netdev": dev, "state": None}, [], {}, {})
            nic["rdma"]["link_layer"] = None
            nics.append(nic)
            notes.append(dev)
        if nic.get("numa_node") is None and len(near) == 1:
            nic["numa_node"] = near.pop()
    if notes:
        _note(
            ev,
            path,
            f"RDMA device(s) {', '.join(notes)} with no netdev named (give ibdev2netdev): "
            "checked under the device name",
        )
    return nics


def _nics(ev: HostEvidence, items: list[_Item]) -> list[dict[str, Any]] | None:
    """NIC entries (docs/facts.md ``nics[]``) from the NIC tools' outputs; None without any."""
    kinds = (
        "ethtool -S",
        "ethtool -a",
        "mlnx_qos",
        "dcb pfc",
        "dcb app",
        "dcb apptrust",
        "dcb ets",
        "ecn sysfs",
        "traffic_class",
        "ibdev2netdev",
        "show_gids",
        "rdma statistic",
    )
    nic_items = [i for i in items if i.kind in kinds]
    if not nic_items:
        return None
    ports: dict[str, dict[str, Any]] = {}
    for i in (x for x in nic_items if x.kind == "ibdev2netdev"):
        for p in col.parse_ibdev2netdev(i.text):
            ports[p["netdev"]] = p
    gids: list[dict[str, Any]] = []
    for i in (x for x in nic_items if x.kind == "show_gids"):
        gids.extend(col.parse_show_gids(i.text))
    for g in gids:
        ports.setdefault(g["netdev"], {"device": g["device"], "port": g["port"], "netdev": g["netdev"], "state": None})
    hw, series = _rdma_statistic(ev, [x for x in nic_items if x.kind == "rdma statistic"])
    mapped = {(p.get("device"), int(p.get("port") or 1)) for p in ports.values()}
    for dev, port in sorted(k for k in hw if k not in mapped):
        # an RDMA port no ibdev2netdev/show_gids names a netdev for: a NIC entry under the RDMA name
        label = dev if port == 1 else f"{dev}/{port}"
        ports.setdefault(label, {"device": dev, "port": port, "netdev": label, "state": None})
    per: dict[str, list[_Item]] = {}
    unnamed: list[_Item] = []
    for i in nic_items:
        if i.kind in ("ibdev2netdev", "show_gids", "rdma statistic"):
            continue
        name = netdev_hint(i.argv, i.path)
        if name is None and i.kind == "ethtool -a":
            m = re.match(r"Pause parameters for (\S+?):", i.text.strip())
            name = m.group(1) if m else None
        (per.setdefault(name, []) if name else unnamed).append(i)
    if unnamed:
        if len(per) <= 1:
            name = next(iter(per), None) or (next(iter(ports)) if len(ports) == 1 else "nic0")
            per.setdefault(name, []).extend(unnamed)
            for i in unnamed:
                _note(ev, i.path, f"NIC name not given; taken as {name}")
        else:
            for i in unnamed:
                _note(
                    ev,
                    i.path,
                    "not used: which NIC it is about is not in its name or command "
                    f"(this host has {', '.join(sorted(per))})",
                )
    nics = []
    for name in sorted(set(per) | set(ports)):
        its = per.get(name, [])
        nics.append(_nic(ev, name, its, ports.get(name), gids, hw, series))
    return nics


def _rdma_statistic(
    ev: HostEvidence, items: list[_Item]
) -> tuple[dict[tuple[str, int], dict[str, int]], dict[tuple[str, int], list[tuple[float, dict[str, int]]]]]:
    """The ports' hw counters of the ``rdma statistic`` outputs (the last output wins) and, when
    there are two or more and each has a time, each port's timed samples (oldest first)."""
    hw: dict[tuple[str, int], dict[str, int]] = {}
    series: dict[tuple[str, int], list[tuple[float, dict[str, int]]]] = {}
    timed = [(_sample_time(i), i) for i in items]
    if len(items) >= 2 and all(t is not None for t, _ in timed):
        for t, i in sorted(timed, key=lambda x: float(x[0] or 0)):
            for key, counters in col.parse_rdma_statistic(_after_time(i.text)).items():
                series.setdefault(key, []).append((float(t or 0), counters))
                hw[key] = counters
        for _, i in timed:
            _note(ev, i.path, f"one of {len(items)} timed rdma statistic samples")
        return hw, {k: v for k, v in series.items() if len(v) >= 2}
    for i in items:
        hw.update(col.parse_rdma_statistic(_after_time(i.text)))
        if len(items) >= 2:
            _note(
                ev,
                i.path,
                f"{len(items)} rdma statistic outputs without a time each: no rates "
                "(give commands/index.json started_at, or a `date` line before each output)",
            )
    return hw, {}


def _after_time(text: str) -> str:
    """The output without a leading time line (``date`` before the command)."""
    first, sep, rest = text.lstrip().partition("\n")
    return rest if sep and parse_time(first.lstrip("#").strip()) is not None else text


def _note(ev: HostEvidence, path: str, note: str) -> None:
    for s in ev.seen:
        if s.path == path:
            s.note = "; ".join(x for x in (s.note, note) if x)


def _nic(
    ev: HostEvidence,
    name: str,
    its: list[_Item],
    port: dict[str, Any] | None,
    gids: list[dict[str, Any]],
    hw: dict[tuple[str, int], dict[str, int]],
    series: dict[tuple[str, int], list[tuple[float, dict[str, int]]]],
) -> dict[str, Any]:
    nic: dict[str, Any] = {k: None for k in col.read_nic_keys()}
    nic["netdev"] = name
    by = {k: [i for i in its if i.kind == k] for k in {i.kind for i in its}}
    stats = by.get("ethtool -S", [])
    samples = [(t, i) for i in stats if (t := _sample_time(i)) is not None]
    if len(stats) >= 2 and len(samples) == len(stats):
        samples.sort(key=lambda x: x[0])
        nic["samples"] = [
            {
                "t": t,
                "t_sysfs": t,
                "read_s": 0.0,
                "ethtool_stats": col.parse_ethtool_stats(i.text),
                "hw_counters": None,
                "counters": None,
                "reason": None,
            }
            for t, i in samples
        ]
        nic["ethtool_stats"] = nic["samples"][-1]["ethtool_stats"]
        for _, i in samples:
            _note(ev, i.path, f"one of {len(samples)} timed samples of {name}")
    elif stats:
        nic["ethtool_stats"] = col.parse_ethtool_stats(stats[-1].text)
        if len(stats) >= 2:
            for i in stats:
                _note(
                    ev,
                    i.path,
                    f"{len(stats)} ethtool -S outputs of {name} without a time each: no rates "
                    "(give commands/index.json started_at, or a `date` line before each output)",
                )
    else:
        nic["ethtool_stats_reason"] = "no ethtool -S output in the evidence"
    text = {k: (v[-1].text if v else None) for k, v in by.items()}
    rdma_hint = (
        port is not None
        or any(k in by for k in ("mlnx_qos", "dcb pfc", "dcb app", "ecn sysfs", "traffic_class"))
        or any(re.match(r"(rx|tx)_(prio\d_pause|vport_rdma)", k) for k in (nic["ethtool_stats"] or {}))
    )
    if rdma_hint:
        dev = port.get("device") if port else None
        p = int(port.get("port") or 1) if port else 1
        nic["rdma"] = {
            "device": dev,
            "port": p,
            "netdev": name,
            "state": ("ACTIVE" if str(port.get("state")).lower() == "up" else "DOWN")
            if port and port.get("state")
            else None,
            "phys_state": None,
            "link_layer": "Ethernet",
            "rate": None,
            "rate_gbps": None,
            "fw_ver": None,
            "counters": None,
            "hw_counters": hw.get((dev, p)) if dev else None,
            "gids": [
                {k: g[k] for k in ("index", "gid", "type", "netdev")}
                for g in gids
                if g["device"] == dev and g["port"] == p
            ],
        }
        timed = series.get((dev, p)) if dev else None
        if timed:
            nic["samples"] = _with_hw_samples(nic.get("samples"), timed)
        q = col.empty_qos()
        col.qos_from_outputs(
            q,
            mlnx_qos=text.get("mlnx_qos"),
            dcb_pfc=text.get("dcb pfc"),
            dcb_app=text.get("dcb app"),
            dcb_apptrust=text.get("dcb apptrust"),
            ethtool_a=text.get("ethtool -a"),
            dcb_ets=text.get("dcb ets"),
        )
        ecn = text.get("ecn sysfs")
        if ecn:
            q["ecn"] = col.parse_ecn_dump(ecn)
        if text.get("traffic_class") is not None:
            q["traffic_class"], q["traffic_class_reason"] = col.parse_traffic_class(text["traffic_class"])
        if q["tool"] is None:
            q["reasons"]["evidence"] = "no mlnx_qos or dcb output in the evidence"
        nic["qos"] = q
    return nic


def _with_hw_samples(eth: list[dict[str, Any]] | None, hw: list[tuple[float, dict[str, int]]]) -> list[dict[str, Any]]:
    """The NIC's samples with the timed ``rdma statistic`` counters as ``hw_counters`` (their time
    ``t_sysfs``, as the probe times its sysfs reads): paired one to one with the ``ethtool -S``
    samples when there are as many, else the first with the first and the last with the last."""

    def sample(e: dict[str, Any] | None, h: tuple[float, dict[str, int]]) -> dict[str, Any]:
        out: dict[str, Any] = (
            dict(e) if e else {"t": h[0], "read_s": 0.0, "ethtool_stats": None, "counters": None, "reason": None}
        )
        out["t_sysfs"], out["hw_counters"] = h[0], h[1]
        return out

    if eth and len(eth) == len(hw):
        return [sample(e, h) for e, h in zip(eth, hw)]
    if eth and len(eth) >= 2:
        return [sample(eth[0], hw[0]), sample(eth[-1], hw[-1])]
    return [sample(None, h) for h in hw]


# ------------------------------------------------------------- not checked


def is_partial(doc: FactsDoc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("evidence"), dict)


def not_checked(
    findings: list[Finding],
    facts: Mapping[str, FactsDoc],
    checks: Iterable[str],
    skip: Callable[[str], bool] = lambda c: False,
) -> list[Finding]:
    """``findings`` where, for each host built from raw outputs, every selected check its
    evidence does not cover says UNKNOWN (its OK rows, made on data it never saw, are dropped)."""
    partial = {h: d["evidence"] for h, d in facts.items() if is_partial(d)}
    if not partial:
        return findings
    checks = [c for c in checks if c != "host.reachable" and not skip(c)]
    out = [
        f
        for f in findings
        if not (
            f.host in partial
            and f.severity == Severity.OK
            and f.check not in (partial[f.host].get("covers") or [])
            and f.check != "host.reachable"
        )
    ]
    have = {(f.host, f.check) for f in out}
    for host, ev in partial.items():
        kinds = ", ".join(ev.get("kinds") or []) or "nothing recognised"
        for c in checks:
            if c not in (ev.get("covers") or []) and (host, c) not in have:
                out.append(
                    Finding(
                        c,
                        Severity.UNKNOWN,
                        host,
                        "host",
                        f"not checked: no input for this check among the raw outputs ({kinds})",
                        "add the output this check reads (docs/bundles.md lists them; "
                        "`doctor --explain-input` shows what was read), or narrow --checks",
                    )
                )
    return out
