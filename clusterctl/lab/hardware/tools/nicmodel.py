"""The simulated ConnectX (mlx5) port: counter names, values over time, QoS.

Stdlib only: this module is installed into lab hosts next to the fake
``ethtool``, ``mlnx_qos``, ``dcb``, ``rdma`` and ``ibdev2netdev`` scripts, and
the control side (ticker, faults) imports the same file.

State lives in ``<hw>/nic.json`` (``<hw>`` is ``$LAB_HW_DIR``, default
``/var/lib/lab-hw``)::

    {"flavour": "mlnx"|"inbox", "hostname": ..., "nics": {"eth2": {
        "rdma_device": "mlx5_0", "port": 1, "mtu": 4200, "speed_mbps": 400000,
        "mac": "...", "pci": "0000:1a:00.0", "numa_node": 0, "fw": "...",
        "link_up": true, "caps": [...], "qos": {...},
        "counters": {"<name>": [base, rate_per_s, since_epoch_s], ...}}}}

A counter's value at time t is ``base + rate * (t - since)``; changing a rate
first folds the value so far into ``base``, so counters never go backwards.
Names missing from ``counters`` read as 0 when the NIC has them; whether the
NIC has a name at all is decided by its capabilities and QoS (PFC-enabled
priorities, global pause), as in the mlx5 driver.
"""

from __future__ import annotations

import json
import os
import threading
import time

DEFAULT_HW_DIR = "/var/lib/lab-hw"
STATE_FILE = "nic.json"

#: Capabilities a modelled NIC may have (names as in the mlx5 driver's gating).
ALL_CAPS = (
    "per_lane_error_counters",
    "rx_buffer_fullness_counters",
    "pcie_counters",
    "sbcam_reg",
    "stall_detect",
    "ppcnt_statistical_group",
    "roce_accl",
    "cc_query_allowed",
    "out_of_seq_cnt",
    "retransmission_q_counters",
    "enhanced_error_q_counters",
    "rx_icrc_encapsulated_counter",
)


def hw_dir() -> str:
    """The per-host state directory (``$LAB_HW_DIR`` overrides it for tests)."""
    return os.environ.get("LAB_HW_DIR") or DEFAULT_HW_DIR


def load(path: str | None = None) -> dict:
    """Read ``nic.json``; raises OSError/ValueError on a missing or broken file."""
    with open(path or os.path.join(hw_dir(), STATE_FILE), encoding="utf-8") as f:
        return json.load(f)


def save(state: dict, path: str | None = None) -> None:
    """Write ``nic.json`` atomically (temp file in the same directory + rename)."""
    path = path or os.path.join(hw_dir(), STATE_FILE)
    atomic_write(path, json.dumps(state, indent=1, sort_keys=True) + "\n")


