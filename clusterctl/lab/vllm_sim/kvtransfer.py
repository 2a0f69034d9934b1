"""Prefill/decode disaggregation in the simulator: ``--kv-transfer-config`` and the KV pull.

What it follows (docs/disaggregation.md has the sources):

* ``--kv-transfer-config`` is a JSON object (vLLM's ``KVTransferConfig``):
  ``kv_connector`` (a registered connector name), ``kv_role``
  (``kv_producer`` | ``kv_consumer`` | ``kv_both``), ``engine_id``, ``kv_port``,
  ``kv_connector_extra_config``, ``kv_load_failure_policy`` (``fail`` default).
* The request protocol the router speaks (vllm-router's ``--vllm-pd-disaggregation``,
  as vLLM's NIXL proxy): the prefill instance gets the request with
  ``max_tokens: 1`` and ``kv_transfer_params: {"do_remote_decode": true}`` and
  answers with ``kv_transfer_params`` naming its engine, blocks, host and port;
  the decode instance gets the original request with those params
  (``do_remote_prefill: true``), pulls the KV blocks and decodes.
* Metrics of the NIXL connector: ``vllm:nixl_xfer_time_seconds``,
  ``vllm:nixl_bytes_transferred`` (histograms), ``vllm:nixl_num_failed_transfers``.

The simulated pull moves ``prompt tokens x KV bytes per token`` (all ranks) over
the host's data NICs.  Their rate comes from the lab's NIC state
(``<hw>/nic.json``, the same file the fake ``ethtool`` reads): the link speed,
times the share of each second not paused by PFC on the RoCE priority (a pause
storm), times :data:`LOSSY_SHARE` when PFC is off on the priority RoCE traffic
maps to (a wrong PFC priority: drops and go-back-N retransmits); a link down
fails the transfer.  The prefill side puts its own rate in the params it
returns (``x_sim_link_bytes_per_s``, a simulator-only key the router passes
through); the pull runs at the lower of the two ends.  Transfers of one
instance share its link (one after the other).  Stdlib only: installed into lab hosts.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

ROLES = ("kv_producer", "kv_consumer", "kv_both")
#: Connectors registered in vLLM 0.32's KVConnectorFactory (distributed/kv_transfer/kv_connector/factory.py).
CONNECTORS = (
    "ExampleConnector",
    "LMCacheConnectorV1",
    "LMCacheMPConnector",
    "NixlConnector",
    "NixlPullConnector",
    "NixlPushConnector",
    "MultiConnector",
    "MoRIIOConnector",
    "OffloadingConnector",
    "DecodeBenchConnector",
    "MooncakeConnector",
    "MooncakeStoreConnector",
    "P2pNcclConnector",
    "FlexKVConnectorV1",
    "HiSparseConnector",
)
#: Share of the link rate left when RoCE runs on a priority without PFC (drops, retransmits).
LOSSY_SHARE = 0.25
#: The key the simulated prefill adds to its kv_transfer_params (not a vLLM field).
SIM_RATE_KEY = "x_sim_link_bytes_per_s"
#: A link nobody described: 100 Gbit/s.
DEFAULT_RATE = 100e9 / 8


@dataclass(frozen=True)
class KvConfig:
    connector: str
    role: str
    engine_id: str
    kv_port: int = 14579
    failure_policy: str = "fail"

    @property
    def produces(self) -> bool:
        return self.role in ("kv_producer", "kv_both")

    @property
    def consumes(self) -> bool:
        return self.role in ("kv_consumer", "kv_both")


def parse_kv_config(text: str) -> KvConfig:
    """``--kv-transfer-config`` JSON → :class:`KvConfig`; ``ValueError`` with vLLM-like text."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--kv-transfer-config: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError("--kv-transfer-config: must be a JSON object")
    conn, role = d.get("kv_connector"), d.get("kv_role")
    if conn is not None and conn not in CONNECTORS:
        raise ValueError(f"Unsupported connector type: {conn}")
    if role is not None and role not in ROLES:
        raise ValueError(f"Unsupported kv_role: {role}. Supported roles are {', '.join(ROLES)}")
    if conn is not None and role is None:
        raise ValueError(f"Please specify kv_role when kv_connector is set, supported roles are {list(ROLES)}")
    policy = d.get("kv_load_failure_policy", "fail")
    if policy not in ("recompute", "fail"):
        raise ValueError(f"kv_load_failure_policy: {policy!r} is not one of 'recompute', 'fail'")
    port = d.get("kv_port", 14579)
    return KvConfig(
        connector=str(conn or ""),
        role=str(role or ""),
        engine_id=str(d.get("engine_id") or os.urandom(8).hex()),
        kv_port=int(port),
        failure_policy=policy,
    )


