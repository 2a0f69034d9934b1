"""Check ``gpu.baseline``: compare hosts with a learned known-good configuration.

``clusterctl doctor HOSTS --learn FILE`` records, per host, what a healthy node
looks like (GPU count, models, UUIDs and PCI addresses, PCIe widths, active
NVLink links, driver, VBIOS, persistence mode), as nhc-genconf and gcm's
manifests do; ``doctor --baseline FILE`` then reports what changed: fewer GPUs
or NVLink links (CRIT), a GPU whose UUID changed at an index, another driver
or VBIOS, a narrower PCIe link, persistence turned off (WARN).  Without
``--baseline`` the check reports nothing.  The file is YAML (``format: 1``).
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import yaml

from clusterctl.diagnose import fabric
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.errors import ConfigError, Problem
from clusterctl.probe.factgroups import FactsDoc, GpuDevice, GpuSection, GpusFact

FORMAT = 1
CHECK = "gpu.baseline"


def learn(facts: Mapping[str, FactsDoc]) -> dict[str, Any]:
    """The baseline document of every host with readable GPUs."""
    hosts: dict[str, Any] = {}
    for host, doc in facts.items():
        g = GpusFact.parse(doc)
        if not g.available:
            continue
        devices = [d for d in g.devices if not d.lost and not d.hung and d.index is not None]
        hosts[host] = {
            "gpu_count": len(g.devices),
            "driver_version": g.driver_version,
            "vbios_versions": sorted({d.vbios_version for d in devices if d.vbios_version}),
            "gpus": {
                d.index: {
                    "name": d.name,
                    "uuid": d.uuid,
                    "pci_address": d.pci_address,
                    "pcie_width": d.pcie.width,
                    "nvlink_active": _active_links(d),
                    "persistence_mode": d.persistence_mode,
                }
                for d in devices
            },
        }
    return {"format": FORMAT, "learned_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "hosts": hosts}


def write_baseline(path: str | Path, data: dict[str, Any]) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file, then rename)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(
        "# clusterctl doctor --learn: the known-good configuration; edit with care\n"
        + yaml.safe_dump(data, sort_keys=False)
    )
    os.replace(tmp, p)
    return p


def load_baseline(path: str | Path) -> dict[str, Any]:
    """Read a baseline file; ``ConfigError`` with ``file:line`` when it is not one."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError([Problem(str(p), 0, f"cannot read: {e.strerror}")]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError([Problem(str(p), mark.line + 1 if mark else 0, "not valid YAML")]) from None
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict):
        raise ConfigError([Problem(str(p), 1, "not a doctor baseline (no hosts: mapping); make one with --learn")])
    if int(data.get("format", FORMAT)) > FORMAT:
        raise ConfigError([Problem(str(p), 1, f"baseline format {data['format']} is newer than this clusterctl")])
    return data


@analyzer(CHECK)
def check_baseline(ctx: AnalysisContext) -> list[Finding]:
    base = (ctx.thresholds or {}).get("baseline")
    if not base:
        return []
    out: list[Finding] = []
    for host in ctx.facts:
        want = (base.get("hosts") or {}).get(host)
        if want is None:
            out.append(Finding(CHECK, Severity.OK, host, "host", "not in the baseline (nothing to compare)"))
            continue
        g = ctx.fact(host, GpusFact)
        if g is not None and g.unreadable:
            out.append(Finding(CHECK, Severity.UNKNOWN, host, "host", f"GPU facts not read: {g.unreadable}"))
            continue
        found = _compare(host, want, g) if g is not None else []
        out.extend(found or [Finding(CHECK, Severity.OK, host, "host", "as in the baseline")])
    return out


def _active_links(d: GpuDevice) -> int:
    return sum(1 for lk in d.nvlink if lk.state == "active")


def _compare(host: str, want: dict[str, Any], g: GpuSection) -> list[Finding]:
    """The host's GPUs (typed) against its entry of the baseline document (``want``, JSON)."""
    out: list[Finding] = []
    if not g.available:
        return out  # gpu.nvml says why
    devices = {d.index: d for d in g.devices if d.index is not None}
    if len(devices) < int(want.get("gpu_count") or 0):
        out.append(
            Finding(
                CHECK,
                Severity.CRIT,
                host,
                "host",
                f"{len(devices)} GPUs, the baseline has {want['gpu_count']}",
                "drain the node; find the missing GPU (kernel log, reseat, replace)",
            )
        )
    if want.get("driver_version") and g.driver_version != want["driver_version"]:
        out.append(
            Finding(
                CHECK,
                Severity.WARN,
                host,
                "host",
                f"driver {g.driver_version}, the baseline has {want['driver_version']}",
                "install the baseline's driver, or --learn again if the change is intended",
            )
        )
    vbios = sorted({d.vbios_version for d in devices.values() if d.vbios_version})
    if want.get("vbios_versions") and vbios and vbios != want["vbios_versions"]:
        out.append(
            Finding(
                CHECK,
                Severity.WARN,
                host,
                "host",
                f"VBIOS {', '.join(vbios)}, the baseline has {', '.join(want['vbios_versions'])}",
                "flash the baseline's VBIOS, or --learn again if the change is intended",
            )
        )
    for index, w in sorted((want.get("gpus") or {}).items()):
        d = devices.get(int(index))
        if d is None or d.lost or d.hung:
            continue  # counted above / gpu.lost
        subj = f"gpu:{index}"
        if w.get("uuid") and d.uuid and d.uuid != w["uuid"]:
            out.append(
                Finding(
                    CHECK,
                    Severity.WARN,
                    host,
                    subj,
                    f"another GPU at this index: {d.uuid} (baseline {w['uuid']})",
                    "a replaced or reordered GPU: check the placement and --learn again",
                    (f"pci {w.get('pci_address')} -> {d.pci_address}",),
                )
            )
        width = d.pcie.width
        if w.get("pcie_width") and width and width < w["pcie_width"]:
            out.append(
                Finding(
                    CHECK,
                    Severity.WARN,
                    host,
                    subj,
                    f"PCIe x{width}, the baseline has x{w['pcie_width']}",
                    "reseat the GPU or riser at the next window",
                )
            )
        active = _active_links(d)
        if w.get("nvlink_active") and active < w["nvlink_active"]:
            out.append(
                Finding(
                    CHECK,
                    Severity.CRIT,
                    host,
                    subj,
                    f"{active} NVLink links active, the baseline has {w['nvlink_active']}",
                    "drain the GPU's instances; check `nvidia-smi nvlink -s`, reset, replace",
                )
            )
        if w.get("persistence_mode") and d.persistence_mode is False:
            out.append(
                Finding(
                    CHECK,
                    Severity.WARN,
                    host,
                    subj,
                    "persistence mode off, on in the baseline",
                    "enable nvidia-persistenced" + fabric.node_setup_command([host]),
                )
            )
    return out