def atomic_write(path: str, text: str, tmp_dir: str | None = None) -> None:
    """Replace ``path`` with ``text`` so readers see the old or the new file, never half.

    The temporary file is named after this process and thread, in ``tmp_dir``
    (same file system as ``path``; default: its directory).
    """
    tmp = os.path.join(tmp_dir or os.path.dirname(path) or ".", f".tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# ------------------------------------------------------------------ values


def value(nic: dict, name: str, now: float | None = None) -> int:
    """The counter ``name`` at ``now`` (epoch seconds), from base and rate; unknown = 0."""
    t = time.time() if now is None else now
    derived = _DERIVED.get(name)
    if derived is not None:
        return derived(nic, t)
    entry = nic.get("counters", {}).get(name)
    if not entry:
        return 0
    base, rate, since = entry
    return int(base + rate * max(0.0, t - since))


def set_rate(nic: dict, name: str, rate: float, now: float | None = None) -> None:
    """Make ``name`` advance at ``rate`` per second from ``now`` on, keeping its value."""
    t = time.time() if now is None else now
    current = value(nic, name, t)
    nic.setdefault("counters", {})[name] = [current, float(rate), t]


def add(nic: dict, name: str, amount: int, now: float | None = None) -> None:
    """Step ``name`` up by ``amount`` now (a one-off event such as a link flap)."""
    t = time.time() if now is None else now
    entry = nic.setdefault("counters", {}).get(name)
    rate = entry[1] if entry else 0.0
    nic["counters"][name] = [value(nic, name, t) + int(amount), rate, t]


def _sum(names):
    return lambda nic, now: sum(value(nic, n, now) for n in names)


def _quarter(name):
    return lambda nic, now: value(nic, name, now) // 4


#: Bytes of one CNP frame on the wire (as the per-priority byte counters count it).
CNP_FRAME_BYTES = 78


_PRIO_RX_PAUSE = [f"rx_prio{p}_pause" for p in range(8)] + ["rx_global_pause"]
_PRIO_TX_PAUSE = [f"tx_prio{p}_pause" for p in range(8)] + ["tx_global_pause"]

#: Counters that are views of others, as the driver/firmware computes them:
#: PMA port data is RDMA octets / 4; MAC control frames = pause frames.
_DERIVED = {
    "rx_pause_ctrl_phy": _sum(_PRIO_RX_PAUSE),
    "tx_pause_ctrl_phy": _sum(_PRIO_TX_PAUSE),
    "rx_mac_control_phy": _sum(_PRIO_RX_PAUSE),
    "tx_mac_control_phy": _sum(_PRIO_TX_PAUSE),
    "port_xmit_data": _quarter("tx_vport_rdma_unicast_bytes"),
    "port_rcv_data": _quarter("rx_vport_rdma_unicast_bytes"),
    "port_xmit_packets": _sum(["tx_vport_rdma_unicast_packets"]),
    "port_rcv_packets": _sum(["rx_vport_rdma_unicast_packets"]),
    "unicast_xmit_packets": _sum(["tx_vport_rdma_unicast_packets"]),
    "unicast_rcv_packets": _sum(["rx_vport_rdma_unicast_packets"]),
    # CNPs travel on priority 6 (cnp_802p_prio): received ones are handled or ignored.
    "rx_prio6_packets": _sum(["rp_cnp_handled", "rp_cnp_ignored"]),
    "tx_prio6_packets": _sum(["np_cnp_sent"]),
    "rx_prio6_bytes": lambda nic, now: CNP_FRAME_BYTES * value(nic, "rx_prio6_packets", now),
    "tx_prio6_bytes": lambda nic, now: CNP_FRAME_BYTES * value(nic, "tx_prio6_packets", now),
}


# ------------------------------------------------------------------- names

_SW = (
    "rx_packets rx_bytes tx_packets tx_bytes tx_tso_packets tx_tso_bytes rx_gro_packets "
    "rx_gro_bytes rx_gro_skbs rx_ecn_mark rx_csum_unnecessary rx_csum_none rx_csum_complete "
    "tx_csum_none tx_csum_partial tx_queue_stopped tx_queue_dropped tx_xmit_more tx_recover "
    "tx_cqes tx_queue_wake tx_cqe_err rx_wqe_err rx_oversize_pkts_sw_drop rx_buff_alloc_err "
    "rx_congst_umr rx_arfs_err rx_recover ch_events ch_poll ch_arm ch_aff_change ch_force_irq "
    "ch_eq_rearm"
).split()
_QCNT = ["rx_out_of_buffer", "rx_if_down_packets"]
_VNIC = ["rx_steer_missed_packets", "dev_internal_queue_oob"]
_VPORT = [
    f"{d}_vport_{k}_{u}"
    for k in ("unicast", "multicast", "broadcast")
    for d, u in (("rx", "packets"), ("rx", "bytes"), ("tx", "packets"), ("tx", "bytes"))
]
_VPORT += [
    f"{d}_vport_rdma_{k}_{u}"
    for k in ("unicast", "multicast")
    for d, u in (("rx", "packets"), ("rx", "bytes"), ("tx", "packets"), ("tx", "bytes"))
]
_802_3 = (
    "tx_packets_phy rx_packets_phy rx_crc_errors_phy tx_bytes_phy rx_bytes_phy "
    "tx_multicast_phy tx_broadcast_phy rx_multicast_phy rx_broadcast_phy "
    "rx_in_range_len_errors_phy rx_out_of_range_len_phy rx_oversize_pkts_phy "
    "rx_symbol_err_phy tx_mac_control_phy rx_mac_control_phy rx_unsupported_op_phy "
    "rx_pause_ctrl_phy tx_pause_ctrl_phy"
).split()
_2863 = ["rx_discards_phy", "tx_discards_phy", "tx_errors_phy"]
_2819 = [
    "rx_undersize_pkts_phy",
    "rx_fragments_phy",
    "rx_jabbers_phy",
    "rx_64_bytes_phy",
    "rx_65_to_127_bytes_phy",
    "rx_128_to_255_bytes_phy",
    "rx_256_to_511_bytes_phy",
    "rx_512_to_1023_bytes_phy",
    "rx_1024_to_1518_bytes_phy",
    "rx_1519_to_2047_bytes_phy",
    "rx_2048_to_4095_bytes_phy",
    "rx_4096_to_8191_bytes_phy",
    "rx_8192_to_10239_bytes_phy",
]
_PCIE = [
    "rx_pci_signal_integrity",
    "tx_pci_signal_integrity",
    "outbound_pci_buffer_overflow",
    "outbound_pci_stalled_rd",
    "outbound_pci_stalled_wr",
    "outbound_pci_stalled_rd_events",
    "outbound_pci_stalled_wr_events",
]
_PME = ["module_unplug", "module_bus_stuck", "module_high_temp", "module_bad_shorted"]
#: One channel's counters (a real port prints one set per channel; one is modelled).
_CHANNEL0 = [
    "ch0_events",
    "ch0_poll",
    "ch0_arm",
    "ch0_aff_change",
    "ch0_force_irq",
    "ch0_eq_rearm",
    "rx0_packets",
    "rx0_bytes",
    "rx0_csum_complete",
    "rx0_csum_none",
    "tx0_packets",
    "tx0_bytes",
    "tx0_csum_partial",
    "tx0_stopped",
    "tx0_dropped",
]
_PFC_FMT = ("rx_{p}_pause", "rx_{p}_pause_duration", "tx_{p}_pause", "tx_{p}_pause_duration", "rx_{p}_pause_transition")


def ethtool_names(nic: dict) -> list[str]:
    """The ``ethtool -S`` names of this port, in the driver's group order.

    Groups: sw, qcnt, vnic_env, vport, 802_3, 2863, 2819, phy, eth_ext, pcie,
    per_prio (traffic, then PFC for enabled priorities, global pause, storm),
    pme, channels (one channel), per_port_buff_congest.
    """
    caps = set(nic.get("caps", ALL_CAPS))
    qos = nic.get("qos", {})
    names = _SW + _QCNT + _VNIC + _VPORT + _802_3 + _2863 + _2819
    names.append("link_down_events_phy")
    if "ppcnt_statistical_group" in caps:
        names += ["rx_pcs_symbol_err_phy", "rx_corrected_bits_phy"]
    if "per_lane_error_counters" in caps:
        names += [f"rx_err_lane_{i}_phy" for i in range(4)]
    if "rx_buffer_fullness_counters" in caps:
        names.append("rx_buffer_passed_thres_phy")
    if "pcie_counters" in caps:
        names += _PCIE
    for p in range(8):
        names += [
            f"rx_prio{p}_bytes",
            f"rx_prio{p}_packets",
            f"rx_prio{p}_discards",
            f"tx_prio{p}_bytes",
            f"tx_prio{p}_packets",
        ]
    pfc = qos.get("pfc", [0] * 8)
    for p in range(8):
        if pfc[p]:
            names += [f.format(p=f"prio{p}") for f in _PFC_FMT]
    if qos.get("global_pause"):
        names += [f.format(p="global") for f in _PFC_FMT]
    if "stall_detect" in caps and any(pfc):
        names += ["tx_pause_storm_warning_events", "tx_pause_storm_error_events"]
    names += _PME
    names += _CHANNEL0
    if "sbcam_reg" in caps:
        for p in range(8):
            names += [f"rx_prio{p}_buf_discard", f"rx_prio{p}_cong_discard", f"rx_prio{p}_marked"]
    return names


_HW_BASIC = ["rx_write_requests", "rx_read_requests", "rx_atomic_requests", "rx_dct_connect", "out_of_buffer"]
_HW_RETRANS = [
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
]
_HW_EXT = [
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "req_transport_retries_exceeded",
    "req_rnr_retries_exceeded",
]
_HW_ACCL = [
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
]
_HW_CC = ["rp_cnp_ignored", "rp_cnp_handled", "np_ecn_marked_roce_packets", "np_cnp_sent"]


def hw_counter_names(nic: dict) -> list[str]:
    """``rdma statistic`` / ``hw_counters`` names in descriptor order (without ``lifespan``)."""
    caps = set(nic.get("caps", ALL_CAPS))
    names = list(_HW_BASIC)
    if "out_of_seq_cnt" in caps:
        names.append("out_of_sequence")
    if "retransmission_q_counters" in caps:
        names += _HW_RETRANS
    if "enhanced_error_q_counters" in caps:
        names += _HW_EXT
    if "roce_accl" in caps:
        names += _HW_ACCL
    if "cc_query_allowed" in caps:
        names += _HW_CC
    if "rx_icrc_encapsulated_counter" in caps:
        names.append("rx_icrc_encapsulated")
    return names


PMA_COUNTERS = [
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
]

NETDEV_STATS = {
    "rx_bytes": "rx_bytes",
    "tx_bytes": "tx_bytes",
    "rx_packets": "rx_packets",
    "tx_packets": "tx_packets",
    "rx_errors": "rx_crc_errors_phy",
    "tx_errors": "tx_errors_phy",
    "rx_dropped": "rx_out_of_buffer",
    "tx_dropped": "tx_queue_dropped",
    "rx_crc_errors": "rx_crc_errors_phy",
    "multicast": "rx_multicast_phy",
}


# --------------------------------------------------------------------- QoS


def default_qos() -> dict:
    """The reference lossless-RoCE profile: trust dscp, PFC on 3, DSCP d -> d >> 3."""
    return {
        "dcbx": "os",
        "trust": "dscp",
        "pfc": [0, 0, 0, 1, 0, 0, 0, 0],
        "buffer": [0, 0, 0, 1, 0, 0, 0, 0],
        "dscp2prio": [d >> 3 for d in range(64)],
        "dscp_order": "ascending",
        "global_pause": False,
        "cable_len": 7,
        "buffer_size": [130944, 130944, 0, 0, 0, 0, 0, 0],
        "max_buffer_size": 262016,
        "prio2tc": [1, 0, 2, 3, 4, 5, 6, 7],
        "ecn_np": [0, 0, 0, 1, 0, 0, 0, 0],
        "ecn_rp": [0, 0, 0, 1, 0, 0, 0, 0],
        "cnp_dscp": 48,
        "cnp_802p_prio": 6,
        "tclass": 106,
        "pfc_delay": 7,
    }


#: A fake configfs tree under ``hw_dir()`` (``/sys/kernel/config`` as the unit tests' net apply
#: script and ``cma_roce_tos`` see it; lab hosts cannot have it bound into their read-only /sys).
CONFIGFS = "configfs"
#: The kernel's default RDMA-CM ToS is 0; lab hosts start as a configured node (lshca's 106).
DEFAULT_CM_TOS = 106


def cm_tos_path(hw: str, device: str, port: int) -> str:
    """``rdma_cm/DEV/ports/PORT/default_roce_tos`` of the fake configfs: the state itself (the
    net apply script and the fake ``cma_roce_tos`` write it as they would the kernel's file)."""
    return os.path.join(hw, CONFIGFS, "rdma_cm", device, "ports", str(port), "default_roce_tos")


def write_cm_tos(hw: str, device: str, port: int, tos: int) -> None:
    """Set the RDMA-CM default ToS of one port (provisioning, heal, the ``qos-tos`` fault)."""
    path = cm_tos_path(hw, device, port)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(os.path.join(os.path.dirname(path), "default_roce_mode"), "RoCE v2\n")
    atomic_write(path, "%d\n" % tos)


def nic_by_name(state: dict, ifname: str) -> dict | None:
    return state.get("nics", {}).get(ifname)


def nic_by_rdma(state: dict, dev: str) -> tuple[str, dict] | None:
    for ifname, nic in state.get("nics", {}).items():
        if nic.get("rdma_device") == dev:
            return ifname, nic
    return None


# ------------------------------------------------- QoS files and settings


def qos_files(ifname: str, nic: dict) -> dict[str, str]:
    """The MLNX_OFED QoS/ECN sysfs files of one port, relative to the ``sys-class`` tree.

    ``net/IF/qos/trust``, ``net/IF/ecn/roce_{np,rp}/enable/P``,
    ``net/IF/ecn/roce_np/cnp_dscp``/``cnp_802p_prio``/``min_time_between_cnps``,
    ``net/IF/pfc_stall_prevention`` and ``infiniband/DEV/tc/PORT/traffic_class``
    (``Global tclass=N``, empty when unset).  Only "mlnx" hosts have them.
    """
    qos = nic.get("qos", {})
    d = f"net/{ifname}"
    out = {f"{d}/qos/trust": qos.get("trust", "dscp") + "\n", f"{d}/pfc_stall_prevention": "default\n"}
    for side, key in (("roce_np", "ecn_np"), ("roce_rp", "ecn_rp")):
        for p in range(8):
            out[f"{d}/ecn/{side}/enable/{p}"] = f"{qos.get(key, [0] * 8)[p]}\n"
    out[f"{d}/ecn/roce_np/cnp_dscp"] = f"{qos.get('cnp_dscp', 48)}\n"
    out[f"{d}/ecn/roce_np/cnp_802p_prio"] = f"{qos.get('cnp_802p_prio', 6)}\n"
    out[f"{d}/ecn/roce_np/min_time_between_cnps"] = "4\n"
    tclass = qos.get("tclass")
    out[f"infiniband/{nic['rdma_device']}/tc/{nic.get('port', 1)}/traffic_class"] = (
        f"Global tclass={tclass}\n" if tclass is not None else ""
    )
    return out


def update(ifname: str, change) -> dict:
    """Change one port's state under ``hw_dir()`` and refresh its sysfs trust file.

    ``change(state, nic)`` edits the loaded state in place and may raise
    ``ValueError`` (nothing is written then).  The fake tools call this for the
    settings they can change, so ``nic.json`` (what the tools print) and
    ``qos/trust`` (what readers of ``/sys/class`` see) never disagree.
    Raises ``KeyError`` for an unknown ``ifname``.
    """
    hw = hw_dir()
    state = load()
    nic = nic_by_name(state, ifname)
    if nic is None:
        raise KeyError(ifname)
    change(state, nic)
    save(state)
    if state.get("flavour", "mlnx") == "mlnx":
        tmp = os.path.join(hw, ".tmp")
        os.makedirs(tmp, exist_ok=True)
        root = os.path.join(hw, "sys-class")
        for rel, text in qos_files(ifname, nic).items():
            if not rel.endswith("/qos/trust"):
                continue  # ECN and the traffic class are sysfs-only: no tool changes them
            path = os.path.join(root, rel)
            if os.path.isdir(os.path.dirname(path)):
                atomic_write(path, text, tmp_dir=tmp)
    return nic