def hw_nic_state(env: dict[str, str]) -> dict[str, Any] | None:
    """The lab NIC state of this host (``$LAB_HW_DIR``, else beside ``$FAKE_NVML_STATE``), or None."""
    d = env.get("LAB_HW_DIR") or (
        os.path.dirname(env["FAKE_NVML_STATE"]) if env.get("FAKE_NVML_STATE") else "/var/lib/lab-hw"
    )
    try:
        with open(os.path.join(d, "nic.json"), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _rate(nic: dict[str, Any], name: str) -> float:
    entry = nic.get("counters", {}).get(name)
    return float(entry[1]) if isinstance(entry, list) and len(entry) == 3 else 0.0


@dataclass(frozen=True)
class LinkState:
    bytes_per_s: float  # 0: no usable link (the transfer fails)
    why: str  # "" when healthy, else what slows or stops it


def link_state(state: dict[str, Any] | None, nics: int = 1) -> LinkState:
    """The rate KV moves at over this host's RDMA NICs (the first ``nics`` of them)."""
    if not state:
        return LinkState(DEFAULT_RATE, "")
    data = [(name, n) for name, n in sorted(state.get("nics", {}).items()) if n.get("rdma_device")]
    if not data:
        return LinkState(DEFAULT_RATE, "")
    total, notes = 0.0, []
    for name, n in data[: max(1, nics)]:
        if not n.get("link_up", True):
            notes.append(f"{name} link down")
            continue
        rate = float(n.get("speed_mbps", 100000)) * 1e6 / 8
        qos = n.get("qos") or {}
        dscp = int(qos.get("tclass", 106)) >> 2
        d2p = qos.get("dscp2prio") or [d >> 3 for d in range(64)]
        prio = int(d2p[dscp]) if 0 <= dscp < len(d2p) else 3
        paused = max(_rate(n, f"rx_prio{prio}_pause_duration"), _rate(n, f"tx_prio{prio}_pause_duration")) / 1e6
        if paused > 0:
            rate *= max(0.0, 1.0 - min(1.0, paused))
            notes.append(f"{name} paused {min(1.0, paused):.0%} on priority {prio}")
        pfc = qos.get("pfc") or [0] * 8
        if not pfc[prio]:
            rate *= LOSSY_SHARE
            notes.append(f"{name} PFC off on RoCE priority {prio}")
        total += rate
    return LinkState(total, "; ".join(notes))


class Link:
    """This instance's share of the data network: transfers queue on it one after another."""

    def __init__(self, env: dict[str, str], nics: int = 1) -> None:
        self.env, self.nics = env, nics
        self._lock = threading.Lock()
        self._free_at = 0.0  # monotonic seconds (simulated, at 1x) when the link is next free

    def state(self) -> LinkState:
        return link_state(hw_nic_state(self.env), self.nics)

    def reserve(self, nbytes: float, rate: float, now: float | None = None) -> float:
        """Queue ``nbytes`` at ``rate`` B/s; returns the seconds (at 1x) until it has arrived."""
        t = time.monotonic() if now is None else now
        with self._lock:
            start = max(t, self._free_at)
            self._free_at = start + nbytes / rate
            return self._free_at - t


def produced_params(cfg: KvConfig, *, blocks: int, host: str, port: int, tp: int, rate: float) -> dict[str, Any]:
    """What a prefill instance answers in ``kv_transfer_params`` (NixlConnector's fields)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(range(blocks)),
        "remote_engine_id": cfg.engine_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": tp,
        SIM_RATE_KEY: rate,
    }
