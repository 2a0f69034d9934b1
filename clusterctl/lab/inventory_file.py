"""The inventory ``lab up`` writes (format: docs/inventory.md, schema 1).

Hosts ``lab[01-NN]`` on consecutive addresses, two hosts per fake rack, each
rack under its own leaf (top-of-rack) switch (``rack`` / ``leaf`` labels and a
``rackN`` group each; 4 hosts are 2 leaves of 2), strict host key
checking against the prefilled ``known_hosts``, and one host (the last)
reached as the non-root user ``ops`` with sudo (group ``nonroot``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from clusterctl.lab.config import HostSpec, LabConfig
from clusterctl.lab.template import OPS_USER
from clusterctl.lab import realvllm

#: Memory (GiB) of the GPU models the lab knows; others default to 80.
GPU_MEMORY_GIB = {
    "H100-SXM5-80GB": 80,
    "H200-SXM5-141GB": 141,
    "A100-SXM4-80GB": 80,
    "A100-SXM4-40GB": 40,
    "L40S-48GB": 48,
    "B200-SXM6-180GB": 180,
}
DEFAULT_GPU_MODEL = "H100-SXM5-80GB"
HOSTS_PER_RACK = 2


def fold(names: Sequence[str]) -> str:
    """``lab01..lab04`` → ``lab[01-04]`` (names share a prefix and are consecutive)."""
    if len(names) == 1:
        return names[0]
    prefix = names[0].rstrip("0123456789")
    first, last = names[0][len(prefix) :], names[-1][len(prefix) :]
    return f"{prefix}[{first}-{last}]"


def _address_range(hosts: Sequence[HostSpec]) -> str | None:
    """``10.77.0.[101-104]`` when the hosts' addresses differ only in the last octet."""
    heads = {h.address.rsplit(".", 1)[0] for h in hosts}
    if len(heads) != 1 or len(hosts) == 1:
        return None
    lasts = [int(h.address.rsplit(".", 1)[1]) for h in hosts]
    if lasts != list(range(lasts[0], lasts[0] + len(lasts))):
        return None
    width = len(str(lasts[0]))
    if any(len(str(x)) != width for x in lasts):
        return None
    return f"{heads.pop()}.[{lasts[0]}-{lasts[-1]}]"


MANAGEMENT_NIC = {"netdev": "eth0", "role": "management", "speed_gbps": 10}


def _gpus(desc: dict[str, Any]) -> dict[str, Any]:
    g = desc["gpus"]
    return {"count": g["count"], "model": g["model"], "memory_gib": g["memory_gib"], "interconnect": g["interconnect"]}


def _nics(desc: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        MANAGEMENT_NIC,
        *(
            {
                "netdev": n["netdev"],
                "role": "data",
                "rdma_device": n["rdma_device"],
                "port": n["port"],
                "speed_gbps": n["speed_gbps"],
            }
            for n in desc["nics"]
        ),
    ]


def build(
    cfg: LabConfig,
    hosts: Sequence[HostSpec],
    *,
    gpus: int,
    gpu_model: str,
    hardware: dict[str, dict[str, Any]] | None = None,
    inbox: Sequence[str] = (),
) -> dict[str, Any]:
    """The inventory as plain data (YAML-ready).

    ``hardware`` maps host names to the simulated hardware's description
    (``hardware.describe_host``): GPUs and data NICs come from it, the first
    host's as defaults and any host that differs with its own entry.
    Without it, GPUs come from ``gpus``/``gpu_model`` and only eth0 is listed.
    ``inbox`` names the hosts with the inbox NIC driver (group ``inbox``).
    """
    names = [h.name for h in hosts]
    if hardware:
        first = hardware[names[0]]
        dflt_gpus, dflt_nics = _gpus(first), _nics(first)
    else:
        dflt_gpus = {
            "count": gpus,
            "model": gpu_model,
            "memory_gib": GPU_MEMORY_GIB.get(gpu_model, 80),
            "interconnect": "nvlink" if "SXM" in gpu_model else "pcie",
        }
        dflt_nics = [MANAGEMENT_NIC]
    defaults: dict[str, Any] = {
        "ssh": {
            "user": "root",
            "port": 22,
            "identity_file": str(cfg.key_file),
            "known_hosts": str(cfg.known_hosts),
            "host_key_policy": "strict",
            "connect_timeout": 5,
        },
        "labels": {"site": "lab"},
        "gpus": dflt_gpus,
        "nics": dflt_nics,
        # Lab hosts are containers: /proc/sys is the machine's and read-only, so node setup cannot
        # set its default kernel parameters there (doctor's node.prereqs would flag them on every host).
        "vars": {
            "sysctl": {
                "kernel.numa_balancing": None,
                "net.ipv4.conf.all.arp_ignore": None,
                "net.ipv4.conf.all.arp_announce": None,
            }
        },
    }
    groups: dict[str, Any] = {}
    for r in range(0, len(hosts), HOSTS_PER_RACK):
        n = r // HOSTS_PER_RACK + 1
        groups[f"rack{n}"] = {
            "hosts": fold(names[r : r + HOSTS_PER_RACK]),
            "labels": {"rack": f"r{n}", "leaf": f"leaf{n}"},
        }
    groups["nonroot"] = {"hosts": names[-1], "ssh": {"user": OPS_USER, "become": True}}
    if inbox:
        groups["inbox"] = {"hosts": list(inbox), "labels": {"nic_driver": "inbox"}}
    own: dict[str, dict[str, Any]] = {}
    for name, desc in (hardware or {}).items():
        if _gpus(desc) != dflt_gpus:
            own.setdefault(name, {})["gpus"] = _gpus(desc)
        if _nics(desc) != dflt_nics:
            own.setdefault(name, {})["nics"] = _nics(desc)
    host_entries: dict[str, Any] = {}
    rng = _address_range(hosts)
    if rng is not None and not own:
        host_entries[fold(names)] = {"address": rng}
    else:  # a host may be defined once only: one entry each
        for h in hosts:
            host_entries[h.name] = {"address": h.address, **own.get(h.name, {})}
    return {
        "version": 1,
        "defaults": defaults,
        "fabric": {"kind": "roce", "trust": "dscp", "pfc_priority": 3, "roce_dscp": 26, "cnp_dscp": 48, "mtu": 4200},
        "groups": groups,
        "hosts": host_entries,
        # The vLLM simulator's launchers (clusterctl/lab/vllm_sim/install.py), and the real CPU
        # engine when scripts/install-real-vllm installed it (bound read-only into the hosts).
        "engines": {
            "vllm-0.11": {"path": "/opt/vllm-0.11/bin/vllm", "version": "0.11.0"},
            "vllm-0.33": {"path": "/opt/vllm-0.33/bin/vllm", "version": "0.33.0"},
            **_real_engine(),
        },
    }


def _real_engine() -> dict[str, Any]:
    eng = realvllm.installed()
    if eng is None:
        return {}
    return {realvllm.ENGINE: {"path": str(eng.vllm), "version": realvllm.VERSION, "device": "cpu"}}


def write(path: Path, data: dict[str, Any]) -> None:
    """Write the inventory atomically, with a header saying where it came from."""
    text = "# Written by `clusterctl lab up`; rewritten on every `lab up`.\n" + yaml.safe_dump(
        data, sort_keys=False, default_flow_style=None, width=100
    )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
