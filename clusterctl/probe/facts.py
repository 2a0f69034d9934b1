"""Typed access to the collector's JSON document (schema in ``docs/facts.md``).

:func:`parse_facts` checks the schema version and returns :class:`Facts`,
whose attributes are the document's sections.  Analyzers read these objects;
everything not modelled here is still in :attr:`Facts.raw`.  Units follow the
document: bytes for memory, watts, degrees Celsius, Mbit/s for NIC speed,
Gbit/s for RDMA rate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from clusterctl.errors import ProbeError

#: The newest schema this clusterctl understands.
SCHEMA = 1


@dataclass
class GpuProcess:
    """A compute process holding GPU memory (``used_memory`` in bytes, may be None)."""

    pid: int
    used_memory: int | None
    name: str | None = None
    unit: str | None = None


@dataclass
class Gpu:
    """One GPU as NVML reported it.  ``None`` means "could not read": the reason
    is in ``field_errors`` (``"not supported"``, ``"no permission"``, ...).
    ``lost``: NVML said GPU_IS_LOST.  ``hung``: an NVML call on it timed out."""

    index: int
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    pci_address: str | None
    memory_total: int | None
    memory_used: int | None
    memory_free: int | None
    processes: list[GpuProcess] | None
    lost: bool
    hung: bool
    field_errors: dict[str, str]
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        """Any other field of the device entry (``ecc``, ``remapped_rows``, ``pcie``...)."""
        v = self.raw.get(key)
        return default if v is None else v

    @property
    def ok(self) -> bool:
        return not (self.lost or self.hung)


@dataclass
class GpuFacts:
    """``available`` False means NVML could not be used at all; ``reason`` says why."""

    available: bool
    reason: str | None
    driver_version: str | None
    devices: list[Gpu]
    topology: list[dict[str, Any]]
    timed_out_calls: list[str]

    @property
    def lost(self) -> list[Gpu]:
        return [g for g in self.devices if g.lost]


@dataclass
class RdmaPort:
    device: str
    port: int
    state: str | None
    phys_state: str | None
    link_layer: str | None
    rate_gbps: float | None
    counters: dict[str, int] | None
    hw_counters: dict[str, int] | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


@dataclass
class Nic:
    """A netdev (``netdev`` None for an RDMA port with no netdev); ``speed_mbps``
    None while the link is down or for virtual devices.  ``ethtool_stats``: the
    driver's counters from ``ethtool -S`` by name (since the driver loaded), or
    None with ``ethtool_stats_reason`` saying why (virtual interface, ethtool
    missing or failing, or a collector older than this field)."""

    netdev: str | None
    operstate: str | None
    speed_mbps: int | None
    mtu: int | None
    rx_bytes: int | None
    tx_bytes: int | None
    rdma: RdmaPort | None
    ethtool_stats: dict[str, int] | None = None
    ethtool_stats_reason: str | None = None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


@dataclass
class Unit:
    """A clusterctl-managed systemd unit; ``since`` is ISO 8601 UTC or None."""

    unit: str
    active_state: str | None
    sub_state: str | None
    restarts: int | None
    since: str | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


@dataclass
class KernelLog:
    """Kernel-log lines since the cursor passed in; pass ``cursor`` next time."""

    source: str | None
    cursor: str | None
    truncated: bool
    lines: list[dict[str, Any]]


@dataclass
class Facts:
    """One node's facts document."""

    schema: int
    collected_at: str
    host: dict[str, Any]
    gpus: GpuFacts
    nics: list[Nic]
    units: list[Unit] | None
    kernel_log: KernelLog
    errors: list[dict[str, str]]
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def hostname(self) -> str | None:
        return self.host.get("hostname")

    @property
    def boot_id(self) -> str | None:
        return self.host.get("boot_id")


