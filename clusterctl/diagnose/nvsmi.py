"""NVIDIA tool outputs read as the probe's ``gpus`` facts (docs/facts.md).

An operator has ``nvidia-smi -q`` text, a ``--query-gpu`` CSV or
``nvidia-smi nvlink -s``/``-e`` output, not NVML: these parsers turn each
into the same device entries the probe writes, so the same GPU checks run.
Fields are found by their labels, never by position, across driver
generations: R470 and older print ``Clocks Throttle Reasons`` and ECC as
``Single Bit``/``Double Bit`` sub-blocks; R535 and newer print ``Clocks
Event Reasons`` and ``SRAM``/``DRAM`` counters; Ampere and newer have
``Remapped Rows`` where older GPUs have ``Retired Pages``.  A value printed
as ``N/A`` is "not supported here" (``None`` with a ``field_errors`` entry),
never 0; a field the output does not hold at all is ``None`` and its check
is not covered (see :data:`DEVICE_CHECKS`).

``GPU Recovery Action`` / ``GPU Reset Status`` and the ``Fabric`` block become the probe's
``recovery_action`` and ``fabric`` (``gpu.recovery``, ``gpu.fabric``).  ``nvidia-smi topo -m``
(:func:`parse_topo_matrix`) gives each GPU's NUMA node and, per GPU pair, the NVML level of the
PCIe path and the bonded NVLinks (``gpus.topology`` entries with ``nvlinks``).

``dcgmi diag -j`` JSON becomes a ``dcgm_diag`` section (one entry per test
result), checked by ``gpu.dcgm``.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from clusterctl.node.collector import CLOCK_EVENT_REASONS, decode_clock_reasons, normalize_pci

NA = "N/A in the nvidia-smi output (not supported here)"
#: device key -> the check that needs it (a check is covered when one device has the key).
DEVICE_CHECKS = {
    "ecc": "gpu.ecc",
    "remapped_rows": "gpu.remap",
    "retired_pages": "gpu.retired",
    "clocks_event_reasons": "gpu.clocks",
    "pcie": "gpu.pcie",
    "nvlink": "gpu.nvlink",
    "temperature_c": "gpu.thermal",
    "power_w": "gpu.thermal",
    "persistence_mode": "gpu.persistence",
    "processes": "gpu.foreign",
    "recovery_action": "gpu.recovery",
    "fabric": "gpu.fabric",
}
#: Checks any readable device covers.
ALWAYS = ("gpu.nvml", "gpu.inventory", "gpu.lost", "tp.group", "oom.fit")
_REASON_LABELS = {
    "idle": "gpu_idle",
    "gpu idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "display clock setting": "display_clock_setting",
}
_BITS = {name: bit for bit, name in CLOCK_EVENT_REASONS}
#: ``GPU Recovery Action`` values (nvidia-smi prints NVML's nvmlDeviceGpuRecoveryAction_t in words:
#: ``None``, ``Reset``, ``Reboot``, ``Drain P2P``, ``Drain and Reset``) -> the probe's names
#: (collector.RECOVERY_ACTIONS); spaces, case and ``GPU_``/``NODE_`` prefixes do not matter.
_RECOVERY = {
    "none": "none",
    "reset": "reset",
    "gpu_reset": "reset",
    "reboot": "reboot",
    "node_reboot": "reboot",
    "drain_p2p": "drain_p2p",
    "drain_and_reset": "drain_and_reset",
    "drain_p2p_and_reset": "drain_and_reset",
}
#: ``Fabric`` ``State`` in words (nvmlGpuFabricState_t) -> the probe's names (collector.FABRIC_STATES).
_FABRIC_STATES = {
    "not supported": "not_supported",
    "not started": "not_started",
    "in progress": "in_progress",
    "completed": "completed",
}
_LOST = re.compile(
    r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
    r"(?:\.[0-9A-Fa-f])?)\s*:\s*(.+)"
)
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")


def _tree(lines: list[str]) -> dict[str, Any]:
    """An indented ``Key : Value`` block as nested dicts (a heading without a value holds its children)."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for line in lines:
        if not line.strip() or line.strip().startswith("["):
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        key = key.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else root
        value = value.strip()
        if sep and value:
            parent.setdefault(key, value)
        else:
            node: dict[str, Any] = {}
            if isinstance(parent.get(key), dict):
                node = parent[key]
            else:
                parent[key] = node
            stack.append((indent, node))
    return root


