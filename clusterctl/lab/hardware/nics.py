"""The per-host NIC state (``<hw>/nic.json``): initial counters, rates and QoS.

Initial counter values come from a real-looking ConnectX-7 port (the shared
``ethtool -S eth2`` / ``hw_counters`` samples), scaled a little per host and
port so hosts differ; baseline rates model steady RDMA traffic with no
pauses, drops or CNP storms.  See :mod:`.tools.nicmodel` for the format.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from clusterctl.lab.hardware.profiles import DATA_NICS, check_flavour
from clusterctl.lab.hardware.tools import nicmodel

STATE_FILE = nicmodel.STATE_FILE

#: Values of a busy port at provisioning time (host 0, first port).
BASE_VALUES: dict[str, int] = {
    "rx_packets": 48213377,
    "rx_bytes": 21990512884,
    "tx_packets": 51170262,
    "tx_bytes": 19822114376,
    "tx_tso_packets": 1209981,
    "tx_tso_bytes": 9841127344,
    "rx_gro_packets": 3318210,
    "rx_gro_bytes": 12914551022,
    "rx_gro_skbs": 402117,
    "rx_csum_none": 4133,
    "rx_csum_complete": 48209244,
    "tx_csum_none": 311,
    "tx_csum_partial": 49211807,
    "tx_xmit_more": 2010443,
    "tx_cqes": 49159819,
    "ch_events": 61822190,
    "ch_poll": 63110874,
    "ch_arm": 61790233,
    "rx_out_of_buffer": 1937,
    "rx_vport_unicast_packets": 48210114,
    "rx_vport_unicast_bytes": 22183390112,
    "tx_vport_unicast_packets": 51168871,
    "tx_vport_unicast_bytes": 20027004190,
    "rx_vport_multicast_packets": 2911,
    "rx_vport_multicast_bytes": 261990,
    "tx_vport_multicast_packets": 1288,
    "tx_vport_multicast_bytes": 112344,
    "rx_vport_broadcast_packets": 352,
    "rx_vport_broadcast_bytes": 21120,
    "tx_vport_broadcast_packets": 103,
    "tx_vport_broadcast_bytes": 6180,
    "rx_vport_rdma_unicast_packets": 99189728952,
    "rx_vport_rdma_unicast_bytes": 411826432892915,
    "tx_vport_rdma_unicast_packets": 98906534784,
    "tx_vport_rdma_unicast_bytes": 410650073238646,
    "tx_packets_phy": 98957706437,
    "rx_packets_phy": 99237945592,
    "tx_bytes_phy": 410670316150864,
    "rx_bytes_phy": 411848900792065,
    "tx_multicast_phy": 1288,
    "tx_broadcast_phy": 103,
    "rx_multicast_phy": 2911,
    "rx_broadcast_phy": 352,
    "rx_64_bytes_phy": 1102455,
    "rx_65_to_127_bytes_phy": 34195877,
    "rx_128_to_255_bytes_phy": 6410932,
    "rx_256_to_511_bytes_phy": 2119804,
    "rx_512_to_1023_bytes_phy": 1877310,
    "rx_1024_to_1518_bytes_phy": 3811006,
    "rx_1519_to_2047_bytes_phy": 412877,
    "rx_2048_to_4095_bytes_phy": 1203398144,
    "rx_4096_to_8191_bytes_phy": 97984617187,
    "link_down_events_phy": 1,
    "rx_corrected_bits_phy": 18446291,
    "rx_err_lane_0_phy": 4611902,
    "rx_err_lane_1_phy": 4598377,
    "rx_err_lane_2_phy": 4622140,
    "rx_err_lane_3_phy": 4613872,
    "rx_buffer_passed_thres_phy": 3871,
    "rx_prio0_bytes": 22376539782,
    "rx_prio0_packets": 48216640,
    "tx_prio0_bytes": 20231809326,
    "tx_prio0_packets": 51171653,
    "rx_prio3_bytes": 411826263606815,
    "rx_prio3_packets": 99187441302,
    "tx_prio3_bytes": 410649894239528,
    "tx_prio3_packets": 98904115877,
    # Pause frames: rx/tx_pause_ctrl_phy are the sums of these.
    "rx_prio3_pause": 1284512,
    "rx_prio3_pause_duration": 8911334,
    "tx_prio3_pause": 22301,
    "tx_prio3_pause_duration": 95220,
    "rx_prio3_pause_transition": 642177,
    "ch0_events": 1003118,
    "ch0_poll": 1024771,
    "ch0_arm": 1002640,
    "rx0_packets": 771204,
    "rx0_bytes": 352117903,
    "rx0_csum_complete": 771190,
    "rx0_csum_none": 14,
    "tx0_packets": 802117,
    "tx0_bytes": 311004872,
    "tx0_csum_partial": 789213,
    "rx_prio0_buf_discard": 12,
    # hw_counters
    "rx_write_requests": 2984301127,
    "resp_cqe_error": 6,
    "resp_cqe_flush_error": 6,
    "rp_cnp_handled": 2287650,
    "np_ecn_marked_roce_packets": 2503311,
    "np_cnp_sent": 2418907,
}

#: Per-second rates of a port under steady NCCL traffic (about 2.5 GB/s each way).
BASE_RATES: dict[str, float] = {
    "rx_vport_rdma_unicast_bytes": 2.5e9,
    "tx_vport_rdma_unicast_bytes": 2.5e9,
    "rx_vport_rdma_unicast_packets": 600_000,
    "tx_vport_rdma_unicast_packets": 600_000,
    "rx_prio3_bytes": 2.5e9,
    "tx_prio3_bytes": 2.5e9,
    "rx_prio3_packets": 600_000,
    "tx_prio3_packets": 600_000,
    "rx_bytes_phy": 2.5e9,
    "tx_bytes_phy": 2.5e9,
    "rx_packets_phy": 600_010,
    "tx_packets_phy": 600_010,
    "rx_packets": 10,
    "tx_packets": 10,
    "rx_bytes": 4_000,
    "tx_bytes": 4_000,
    "rx_vport_unicast_packets": 10,
    "tx_vport_unicast_packets": 10,
    "rx_vport_unicast_bytes": 4_000,
    "tx_vport_unicast_bytes": 4_000,
    "rx_prio0_packets": 10,
    "tx_prio0_packets": 10,
    "rx_prio0_bytes": 4_000,
    "tx_prio0_bytes": 4_000,
    "ch_events": 12,
    "ch_poll": 12,
    "ch_arm": 12,
    "ch0_events": 12,
    "ch0_poll": 12,
    "ch0_arm": 12,
    "rx0_packets": 10,
    "tx0_packets": 10,
    "rx0_bytes": 4_000,
    "tx0_bytes": 4_000,
    "rx0_csum_complete": 10,
    "tx0_csum_partial": 10,
    "rx_csum_complete": 10,
    "tx_csum_partial": 10,
    "tx_cqes": 10,
    "rx_write_requests": 300_000,
}

#: Capabilities per flavour: the "inbox" host models an older ConnectX-6 Dx
#: firmware without per-lane error counters and without shared-buffer (sbcam)
#: congestion counters, so those names are absent there.
CAPS = {
    "mlnx": list(nicmodel.ALL_CAPS),
    "inbox": [c for c in nicmodel.ALL_CAPS if c not in ("per_lane_error_counters", "sbcam_reg")],
}


def mac_address(host_index: int, nic_index: int) -> str:
    """Deterministic locally-administered MAC of a data port."""
    return f"02:77:{(host_index >> 8) & 0xFF:02x}:{host_index & 0xFF:02x}:{0x10 + nic_index:02x}:01"


def data_ipv4(host_index: int, nic_index: int) -> str:
    """Deterministic IPv4 address of a data port (10.(200+k).0.0/16 per port k, host n at n+1): only
    in the fake sysfs, where it makes the port's IPv4 GIDs (a RoCE v2 data NIC has an address)."""
    n = host_index + 1
    return f"10.{200 + nic_index}.{(n >> 8) & 0xFF}.{n & 0xFF}"