def _gpu(d: dict[str, Any]) -> Gpu:
    procs = d.get("processes")
    return Gpu(
        index=int(d["index"]),
        name=d.get("name"),
        uuid=d.get("uuid"),
        pci_bus_id=d.get("pci_bus_id"),
        pci_address=d.get("pci_address"),
        memory_total=d.get("memory_total"),
        memory_used=d.get("memory_used"),
        memory_free=d.get("memory_free"),
        processes=None
        if procs is None
        else [GpuProcess(int(p["pid"]), p.get("used_memory"), p.get("name"), p.get("unit")) for p in procs],
        lost=bool(d.get("lost")),
        hung=bool(d.get("hung")),
        field_errors=dict(d.get("field_errors") or {}),
        raw=d,
    )


def _nic(d: dict[str, Any]) -> Nic:
    r = d.get("rdma")
    rdma = (
        None
        if not r
        else RdmaPort(
            device=r["device"],
            port=int(r["port"]),
            state=r.get("state"),
            phys_state=r.get("phys_state"),
            link_layer=r.get("link_layer"),
            rate_gbps=r.get("rate_gbps"),
            counters=r.get("counters"),
            hw_counters=r.get("hw_counters"),
            raw=r,
        )
    )
    return Nic(
        netdev=d.get("netdev"),
        operstate=d.get("operstate"),
        speed_mbps=d.get("speed_mbps"),
        mtu=d.get("mtu"),
        rx_bytes=d.get("rx_bytes"),
        tx_bytes=d.get("tx_bytes"),
        rdma=rdma,
        ethtool_stats=d.get("ethtool_stats"),
        ethtool_stats_reason=d.get(
            "ethtool_stats_reason", None if "ethtool_stats" in d else "not in this facts document (an older collector)"
        ),
        raw=d,
    )


def _unit(d: dict[str, Any]) -> Unit:
    return Unit(
        unit=d["unit"],
        active_state=d.get("active_state"),
        sub_state=d.get("sub_state"),
        restarts=d.get("restarts"),
        since=d.get("since"),
        raw=d,
    )


def parse_facts(doc: str | bytes | dict[str, Any], *, origin: str = "probe output") -> Facts:
    """Check and wrap one facts document (JSON text or an already parsed dict).

    Raises :class:`ProbeError` naming ``origin`` when the text is not JSON, has
    no ``schema``, comes from a newer collector (schema > :data:`SCHEMA`) or
    lacks a section.
    """
    if isinstance(doc, (str, bytes)):
        try:
            doc = json.loads(doc)
        except ValueError as e:
            raise ProbeError(f"{origin}: not a JSON document ({e})") from None
    if not isinstance(doc, dict):
        raise ProbeError(f"{origin}: expected a JSON object, got {type(doc).__name__}")
    schema = doc.get("schema")
    if not isinstance(schema, int):
        raise ProbeError(f"{origin}: no schema version (not a clusterctl facts document)")
    if schema > SCHEMA:
        raise ProbeError(
            f"{origin}: facts schema {schema} is newer than this clusterctl understands ({SCHEMA}); upgrade clusterctl"
        )
    try:
        g = doc["gpus"]
        k = doc.get("kernel_log") or {}
        units = doc.get("units")
        return Facts(
            schema=schema,
            collected_at=doc["collected_at"],
            host=doc["host"],
            gpus=GpuFacts(
                available=bool(g["available"]),
                reason=g.get("reason"),
                driver_version=g.get("driver_version"),
                devices=[_gpu(d) for d in g.get("devices") or []],
                topology=list(g.get("topology") or []),
                timed_out_calls=list(g.get("timed_out_calls") or []),
            ),
            nics=[_nic(n) for n in doc["nics"]],
            units=None if units is None else [_unit(u) for u in units],
            kernel_log=KernelLog(
                source=k.get("source"),
                cursor=k.get("cursor"),
                truncated=bool(k.get("truncated")),
                lines=list(k.get("lines") or []),
            ),
            errors=list(doc.get("errors") or []),
            raw=doc,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ProbeError(f"{origin}: malformed facts document (schema {schema}): {type(e).__name__}: {e}") from None
