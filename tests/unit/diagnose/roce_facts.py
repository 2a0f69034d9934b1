"""Facts documents for the RoCE/QoS/data-network analyzer tests, built from
the shared samples in tests/fixtures/diagnose/roce (ConnectX-7 ``ethtool -S``,
hw_counters, IB counters, ``mlnx_qos``, ``dcb``, ``ethtool -a``).

:func:`nic` makes one RoCE NIC entry with two counter samples ``dt`` seconds
apart: the second is the first advanced by ``rates`` (name -> per second,
looked up in ethtool, hw_counters or counters), so each test states the
traffic it means.  :func:`ctx` wraps documents and an inventory.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from clusterctl.diagnose.registry import AnalysisContext
from clusterctl.diagnose.thresholds import load_thresholds
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.node import collector

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "diagnose" / "roce"
CHECKS = Path(__file__).resolve().parents[3] / "checks"


def text(name: str) -> str:
    return (FIX / name).read_text()


def grep_counters(name: str) -> dict[str, int]:
    """``grep -H . DIR/*`` output -> {file name: value}; non-counters (lifespan) kept out."""
    out = {}
    for line in text(name).splitlines():
        path, _, value = line.rpartition(":")
        key = path.rsplit("/", 1)[-1]
        if value.isdigit() and key != "lifespan":
            out[key] = int(value)
    return out


ETHTOOL = collector.parse_ethtool_stats(text("ethtool_S_eth2.txt"))
HW = grep_counters("hw_counters_grep_mlx5_0_p1.txt")
IB = grep_counters("counters_grep_mlx5_0_p1.txt")

#: A healthy port's traffic: 2.5 GB/s of RDMA each way on priority 3, light TCP on 0.
BASELINE = {
    "tx_vport_rdma_unicast_bytes": 2.5e9,
    "rx_vport_rdma_unicast_bytes": 2.5e9,
    "tx_prio3_bytes": 2.5e9,
    "rx_prio3_bytes": 2.5e9,
    "tx_prio0_bytes": 4000,
    "rx_prio0_bytes": 4000,
    "rx_write_requests": 600_000,
    "port_xmit_data": 2.5e9 / 4,
}

INBOX_ONLY_MISSING = ("rx_err_lane_", "_buf_discard", "_cong_discard", "_marked")


def qos(
    *,
    mlnx_qos: str | None = "mlnx_qos_eth2_ok.txt",
    dcb_pfc: str = "dcb_pfc_show_eth2.txt",
    dcb_app: str | None = "dcb_app_show_N_eth2.txt",
    pause: str = "ethtool_a_eth2_off.txt",
    ecn: dict[str, Any] | None = None,
    tclass: int | None = 106,
    inbox: bool = False,
) -> dict[str, Any]:
    """A ``nics[].qos`` section as the collector builds it from these outputs."""
    q: dict[str, Any] = {
        "tool": None,
        "trust": None,
        "trust_source": None,
        "pfc_enabled": None,
        "dscp2prio": None,
        "prio2buffer": None,
        "prio2tc": None,
        "dcbx": None,
        "lldpad_warning": None,
        "cable_len": None,
        "global_pause": None,
        "ecn": None,
        "traffic_class": None,
        "traffic_class_reason": None,
        "pfc_stall_prevention": None,
        "raw": {},
        "reasons": {},
    }
    if mlnx_qos and not inbox:
        m = collector.parse_mlnx_qos(text(mlnx_qos))
        q.update(
            tool="mlnx_qos",
            trust=m["trust"],
            trust_source="mlnx_qos",
            pfc_enabled=m["pfc_enabled"],
            dscp2prio=m["dscp2prio"],
            dcbx=m["dcbx"],
            lldpad_warning=m["lldpad_warning"],
        )
    else:
        q["reasons"]["mlnx_qos -i eth2"] = "mlnx_qos not installed"
        q["tool"] = "dcb"
        q["pfc_enabled"] = collector.parse_dcb_pfc(text(dcb_pfc))
        q["dscp2prio"] = collector.parse_dcb_app_dscp(text(dcb_app)) if dcb_app else None
        q["trust"] = "dscp" if q["dscp2prio"] else "pcp"
        q["trust_source"] = "dcb app"
    q["global_pause"] = collector.parse_ethtool_pause(text(pause))
    if inbox:
        q["traffic_class_reason"] = "no /sys/class/infiniband/mlx5_0/tc/1/traffic_class"
    else:
        q["ecn"] = ecn or {
            "roce_np": {str(p): int(p == 3) for p in range(8)},
            "roce_rp": {str(p): int(p == 3) for p in range(8)},
            "cnp_dscp": 48,
            "cnp_802p_prio": 6,
        }
        q["traffic_class"] = tclass
        q["traffic_class_reason"] = None if tclass is not None else "not set"
    return q


def pfc_on(stats: dict[str, int], prio: int) -> dict[str, int]:
    """The counter set of a port with PFC on ``prio`` instead of 3 (mlx5 prints
    ``*_prioN_pause*`` only for PFC-enabled priorities)."""
    out = {}
    for k, v in stats.items():
        if "prio3_pause" in k:
            k = k.replace("prio3", f"prio{prio}")
        out[k] = v
    return out


def nic(
    netdev: str = "eth2",
    device: str = "mlx5_0",
    *,
    rates: dict[str, float] | None = None,
    dt: float = 3.0,
    baseline: bool = True,
    inbox: bool = False,
    pfc_prio: int = 3,
    qos_section: dict[str, Any] | None = None,
    speed_mbps: int = 400000,
    mtu: int = 4200,
    first: dict[str, int] | None = None,
    second: dict[str, int] | None = None,
    gids: list[dict[str, Any]] | None = None,
    state: str = "ACTIVE",
) -> dict[str, Any]:
    """One RoCE NIC entry with two samples ``dt`` s apart.

    ``first``/``second`` set counter values in one sample (to model wraps and
    resets); ``rates`` advances counters between the samples.
    """
    stats = dict(ETHTOOL)
    if inbox:
        stats = {k: v for k, v in stats.items() if not any(s in k for s in INBOX_ONLY_MISSING)}
    if pfc_prio != 3:
        stats = pfc_on(stats, pfc_prio)
    s0 = {
        "t": 5000.0,
        "read_s": 0.01,
        "ethtool_stats": stats,
        "hw_counters": dict(HW),
        "counters": dict(IB),
        "reason": None,
    }
    s1 = copy.deepcopy(s0)
    s1["t"] = s0["t"] + dt
    for table in ("ethtool_stats", "hw_counters", "counters"):
        for k, v in (first or {}).items():
            if k in s0[table]:
                s0[table][k] = v
                s1[table][k] = v
    all_rates = dict(BASELINE if baseline else {})
    all_rates.update(rates or {})
    for name, r in all_rates.items():
        for table in ("ethtool_stats", "hw_counters", "counters"):
            if name in s1[table]:
                s1[table][name] = s0[table][name] + int(r * dt)
    for table in ("ethtool_stats", "hw_counters", "counters"):
        for k, v in (second or {}).items():
            if k in s1[table]:
                s1[table][k] = v
    return {
        "netdev": netdev,
        "operstate": "up" if state == "ACTIVE" else "down",
        "speed_mbps": speed_mbps if state == "ACTIVE" else None,
        "mtu": mtu,
        "driver": "mlx5_core",
        "rdma": {
            "device": device,
            "port": 1,
            "netdev": netdev,
            "state": state,
            "phys_state": "LinkUp",
            "link_layer": "Ethernet",
            "rate": f"{speed_mbps // 1000} Gb/sec (4X NDR)",
            "rate_gbps": speed_mbps / 1000,
            "hw_counters": s0["hw_counters"],
            "counters": s0["counters"],
            "gids": gids
            if gids is not None
            else [
                {"index": 0, "gid": "fe80::1", "type": "IB/RoCE v1", "netdev": netdev},
                {"index": 1, "gid": "fe80::1", "type": "RoCE v2", "netdev": netdev},
            ],
        },
        "ethtool_stats": s0["ethtool_stats"],
        "ethtool_stats_reason": None,
        "qos": qos_section if qos_section is not None else qos(inbox=inbox),
        "samples": [s0, s1],
    }


def eth0() -> dict[str, Any]:
    return {
        "netdev": "eth0",
        "operstate": "up",
        "speed_mbps": 10000,
        "mtu": 1500,
        "rdma": None,
        "ethtool_stats": None,
        "ethtool_stats_reason": "not read: virtual interface",
        "qos": None,
        "samples": None,
    }


def doc(host: str, nics: list[dict[str, Any]] | None = None, shm_bytes: int = 64 << 30) -> dict[str, Any]:
    """A facts document with the sections these analyzers read."""
    return {
        "schema": 1,
        "collected_at": "2026-11-30T12:00:00+00:00",
        "duration_s": 3.2,
        "host": {
            "hostname": host,
            "disks": [{"device": "tmpfs", "mount": "/dev/shm", "fstype": "tmpfs", "total_bytes": shm_bytes}],
        },
        "gpus": {"available": False, "devices": []},
        "nics": [eth0(), *(nics if nics is not None else [nic("eth2", "mlx5_0"), nic("eth3", "mlx5_1")])],
        "units": [],
        "kernel_log": {"source": "journalctl -k", "lines": []},
        "errors": [],
        "rdma_prereqs": prereqs(),
    }


def prereqs(
    peermem: bool | None = True,
    acs: list[dict[str, Any]] | None = None,
    translated: int = 0,
    cmdline: list[str] | None = None,
) -> dict[str, Any]:
    """A collector ``rdma_prereqs`` section, healthy by default."""
    return {
        "peer_memory": {
            "loaded": peermem,
            "module": "nvidia_peermem" if peermem else None,
            "source": "/proc/modules" if peermem is not None else None,
            "reason": None if peermem is not None else "neither /proc/modules nor /sys/module is readable",
        },
        "iommu": {
            "cmdline": cmdline or [],
            "groups": 40,
            "identity_groups": 40 - translated,
            "translated_groups": translated,
            "reason": None,
        },
        "acs": acs or [],
        "probe_memlock": {"soft_bytes": 8 << 20, "hard_bytes": 8 << 20, "reason": None},
    }


def inventory(n: int = 8, per_leaf: int = 4, fabric: str = "", nics_speed: int = 400) -> Any:
    """``gpu[01-NN]`` with ``per_leaf`` hosts under each leaf and two 400G data NICs."""
    groups = "\n".join(
        f"  leaf{i + 1}:\n    hosts: [{', '.join(f'gpu{j + 1:02d}' for j in range(i * per_leaf, min(n, (i + 1) * per_leaf)))}]"
        f"\n    labels: {{leaf: leaf{i + 1}}}"
        for i in range((n + per_leaf - 1) // per_leaf)
    )
    hosts = "\n".join(f"  gpu{i + 1:02d}: {{address: 10.0.0.{i + 1}}}" for i in range(n))
    return load_inventory_text(
        f"""version: 1
defaults:
  nics:
    - {{netdev: eth0, role: management}}
    - {{netdev: eth2, role: data, rdma_device: mlx5_0, speed_gbps: {nics_speed}}}
    - {{netdev: eth3, role: data, rdma_device: mlx5_1, speed_gbps: {nics_speed}}}
{fabric or 'fabric: {kind: roce, trust: dscp, pfc_priority: 3, roce_dscp: 26, cnp_dscp: 48, mtu: 4200}'}
groups:
{groups}
hosts:
{hosts}
""",
        filename="test.yaml",
    )


def ctx(docs: dict[str, dict[str, Any]], inv: Any = None) -> AnalysisContext:
    return AnalysisContext(inventory=inv, facts=docs, thresholds=load_thresholds(CHECKS))


def cluster(n: int = 8, special: dict[str, dict[str, Any]] | None = None, per_leaf: int = 4) -> AnalysisContext:
    """``n`` healthy hosts, ``special`` replacing some hosts' documents."""
    docs = {f"gpu{i + 1:02d}": doc(f"gpu{i + 1:02d}") for i in range(n)}
    docs.update(special or {})
    return ctx(docs, inventory(n, per_leaf))