def _get(d: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(d, dict):
            return None
        d = next((v for kk, v in d.items() if kk.lower() == k.lower()), None)
    return d


def _num(v: Any) -> float | None:
    m = re.match(r"\s*(-?[0-9]+(?:\.[0-9]+)?)", v) if isinstance(v, str) else None
    return float(m.group(1)) if m else None


def _int(v: Any) -> int | None:
    x = _num(v)
    return int(x) if x is not None else None


def _yes(v: Any) -> bool | None:
    if not isinstance(v, str):
        return None
    low = v.strip().lower()
    return (
        True
        if low in ("yes", "enabled", "active", "on")
        else False
        if low in ("no", "disabled", "not active", "off")
        else None
    )


def _na(v: Any) -> bool:
    return isinstance(v, str) and v.strip().upper() in ("N/A", "[N/A]", "[NOT SUPPORTED]", "NOT SUPPORTED")


def _mib(v: Any) -> int | None:
    x = _num(v)
    return int(x * 2**20) if x is not None else None


def _ecc_counts(block: Any) -> dict[str, int | None] | None:
    """``{corrected, uncorrected}`` of a ``Volatile``/``Aggregate`` block, old or new layout."""
    if not isinstance(block, dict):
        return None
    sb, db = _get(block, "Single Bit"), _get(block, "Double Bit")
    if isinstance(sb, dict) or isinstance(db, dict):
        return {"corrected": _int(_get(sb, "Total")), "uncorrected": _int(_get(db, "Total"))}
    corr = [
        _int(v)
        for k, v in block.items()
        if isinstance(v, str) and "uncorrectable" not in k.lower() and "correctable" in k.lower()
    ]
    unc = [_int(v) for k, v in block.items() if isinstance(v, str) and "uncorrectable" in k.lower()]
    known_c, known_u = [x for x in corr if x is not None], [x for x in unc if x is not None]
    return {"corrected": sum(known_c) if known_c else None, "uncorrected": sum(known_u) if known_u else None}


def _device(index: int, bus_id: str, g: dict[str, Any]) -> dict[str, Any]:
    errors: dict[str, str] = {}
    d: dict[str, Any] = {
        "index": index,
        "name": _get(g, "Product Name"),
        "uuid": _get(g, "GPU UUID"),
        "pci_bus_id": bus_id,
        "pci_address": normalize_pci(bus_id),
        "memory_total": None,
        "memory_used": None,
        "memory_free": None,
        "processes": None,
        "ecc": None,
        "remapped_rows": None,
        "retired_pages": None,
        "recovery_action": None,
        "fabric": None,
        "clocks_event_reasons": None,
        "pcie": None,
        "nvlink": None,
        "temperature_c": None,
        "power_w": None,
        "power_limit_w": None,
        "utilization": None,
        "persistence_mode": None,
        "vbios_version": _get(g, "VBIOS Version"),
        "numa_node": None,
        "nearest_nics": None,
        "lost": False,
        "hung": False,
        "field_errors": errors,
    }
    fb = _get(g, "FB Memory Usage")
    if isinstance(fb, dict):
        d["memory_total"], d["memory_used"], d["memory_free"] = (_mib(_get(fb, k)) for k in ("Total", "Used", "Free"))
    mode, errs = _get(g, "ECC Mode"), _get(g, "ECC Errors")
    if isinstance(errs, dict):
        d["ecc"] = {
            "volatile": _ecc_counts(_get(errs, "Volatile")),
            "aggregate": _ecc_counts(_get(errs, "Aggregate")),
            "enabled": _yes(_get(mode, "Current")),
            "pending_enabled": _yes(_get(mode, "Pending")),
        }
    elif _na(errs):
        d["ecc"] = {
            "volatile": None,
            "aggregate": None,
            "enabled": _yes(_get(mode, "Current")),
            "pending_enabled": _yes(_get(mode, "Pending")),
        }
        errors["ecc"] = NA
    rr = _get(g, "Remapped Rows")
    if isinstance(rr, dict):
        d["remapped_rows"] = {
            "correctable": _int(_get(rr, "Correctable Error")),
            "uncorrectable": _int(_get(rr, "Uncorrectable Error")),
            "pending": _yes(_get(rr, "Pending")),
            "failure": _yes(_get(rr, "Remapping Failure Occurred")),
        }
    elif rr is not None:
        errors["remapped_rows"] = NA
    rp = _get(g, "Retired Pages")
    if isinstance(rp, dict) and not all(_na(v) for v in rp.values() if isinstance(v, str)):
        pending = _get(rp, "Pending Page Blacklist")
        if pending is None:
            pending = _get(rp, "Pending Page Retirement") or _get(rp, "Pending")
        d["retired_pages"] = {
            "single_bit_ecc": _int(_get(rp, "Single Bit ECC")),
            "double_bit_ecc": _int(_get(rp, "Double Bit ECC")),
            "pending": _yes(pending),
        }
    elif rp is not None:
        errors["retired_pages"] = NA
    _recovery_and_fabric(g, d, errors)
    reasons = _get(g, "Clocks Event Reasons")
    if reasons is None:
        reasons = _get(g, "Clocks Throttle Reasons")
    if isinstance(reasons, dict):
        mask = 0
        for label, value in _flat(reasons):
            name = _REASON_LABELS.get(label.lower())
            if name and _yes(value):
                mask |= _BITS[name]
        d["clocks_event_reasons"] = {"mask": "0x%x" % mask, "active": decode_clock_reasons(mask)}
    elif reasons is not None:
        errors["clocks_event_reasons"] = NA
    pci = _get(g, "PCI")
    if isinstance(pci, dict):
        link = _get(pci, "GPU Link Info") or {}
        d["pcie"] = {
            "width": _int(_get(link, "Link Width", "Current")),
            "max_width": _int(_get(link, "Link Width", "Max")),
            "gen": _int(_get(link, "PCIe Generation", "Current")),
            "max_gen": _int(_get(link, "PCIe Generation", "Device Max")) or _int(_get(link, "PCIe Generation", "Max")),
            "replay_counter": _int(_get(pci, "Replays Since Reset")),
        }
    temp = _get(g, "Temperature", "GPU Current Temp")
    d["temperature_c"] = _num(temp)
    power = _get(g, "GPU Power Readings") or _get(g, "Power Readings")
    if isinstance(power, dict):
        d["power_w"] = _num(_get(power, "Power Draw")) or _num(_get(power, "Average Power Draw"))
        d["power_limit_w"] = _num(_get(power, "Enforced Power Limit")) or _num(_get(power, "Current Power Limit"))
    util = _get(g, "Utilization")
    if isinstance(util, dict):
        d["utilization"] = {"gpu": _int(_get(util, "Gpu")), "memory": _int(_get(util, "Memory"))}
    d["persistence_mode"] = _yes(_get(g, "Persistence Mode"))
    procs = _get(g, "Processes")
    if isinstance(procs, str) and procs.strip().lower() == "none":
        d["processes"] = []
    for key in ("temperature_c", "power_w", "persistence_mode"):
        if d[key] is None and key not in errors:
            errors[key] = "not in this nvidia-smi output"
    return d


def _recovery_and_fabric(g: dict[str, Any], d: dict[str, Any], errors: dict[str, str]) -> None:
    """``GPU Recovery Action`` (R550+; before it ``GPU Reset Status``) and the ``Fabric`` block
    (R530+) as the probe's ``recovery_action`` and ``fabric`` (NVML's fields of the same meaning).

    ``GPU Reset Status`` (``Reset Required``, ``Drain and Reset Recommended``: Yes/No) is read
    only where there is no ``GPU Recovery Action`` line; drivers that have both print the old one
    as "Requested functionality has been deprecated".  A ``Fabric`` whose State is ``N/A`` or
    ``Not Supported`` is a GPU without an NVLink fabric: ``fabric`` None, as the probe leaves it."""
    action = _get(g, "GPU Recovery Action")
    status = _get(g, "GPU Reset Status")
    if isinstance(action, str) and not _na(action):
        key = re.sub(r"[^a-z0-9]+", "_", action.strip().lower()).strip("_")
        d["recovery_action"] = _RECOVERY.get(key, key)
    elif isinstance(status, dict) and _yes(_get(status, "Reset Required")) is not None:
        required, drain = _yes(_get(status, "Reset Required")), _yes(_get(status, "Drain and Reset Recommended"))
        d["recovery_action"] = "drain_and_reset" if required and drain else "reset" if required else "none"
    elif _na(action) or (isinstance(status, dict) and all(_na(v) for v in status.values())):
        errors["recovery_action"] = NA
    elif status is not None:
        errors["recovery_action"] = f"GPU Reset Status unreadable ({_get(status, 'Reset Required')})"
    fab = _get(g, "Fabric")
    if isinstance(fab, dict):
        state = str(_get(fab, "State") or "").strip()
        if not state or _na(state) or state.lower() == "not supported":
            errors["fabric"] = NA
        else:
            st = str(_get(fab, "Status") or "").strip()
            d["fabric"] = {
                "state": _FABRIC_STATES.get(state.lower(), state.lower().replace(" ", "_")),
                # NVML's status is an nvmlReturn_t: "Success" is 0, anything else the words
                "status": 0 if st.lower() == "success" else None if not st or _na(st) else st,
                "clique_id": _int(_get(fab, "CliqueId")),
                "cluster_uuid": _get(fab, "ClusterUUID"),
            }
    elif fab is not None:
        errors["fabric"] = NA


def _flat(d: dict[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        out += _flat(v) if isinstance(v, dict) else [(k, v)]
    return out


def parse_nvidia_smi_q(text: str) -> dict[str, Any]:
    """``nvidia-smi -q`` (any ``-d`` subset, any driver generation) as a ``gpus`` facts section.

    GPUs nvidia-smi could not open (``Unable to determine the device handle
    for GPU ...: GPU is lost``) are devices with ``lost: true``."""
    lines = text.splitlines()
    header: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    lost: list[tuple[str, str]] = []
    for line in lines:
        m = _GPU_HEADER.match(line.rstrip())
        if m:
            blocks.append((m.group(1), []))
            continue
        lm = _LOST.search(line)
        if lm:
            lost.append((lm.group(1), lm.group(2).strip()))
            continue
        (blocks[-1][1] if blocks else header).append(line)
    top = _tree(header)
    devices = [_device(i, bus, _tree(body)) for i, (bus, body) in enumerate(blocks)]
    for bus, why in lost:
        addr = normalize_pci(
            bus
            if bus.count(":") == 2 and len(bus.split(":")[0]) > 4
            else "0000" + bus[-10:]
            if bus.count(":") == 1
            else bus
        )
        d: dict[str, Any] = {k: None for k in devices[0]} if devices else {}
        d.update(
            {
                "index": len(devices),
                "pci_bus_id": bus,
                "pci_address": addr,
                "lost": True,
                "hung": False,
                "field_errors": {"device": why},
            }
        )
        devices.append(d)
    cuda = _get(top, "CUDA Version")
    cv = _num(cuda)
    attached = _int(_get(top, "Attached GPUs"))
    return {
        "available": bool(devices) or attached is not None,
        "reason": None if devices else "no GPU in the nvidia-smi output",
        "driver_version": _get(top, "Driver Version"),
        "nvml_version": None,
        "cuda_driver_version": int(round(cv * 1000)) if cv is not None and cv < 100 else None,
        "count": attached if attached is not None else len(devices),
        "devices": devices,
        "topology": [],
        "timed_out_calls": [],
        "source": "nvidia-smi -q",
    }


# ------------------------------------------------------------------ CSV

_CSV_FIELDS: dict[str, tuple[str, ...]] = {
    "index": ("index",),
    "name": ("name",),
    "uuid": ("uuid",),
    "pci.bus_id": ("pci_bus_id",),
    "memory.total": ("memory_total",),
    "memory.used": ("memory_used",),
    "memory.free": ("memory_free",),
    "temperature.gpu": ("temperature_c",),
    "power.draw": ("power_w",),
    "enforced.power.limit": ("power_limit_w",),
    "power.limit": ("power_limit_w",),
    "persistence_mode": ("persistence_mode",),
    "vbios_version": ("vbios_version",),
}


def parse_query_gpu_csv(text: str) -> dict[str, Any]:
    """``nvidia-smi --query-gpu=... --format=csv`` (with its header line) as a ``gpus`` section.

    Columns are matched by name (units in brackets ignored); the fields the
    query did not ask for stay ``None`` and their checks are not covered."""
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    if not rows:
        return {"available": False, "reason": "empty CSV", "devices": []}
    names = [re.sub(r"\s*\[.*\]\s*$", "", h.strip()).lower() for h in rows[0]]
    devices: list[dict[str, Any]] = []
    driver = None
    for n, row in enumerate(r for r in rows[1:] if r and any(c.strip() for c in r)):
        col = {k: v.strip() for k, v in zip(names, row)}
        d: dict[str, Any] = {"index": n, "lost": False, "hung": False, "field_errors": {}}
        for k, v in col.items():
            if _na(v):
                d["field_errors"][k] = NA
                continue
            if k == "index":
                d["index"] = _int(v)
            elif k in ("name", "uuid", "vbios_version"):
                d[k] = v
            elif k == "pci.bus_id":
                d["pci_bus_id"], d["pci_address"] = v, normalize_pci(v)
            elif k.startswith("memory.") and k in _CSV_FIELDS:
                d[_CSV_FIELDS[k][0]] = _mib(v)
            elif k in ("temperature.gpu", "power.draw", "enforced.power.limit", "power.limit"):
                d.setdefault(_CSV_FIELDS[k][0], _num(v))
            elif k == "persistence_mode":
                d["persistence_mode"] = _yes(v)
            elif k == "driver_version":
                driver = v
            elif k.startswith("ecc.errors.") and k.endswith(".volatile.total"):
                vol = d.setdefault(
                    "ecc", {"volatile": {}, "aggregate": None, "enabled": None, "pending_enabled": None}
                )["volatile"]
                vol["corrected" if ".corrected." in k else "uncorrected"] = _int(v)
            elif k == "ecc.mode.current":
                d.setdefault("ecc", {"volatile": None, "aggregate": None, "enabled": None, "pending_enabled": None})
                d["ecc"]["enabled"] = _yes(v)
            elif k.startswith("retired_pages."):
                rp = d.setdefault("retired_pages", {"single_bit_ecc": None, "double_bit_ecc": None, "pending": None})
                key = {
                    "retired_pages.sbe": "single_bit_ecc",
                    "retired_pages.single_bit_ecc.count": "single_bit_ecc",
                    "retired_pages.dbe": "double_bit_ecc",
                    "retired_pages.double_bit.count": "double_bit_ecc",
                    "retired_pages.pending": "pending",
                }.get(k)
                if key:
                    rp[key] = _yes(v) if key == "pending" else _int(v)
            elif k.startswith("pcie.link."):
                p = d.setdefault(
                    "pcie", {"width": None, "max_width": None, "gen": None, "max_gen": None, "replay_counter": None}
                )
                key = {
                    "pcie.link.gen.current": "gen",
                    "pcie.link.gen.gpucurrent": "gen",
                    "pcie.link.gen.max": "max_gen",
                    "pcie.link.gen.gpumax": "max_gen",
                    "pcie.link.width.current": "width",
                    "pcie.link.width.max": "max_width",
                }.get(k)
                if key:
                    p[key] = _int(v)
            elif k in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
                try:
                    mask = int(v, 16)
                except ValueError:
                    continue
                d["clocks_event_reasons"] = {"mask": "0x%x" % mask, "active": decode_clock_reasons(mask)}
            elif k in ("utilization.gpu", "utilization.memory"):
                d.setdefault("utilization", {})[k.split(".")[1]] = _int(v)
        devices.append(d)
    return {
        "available": bool(devices),
        "reason": None if devices else "no GPU rows in the CSV",
        "driver_version": driver,
        "count": len(devices),
        "devices": devices,
        "topology": [],
        "timed_out_calls": [],
        "source": "nvidia-smi --query-gpu",
    }


# ----------------------------------------------------------------- NVLink

_NVL_GPU = re.compile(r"^GPU (\d+):")
_NVL_LINK = re.compile(r"^\s*Link (\d+):\s*(.*)$")


def parse_nvlink(text: str) -> dict[int, list[dict[str, Any]]]:
    """``nvidia-smi nvlink -s`` and/or ``-e`` output: GPU index -> its links.

    ``-s`` gives each link's state (``<inactive>`` is down, a speed is
    active); ``-e`` its error counters (``Replay Errors``, ``Recovery
    Errors``, ``CRC Errors`` / ``Data CRC Errors`` / ``Flit CRC Errors``).
    A link whose state was not printed has ``state: None``."""
    out: dict[int, dict[int, dict[str, Any]]] = {}
    gpu = None
    for line in text.splitlines():
        m = _NVL_GPU.match(line.strip())
        if m:
            gpu = int(m.group(1))
            out.setdefault(gpu, {})
            continue
        lm = _NVL_LINK.match(line)
        if gpu is None or not lm:
            continue
        link = out[gpu].setdefault(
            int(lm.group(1)),
            {
                "link": int(lm.group(1)),
                "state": None,
                "errors": {"replay": None, "recovery": None, "crc_flit": None, "crc_data": None},
            },
        )
        rest = lm.group(2).strip()
        low = rest.lower()
        if "inactive" in low or "disabled" in low:
            link["state"] = "inactive"
        elif re.match(r"^[0-9.]+\s*[gm]b/s", low):
            link["state"] = "active"
        else:
            name, _, value = rest.rpartition(":")
            key = {
                "replay errors": "replay",
                "recovery errors": "recovery",
                "crc errors": "crc_flit",
                "flit crc errors": "crc_flit",
                "data crc errors": "crc_data",
            }.get(name.strip().lower())
            if key and _int(value) is not None:
                link["errors"][key] = _int(value)
    return {g: [links[k] for k in sorted(links)] for g, links in out.items()}


# ------------------------------------------------------------------- DCGM


def parse_dcgmi_diag(doc: Any) -> dict[str, Any]:
    """``dcgmi diag -r N -j`` JSON as ``{version, results: [{category, test, gpu, status, messages}]}``.

    DCGM 3 names the top object ``DCGM GPU Diagnostic`` and a result's GPU
    ``gpu_id``/``gpu_ids``; DCGM 4 says ``DCGM Diagnostic`` and ``entity_id``
    (with ``entity_group`` GPU); both nest ``test_categories`` -> ``tests`` ->
    ``results`` with ``status`` (Pass, Fail, Warn, Skip) and ``warnings``."""
    body = None
    if isinstance(doc, dict):
        body = next((v for k, v in doc.items() if isinstance(v, dict) and "test_categories" in v), None)
    if body is None:
        raise ValueError("no \"test_categories\" in this JSON (not dcgmi diag -j output)")
    results: list[dict[str, Any]] = []
    for cat in body.get("test_categories") or []:
        if not isinstance(cat, dict):
            continue
        for test in cat.get("tests") or []:
            if not isinstance(test, dict):
                continue
            for r in test.get("results") or []:
                if not isinstance(r, dict):
                    continue
                msgs = []
                for key in ("warnings", "errors", "info"):
                    items = r.get(key)
                    items = items if isinstance(items, list) else [items] if items else []
                    for w in items:
                        msgs.append(
                            str(w.get("warning") or w.get("error") or w.get("message") or w)
                            if isinstance(w, dict)
                            else str(w)
                        )
                results.append(
                    {
                        "category": str(cat.get("category") or ""),
                        "test": str(test.get("name") or ""),
                        "gpu": str(next((r[k] for k in ("gpu_id", "gpu_ids", "entity_id") if k in r), "")),
                        "status": str(r.get("status") or ""),
                        "messages": msgs[:5],
                    }
                )
    return {
        "version": body.get("version") or (doc.get("version") if isinstance(doc, dict) else None),
        "results": results,
    }


def covered_checks(gpus: dict[str, Any]) -> set[str]:
    """The GPU checks a ``gpus`` section built here can answer."""
    devices = [d for d in gpus.get("devices") or [] if isinstance(d, dict)]
    if not devices:
        return set()
    out = set(ALWAYS)
    for key, check in DEVICE_CHECKS.items():
        if any(d.get(key) is not None or (d.get("field_errors") or {}).get(key) == NA for d in devices):
            out.add(check)
    return out


# --------------------------------------------------------------- topo -m

#: ``nvidia-smi topo -m`` PCIe link codes -> NVML's common-ancestor level names (the probe's
#: ``gpus.topology`` levels; nvidia-smi prints the level NVML reports).  ``SOC`` is the name
#: older drivers printed for ``SYS``.
TOPO_LEVELS = {
    "PIX": "SINGLE",
    "PXB": "MULTIPLE",
    "PHB": "HOSTBRIDGE",
    "NODE": "NODE",
    "SYS": "SYSTEM",
    "SOC": "SYSTEM",
}
_TOPO_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_TOPO_AFFINITY = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def parse_topo_matrix(text: str) -> dict[str, Any]:
    """``nvidia-smi topo -m`` as ``{gpus, nics, pairs, gpu_nic}``.

    ``gpus``: GPU index -> ``{cpu_affinity, numa_node}`` (``NUMA Affinity``; ``N/A`` is None);
    ``nics``: column name -> device (``NIC0`` -> ``mlx5_0`` from the ``NIC Legend``; older drivers
    name the column ``mlx5_0`` itself); ``pairs``: one per GPU pair ``{gpus: [a, b], link, level,
    nvlinks}`` (``NV18`` is 18 bonded NVLinks, its PCIe level not shown); ``gpu_nic``:
    ``{gpu, nic, link, level}`` per GPU and NIC.  Columns are found by the header's names, so a
    matrix with or without NICs, ``NUMA Affinity`` or ``GPU NUMA ID`` reads the same."""
    lines = [x.rstrip() for x in text.splitlines()]
    head_at = next((n for n, x in enumerate(lines) if re.match(r"^\s*GPU0(\s|$)", x) and "GPU0" in x.split()[:1]), None)
    out: dict[str, Any] = {"gpus": {}, "nics": {}, "pairs": [], "gpu_nic": []}
    if head_at is None:
        return out
    header = lines[head_at]
    cols: list[str] = []
    for tok in header.split():
        if tok in ("CPU", "NUMA", "GPU") and cols and not re.match(r"^GPU\d+$", tok):
            break
        cols.append(tok)
    extra = [name for name in _TOPO_AFFINITY if name in header]
    cells: dict[str, dict[str, str]] = {}
    for line in lines[head_at + 1 :]:
        words = line.split()
        if not words or words[0].rstrip(":") == "Legend" or words[0] in ("NIC", "Legend:"):
            break
        row, vals = words[0], words[1:]
        if row not in cols or len(vals) < len(cols) or not all(_TOPO_CELL.match(v) for v in vals[: len(cols)]):
            continue
        cells[row] = dict(zip(cols, vals[: len(cols)]))
        m = re.match(r"^GPU(\d+)$", row)
        if m:
            aff = dict(zip(extra, vals[len(cols) :]))
            numa = aff.get("NUMA Affinity")
            out["gpus"][int(m.group(1))] = {
                "cpu_affinity": None if _na(aff.get("CPU Affinity")) else aff.get("CPU Affinity"),
                "numa_node": int(numa) if numa and numa.isdigit() else None,
            }
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", text, re.M))
    nic_cols = [c for c in cols if not re.match(r"^GPU\d+$", c)]
    out["nics"] = {c: legend.get(c, c) for c in nic_cols}

    def link(code: str) -> dict[str, Any]:
        nv = re.match(r"^NV(\d+)$", code)
        return {"link": code, "level": TOPO_LEVELS.get(code), "nvlinks": int(nv.group(1)) if nv else None}

    gpus = sorted(int(c[3:]) for c in cols if re.match(r"^GPU\d+$", c))
    for n, a in enumerate(gpus):
        for b in gpus[n + 1 :]:
            code = cells.get(f"GPU{a}", {}).get(f"GPU{b}") or cells.get(f"GPU{b}", {}).get(f"GPU{a}")
            if code:
                out["pairs"].append({"gpus": [a, b], **link(code)})
        for c in nic_cols:
            code = cells.get(f"GPU{a}", {}).get(c)
            if code:
                out["gpu_nic"].append({"gpu": a, "nic": out["nics"][c], **link(code)})
    return out