def new_state(host: str, host_index: int, flavour: str, now: float | None = None) -> dict[str, Any]:
    """The ``nic.json`` document for a freshly provisioned host."""
    check_flavour(flavour)
    t0 = time.time() if now is None else now
    nics = {}
    for k, spec in enumerate(DATA_NICS):
        scale = 1.0 + 0.013 * host_index + 0.07 * k
        counters = {name: [int(v * scale), BASE_RATES.get(name, 0.0), t0] for name, v in BASE_VALUES.items()}
        for name, rate in BASE_RATES.items():
            counters.setdefault(name, [0, rate, t0])
        guid = f"0c42:a103:{host_index & 0xFFFF:04x}:{k:04x}"
        nics[spec.netdev] = {
            "rdma_device": spec.rdma_device,
            "port": spec.port,
            "mtu": spec.mtu,
            "speed_mbps": spec.speed_mbps,
            "mac": mac_address(host_index, k),
            "pci": spec.pci,
            "numa_node": spec.numa_node,
            "fw": "28.39.1002" if flavour == "mlnx" else "22.36.1010",
            "node_guid": guid,
            "link_up": True,
            "caps": CAPS[flavour],
            "ipv4": data_ipv4(host_index, k),
            "qos": nicmodel.default_qos(),
            "counters": counters,
        }
    return {"flavour": flavour, "hostname": host, "t0": t0, "nics": nics}


def load(hw: Path) -> dict[str, Any]:
    return nicmodel.load(str(hw / STATE_FILE))


def save(hw: Path, state: dict[str, Any]) -> None:
    nicmodel.save(state, str(hw / STATE_FILE))
