"""Fact groups: one typed class per part of a facts document that analyzers read.

As pyinfra's facts, each group names what gathers it on the node (``command``:
the collector's function in ``clusterctl/node/collector.py``, run by the one probe
round trip) and how its output becomes a typed value (``parse``).  Analyzers ask
the context for a group (``ctx.fact(host, GpusFact)``) and read attributes, not
``.get(...) or {}`` chains; the JSON (``Any``) stays here, at the boundary.

Parsing is lenient as the analyzers always were: a section or field that is
missing or of the wrong type reads as ``None`` (or empty), never an exception, so a
partial document (an older collector, a facts document built from ``nvidia-smi -q``
by ``diagnose/nvsmi.py``) gives the same findings as before.  Values are kept as
the document has them (an int stays an int), so messages read the same.

The collector's schema version (``schema``, :data:`SCHEMA`) is checked here too: a
document of another schema is not guessed at; its groups read as unreadable (a
reason), which the checks report as UNKNOWN.  A document without ``schema`` (a
partial one built by clusterctl itself) is read as this schema.

Every reader of facts reads these groups: the analyzers, ``probe.facts.Facts`` (which is
made of them: pre-flight, placement's topology), bring-up (``net apply``, ``node setup``),
failover and ``inventory discover``/``diff``; a facts document is passed around as
:data:`FactsDoc` and indexed only here (``tests/unit/test_static_checks.py``).

Groups: :class:`GpusFact` (``gpus``, read by every ``gpu.*`` check),
:class:`KernelLogFact` (``kernel_log`` with the host's boot id: the ``gpu.xid``,
``gpu.oom``, ``roce.link_flap`` checks and the current-run split), :class:`UnitsFact`
(``units``: ``serving.unit``, ``pd.router``, ``oom.cause``, ``roce.prereqs``' memlock,
the NCCL environment).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

T = TypeVar("T")

#: The collector's facts schema these parsers read (``SCHEMA`` of clusterctl/node/collector.py).
SCHEMA = 1

#: One host's facts document as the collector wrote it (JSON; docs/facts.md): the boundary the
#: parsers below read; everything past them reads the typed groups.
FactsDoc = Mapping[str, Any]


class FactGroup(Generic[T]):
    """A part of the facts document: ``section`` (its key), ``command`` (what the
    node runs to gather it) and ``parse`` (the section, typed)."""

    section: ClassVar[str]
    command: ClassVar[str]

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> T:
        """The group's typed value from a whole facts document."""
        raise NotImplementedError


# ----------------------------------------------------------------- the JSON boundary


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def schema_problem(doc: Mapping[str, Any]) -> str | None:
    """Why a document cannot be read as :data:`SCHEMA`; None when it can (or names no schema)."""
    v = doc.get("schema")
    if v is None or (_int(v) == SCHEMA):
        return None
    return f"facts schema {v!r} from the collector, this clusterctl reads schema {SCHEMA}"


def _errors(doc: Mapping[str, Any], source: str) -> tuple[str, ...]:
    """The reasons of ``errors`` entries about ``source`` (``str`` of each, as reported)."""
    return tuple(
        str(e.get("reason")) for e in doc.get("errors") or [] if isinstance(e, dict) and e.get("source") == source
    )


def _dict(v: Any) -> dict[str, Any]:
    """A section that may be absent: ``v or {}`` as the analyzers read it."""
    return v if isinstance(v, dict) else {}


# ----------------------------------------------------------------- gpus


@dataclass(frozen=True)
class Ecc:
    """``ecc``: mode (``enabled`` None: the GPU has no ECC) and the volatile counters."""

    enabled: bool | None = None
    pending_enabled: bool | None = None
    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None


@dataclass(frozen=True)
class RemappedRows:
    correctable: int | None
    uncorrectable: int | None
    pending: bool | None
    failure: bool | None


@dataclass(frozen=True)
class RetiredPages:
    single_bit_ecc: int | None
    double_bit_ecc: int | None
    pending: bool | None


@dataclass(frozen=True)
class Fabric:
    """NVLink fabric registration (NVSwitch systems)."""

    state: str | None
    status: int | None
    clique_id: int | None


@dataclass(frozen=True)
class FabricManager:
    """``nvidia-fabricmanager.service`` as systemd saw it."""

    load_state: str | None
    active_state: str | None
    sub_state: str | None


@dataclass(frozen=True)
class ClockReasons:
    mask: str | None = None
    active: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pcie:
    width: int | None = None
    max_width: int | None = None
    gen: int | None = None
    max_gen: int | None = None
    replay_counter: int | None = None


@dataclass(frozen=True)
class NvLink:
    """One NVLink: ``errors`` holds the integer counters by name."""

    link: int | None
    state: str | None
    errors: dict[str, int]


@dataclass(frozen=True)
class Topology:
    """A GPU pair of ``nvidia-smi topo -m`` with its bonded NVLink count."""

    gpus: tuple[int, int]
    nvlinks: int


@dataclass(frozen=True)
class GpuPair:
    """A GPU pair of ``gpus.topology[]`` with ``level``, their nearest common ancestor as NVML
    names it (``NODE``, ``SYSTEM``...; None: unknown, ``reason`` says why)."""

    gpus: tuple[int, int]
    level: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU: ``used_memory`` bytes (None: NVML cannot tell); ``name`` and
    ``unit`` (its systemd service or scope) None for a process the probe cannot see."""

    pid: int | None
    used_memory: float | None = None
    name: str | None = None
    unit: str | None = None


@dataclass(frozen=True)
class GpuDevice:
    """One GPU of the ``gpus.devices`` list."""

    index: int | None
    name: str | None
    pci_address: str | None
    memory_total: int | None
    vbios_version: str | None
    lost: bool
    hung: bool
    field_errors: dict[str, str]
    ecc: Ecc
    remapped_rows: RemappedRows | None
    retired_pages: RetiredPages | None
    recovery_action: str | None
    fabric: Fabric | None
    clocks_event_reasons: ClockReasons
    pcie: Pcie
    utilization_gpu: float | None
    nvlink: tuple[NvLink, ...]
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    persistence_mode: bool | None
    numa_node: int | None = None
    pci_bus_id: str | None = None
    uuid: str | None = None
    memory_used: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    memory_free: float | None = None

    @property
    def ok(self) -> bool:
        """Neither lost (NVML's GPU_IS_LOST) nor hung (an NVML call on it timed out)."""
        return not (self.lost or self.hung)


@dataclass(frozen=True)
class GpuSection:
    """The ``gpus`` section: ``available`` False means NVML could not be used (``reason``)."""

    available: bool
    reason: str | None
    driver_version: str | None
    devices: tuple[GpuDevice, ...]
    timed_out_calls: tuple[str, ...]
    topology: tuple[Topology, ...]
    fabric_manager: FabricManager | None
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    #: why the document could not be read at all (another facts schema); None when it was
    unreadable: str | None = None
    #: GPUs NVML counts (``nvmlDeviceGetCount``); None when NVML did not answer
    count: int | None = None
    #: every pair of ``topology`` with its PCIe/CPU level (``topology`` keeps those with NVLinks)
    pairs: tuple[GpuPair, ...] = ()

    def device(self, index: int) -> GpuDevice | None:
        return next((d for d in self.devices if d.index == index), None)

    @property
    def lost(self) -> list[GpuDevice]:
        """The GPUs NVML reports lost."""
        return [d for d in self.devices if d.lost]


def _device(d: dict[str, Any]) -> GpuDevice:
    ecc, vol = _dict(d.get("ecc")), _dict(_dict(d.get("ecc")).get("volatile"))
    rr, rp, fab = d.get("remapped_rows"), d.get("retired_pages"), d.get("fabric")
    cr, p = _dict(d.get("clocks_event_reasons")), _dict(d.get("pcie"))
    return GpuDevice(
        index=_int(d.get("index")),
        name=_str(d.get("name")),
        pci_address=_str(d.get("pci_address")),
        memory_total=_int(d.get("memory_total")),
        vbios_version=_str(d.get("vbios_version")),
        lost=bool(d.get("lost")),
        hung=bool(d.get("hung")),
        field_errors={str(k): str(v) for k, v in _dict(d.get("field_errors")).items()},
        ecc=Ecc(
            _bool(ecc.get("enabled")),
            _bool(ecc.get("pending_enabled")),
            _int(vol.get("corrected")),
            _int(vol.get("uncorrected")),
        ),
        remapped_rows=RemappedRows(
            _int(rr.get("correctable")),
            _int(rr.get("uncorrectable")),
            _bool(rr.get("pending")),
            _bool(rr.get("failure")),
        )
        if rr and isinstance(rr, dict)
        else None,
        retired_pages=RetiredPages(
            _int(rp.get("single_bit_ecc")), _int(rp.get("double_bit_ecc")), _bool(rp.get("pending"))
        )
        if rp and isinstance(rp, dict)
        else None,
        recovery_action=_str(d.get("recovery_action")),
        fabric=Fabric(_str(fab.get("state")), _int(fab.get("status")), _int(fab.get("clique_id")))
        if fab and isinstance(fab, dict)
        else None,
        clocks_event_reasons=ClockReasons(_str(cr.get("mask")), tuple(str(a) for a in cr.get("active") or [])),
        pcie=Pcie(
            _int(p.get("width")),
            _int(p.get("max_width")),
            _int(p.get("gen")),
            _int(p.get("max_gen")),
            _int(p.get("replay_counter")),
        ),
        utilization_gpu=_num(_dict(d.get("utilization")).get("gpu")),
        nvlink=tuple(
            NvLink(
                _int(lk.get("link")),
                _str(lk.get("state")),
                {str(k): v for k, v in _dict(lk.get("errors")).items() if isinstance(v, int)},
            )
            for lk in d.get("nvlink") or []
            if isinstance(lk, dict)
        ),
        temperature_c=_num(d.get("temperature_c")),
        power_w=_num(d.get("power_w")),
        power_limit_w=_num(d.get("power_limit_w")),
        persistence_mode=_bool(d.get("persistence_mode")),
        numa_node=_int(d.get("numa_node")),
        pci_bus_id=_str(d.get("pci_bus_id")),
        uuid=_str(d.get("uuid")),
        memory_used=_num(d.get("memory_used")),
        memory_free=_num(d.get("memory_free")),
        processes=tuple(
            GpuProcess(_int(p.get("pid")), _num(p.get("used_memory")), _str(p.get("name")), _str(p.get("unit")))
            for p in d.get("processes") or []
            if isinstance(p, dict)
        ),
    )


def _pair(t: Any) -> tuple[int, int] | None:
    """A topology entry's two GPU indexes; None when it names anything else."""
    pair = t.get("gpus") if isinstance(t, dict) else None
    if (
        isinstance(pair, list)
        and len(pair) == 2
        and isinstance(a := _int(pair[0]), int)
        and isinstance(b := _int(pair[1]), int)
    ):
        return a, b
    return None


def _topology(entries: Any) -> tuple[Topology, ...]:
    out = []
    for t in entries if isinstance(entries, list) else ():
        if (pair := _pair(t)) is not None and (n := _int(t.get("nvlinks"))) is not None:
            out.append(Topology(pair, n))
    return tuple(out)


def _pairs(entries: Any) -> tuple[GpuPair, ...]:
    return tuple(
        GpuPair(pair, _str(t.get("level")), _str(t.get("reason")))
        for t in (entries if isinstance(entries, list) else ())
        if (pair := _pair(t)) is not None
    )


class GpusFact(FactGroup[GpuSection]):
    """The GPUs as NVML reports them (``gpus`` of docs/facts.md)."""

    section = "gpus"
    command = "collector.collect_gpus (NVML through pynvml, one thread per call with a deadline)"

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> GpuSection:
        bad = schema_problem(doc)
        if bad:
            return GpuSection(False, bad, None, (), (), (), None, unreadable=bad)
        g = _dict(doc.get("gpus"))
        fm = g.get("fabric_manager")
        return GpuSection(
            available=bool(g.get("available")),
            reason=_str(g.get("reason")),
            driver_version=None if g.get("driver_version") is None else str(g["driver_version"]),
            devices=tuple(_device(d) for d in g.get("devices") or [] if isinstance(d, dict)),
            timed_out_calls=tuple(str(c) for c in g.get("timed_out_calls") or []),
            topology=_topology(g.get("topology")),
            fabric_manager=FabricManager(
                _str(fm.get("load_state")), _str(fm.get("active_state")), _str(fm.get("sub_state"))
            )
            if fm and isinstance(fm, dict)
            else None,
            raw=g,
            count=_int(g.get("count")),
            pairs=_pairs(g.get("topology")),
        )


# ----------------------------------------------------------------- kernel_log


@dataclass(frozen=True)
class KernelLine:
    """One kernel message: ``time`` (epoch seconds) and ``boot_id`` where the source gives them."""

    text: str
    time: float | None = None
    boot_id: str | None = None
    priority: int | None = None


@dataclass(frozen=True)
class KernelLog:
    """The ``kernel_log`` section: ``source`` None means no kernel log was read (``reasons``
    says why: the ``errors`` entries about it, or the document's unreadable schema);
    ``boot_id`` is the host's current boot (``host.boot_id``), to tell older boots' lines."""

    source: str | None
    cursor: str | None
    lines: tuple[KernelLine, ...]
    truncated: bool
    rotated: bool
    reasons: tuple[str, ...]
    boot_id: str | None

    @property
    def texts(self) -> list[str]:
        return [x.text for x in self.lines]


class KernelLogFact(FactGroup[KernelLog]):
    """Kernel messages since the cursor (``kernel_log`` of docs/facts.md)."""

    section = "kernel_log"
    command = "collector.collect_kernel_log (journalctl -k -o json, else /var/log/kern.log from a file cursor)"

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> KernelLog:
        bad = schema_problem(doc)
        k = {} if bad else _dict(doc.get("kernel_log"))
        lines = tuple(
            KernelLine(
                str(x.get("text", "")),
                _num(x.get("time")),
                None if x.get("boot_id") is None else str(x["boot_id"]),
                _int(x.get("priority")),
            )
            for x in k.get("lines") or []
            if isinstance(x, dict)
        )
        source = k.get("source")
        return KernelLog(
            source=str(source) if source else None,
            cursor=_str(k.get("cursor")),
            lines=lines if source else (),
            truncated=bool(k.get("truncated")),
            rotated=bool(k.get("rotated")),
            reasons=(bad,) if bad else _errors(doc, "kernel_log"),
            boot_id=None if bad else _str(_dict(doc.get("host")).get("boot_id")),
        )


# ----------------------------------------------------------------- units


@dataclass(frozen=True)
class Unit:
    """One ``clusterctl-*`` systemd unit as ``systemctl show`` gave it (``units[]``).

    ``restarts`` is 0 when systemd did not say; ``limit_memlock`` is bytes, ``"infinity"``
    or None (not shown), and ``limit_memlock_read`` False when the collector did not
    report it at all (an older collector); ``environment`` is None when not reported."""

    unit: str
    load_state: str | None = None
    active_state: str | None = None
    sub_state: str | None = None
    unit_file_state: str | None = None
    result: str | None = None
    restarts: int = 0
    main_pid: int | None = None
    exec_main_status: int | None = None
    since: str | None = None
    since_text: str | None = None
    limit_memlock: int | str | None = None
    limit_memlock_read: bool = False
    environment: dict[str, str | None] | None = None
    environment_files: tuple[str, ...] = ()

    @property
    def loaded(self) -> bool:
        """systemd knows the unit (``LoadState`` other than ``not-found``)."""
        return self.load_state != "not-found"


@dataclass(frozen=True)
class Units:
    """The ``units`` section: ``read`` False when systemctl did not answer (``units`` null),
    the section is malformed or the document's schema is another (``reasons``)."""

    read: bool
    units: tuple[Unit, ...]
    reasons: tuple[str, ...]

    def get(self, unit: str) -> Unit | None:
        """The unit named ``unit`` (``clusterctl-NAME.service``), or None."""
        return next((u for u in self.units if u.unit == unit), None)


def _unit(u: dict[str, Any]) -> Unit:
    lim = u.get("limit_memlock")
    env = u.get("environment")
    return Unit(
        unit=str(u["unit"]),
        load_state=_str(u.get("load_state")),
        active_state=_str(u.get("active_state")),
        sub_state=_str(u.get("sub_state")),
        unit_file_state=_str(u.get("unit_file_state")),
        result=_str(u.get("result")),
        restarts=_int(u.get("restarts")) or 0,
        main_pid=_int(u.get("main_pid")),
        exec_main_status=_int(u.get("exec_main_status")),
        since=_str(u.get("since")),
        since_text=_str(u.get("since_text")),
        limit_memlock=lim if isinstance(lim, str) else _int(lim),
        limit_memlock_read="limit_memlock" in u,
        environment={str(k): None if v is None else str(v) for k, v in env.items()} if isinstance(env, dict) else None,
        environment_files=tuple(str(f) for f in u.get("environment_files") or [] if isinstance(f, str)),
    )


class UnitsFact(FactGroup[Units]):
    """The systemd units clusterctl manages (``units`` of docs/facts.md)."""

    section = "units"
    command = "collector.collect_units (systemctl list-units / list-unit-files clusterctl-*, systemctl show)"

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> Units:
        bad = schema_problem(doc)
        units = None if bad else doc.get("units")
        if not isinstance(units, list):
            why = bad or (
                "the units section is malformed"
                if units is not None
                else "; ".join(_errors(doc, "units")) or "systemctl did not answer"
            )
            return Units(False, (), (why,))
        return Units(
            True,
            tuple(_unit(u) for u in units if isinstance(u, dict) and isinstance(u.get("unit"), str) and u["unit"]),
            _errors(doc, "units"),
        )


# ----------------------------------------------------------------- nics


def _counters(v: Any) -> dict[str, int] | None:
    """A counter table (name -> integer); None when the section is absent or not a table.
    Entries that are not integers are left out (missing means "not read", never 0)."""
    if not isinstance(v, dict):
        return None
    return {str(k): c for k, c in v.items() if _int(c) is not None}


def _strmap(v: Any) -> dict[str, str]:
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else {}


@dataclass(frozen=True)
class Gid:
    """A populated GID entry of an RDMA port."""

    index: int | None
    gid: str
    type: str | None
    netdev: str | None


@dataclass(frozen=True)
class RdmaPort:
    """``nics[].rdma``: the RDMA port behind a netdev; ``counters``/``hw_counters`` None when
    the directory is absent."""

    device: str | None = None
    port: int | None = None
    netdev: str | None = None
    state: str | None = None
    phys_state: str | None = None
    link_layer: str | None = None
    rate: str | None = None
    rate_gbps: float | None = None
    fw_ver: str | None = None
    counters: dict[str, int] | None = None
    hw_counters: dict[str, int] | None = None
    gids: tuple[Gid, ...] = ()


@dataclass(frozen=True)
class CounterSample:
    """One sample of a NIC's counters (``nics[].samples[]``): ``t``/``t_sysfs`` on the node's
    monotonic clock; a table is None when it was not read (``reason``)."""

    t: float | None = None
    t_sysfs: float | None = None
    read_s: float | None = None
    ethtool_stats: dict[str, int] | None = None
    hw_counters: dict[str, int] | None = None
    counters: dict[str, int] | None = None
    reason: str | None = None


@dataclass(frozen=True)
class GlobalPause:
    """802.3x pause (``ethtool -a``)."""

    autoneg: bool | None
    rx: bool | None
    tx: bool | None


@dataclass(frozen=True)
class Ecn:
    """DCQCN: priorities with the notification / reaction point on, and the CNP's DSCP and 802.1p."""

    roce_np: tuple[int, ...]
    roce_rp: tuple[int, ...]
    cnp_dscp: int | None
    cnp_802p_prio: int | None


@dataclass(frozen=True)
class Qos:
    """``nics[].qos``: the RoCE QoS configuration (docs/facts.md); ``tool`` None when neither
    mlnx_qos nor dcb answered (``reasons``: command -> why)."""

    tool: str | None = None
    trust: str | None = None
    trust_source: str | None = None
    pfc_enabled: tuple[int, ...] | None = None
    dscp2prio: dict[str, int] | None = None
    prio2buffer: tuple[int | None, ...] | None = None
    prio2tc: tuple[int | None, ...] | None = None
    dcbx: str | None = None
    lldpad_warning: bool = False
    cable_len: float | None = None
    global_pause: GlobalPause | None = None
    ecn: Ecn | None = None
    traffic_class: int | None = None
    traffic_class_reason: str | None = None
    cm_tos: int | None = None
    cm_tos_reason: str | None = None
    pfc_stall_prevention: str | None = None
    raw: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Nic:
    """One network interface (``nics[]``) with its RDMA port, counters, QoS and samples."""

    netdev: str | None
    operstate: str | None = None
    speed_mbps: float | None = None
    mtu: int | None = None
    address: str | None = None
    numa_node: int | None = None
    pci_address: str | None = None
    driver: str | None = None
    rdma: RdmaPort | None = None
    ethtool_stats: dict[str, int] | None = None
    ethtool_stats_reason: str | None = None
    qos: Qos | None = None
    samples: tuple[CounterSample, ...] = ()

    @property
    def is_roce(self) -> bool:
        """A netdev with an RDMA port on Ethernet (a port that names no link layer counts)."""
        return bool(self.netdev) and self.rdma is not None and (self.rdma.link_layer or "Ethernet") == "Ethernet"

    @property
    def gbps(self) -> float | None:
        """Link speed in Gbit/s: the netdev's speed, else the RDMA port's rate."""
        if self.speed_mbps:
            return float(self.speed_mbps) / 1000
        rate = self.rdma.rate_gbps if self.rdma is not None else None
        return float(rate) if rate else None

    def counters_now(self) -> CounterSample:
        """The NIC's counters of this document as one sample (no time: a facts run's)."""
        rdma = self.rdma
        return CounterSample(
            ethtool_stats=self.ethtool_stats,
            hw_counters=rdma.hw_counters if rdma is not None else None,
            counters=rdma.counters if rdma is not None else None,
        )


@dataclass(frozen=True)
class Nics:
    """The ``nics`` section: ``read`` False when the document has none usable (``reasons``);
    ``collected_at`` of the document, to time two facts runs."""

    read: bool
    nics: tuple[Nic, ...]
    reasons: tuple[str, ...]
    collected_at: str | None = None

    @property
    def roce(self) -> list[Nic]:
        """NICs with a netdev and an RDMA port on Ethernet."""
        return [n for n in self.nics if n.is_roce]

    def get(self, netdev: str) -> Nic | None:
        return next((n for n in self.nics if n.netdev == netdev), None)


def _ints(v: Any) -> tuple[int, ...] | None:
    """A list of priorities (malformed entries left out)."""
    return tuple(x for x in v if _int(x) is not None) if isinstance(v, list) else None


def _slots(v: Any) -> tuple[int | None, ...] | None:
    """A per-priority list whose positions matter (an unreadable entry stays None)."""
    return tuple(_int(x) for x in v) if isinstance(v, list) else None


def _prios_on(v: Any) -> tuple[int, ...]:
    """Priorities (keys, as strings or numbers) whose value is set."""
    out = []
    for p, on in v.items() if isinstance(v, dict) else ():
        if on and (_int(p) is not None or (isinstance(p, str) and p.isdigit())):
            out.append(int(p))
    return tuple(sorted(out))


def counter_sample(s: Mapping[str, Any]) -> CounterSample:
    """A counter sample from its JSON (``nics[].samples[]``, or a hand-made one)."""
    return CounterSample(
        t=_num(s.get("t")),
        t_sysfs=_num(s.get("t_sysfs")),
        read_s=_num(s.get("read_s")),
        ethtool_stats=_counters(s.get("ethtool_stats")),
        hw_counters=_counters(s.get("hw_counters")),
        counters=_counters(s.get("counters")),
        reason=_str(s.get("reason")),
    )


def _qos(q: dict[str, Any]) -> Qos:
    gp, ecn, d2p = q.get("global_pause"), q.get("ecn"), q.get("dscp2prio")
    return Qos(
        tool=_str(q.get("tool")),
        trust=_str(q.get("trust")),
        trust_source=_str(q.get("trust_source")),
        pfc_enabled=_ints(q.get("pfc_enabled")),
        dscp2prio={str(k): v for k, v in d2p.items() if _int(v) is not None} if isinstance(d2p, dict) else None,
        prio2buffer=_slots(q.get("prio2buffer")),
        prio2tc=_slots(q.get("prio2tc")),
        dcbx=_str(q.get("dcbx")),
        lldpad_warning=bool(q.get("lldpad_warning")),
        cable_len=_num(q.get("cable_len")),
        global_pause=GlobalPause(_bool(gp.get("autoneg")), _bool(gp.get("rx")), _bool(gp.get("tx")))
        if isinstance(gp, dict)
        else None,
        ecn=Ecn(
            _prios_on(ecn.get("roce_np")),
            _prios_on(ecn.get("roce_rp")),
            _int(ecn.get("cnp_dscp")),
            _int(ecn.get("cnp_802p_prio")),
        )
        if isinstance(ecn, dict)
        else None,
        traffic_class=_int(q.get("traffic_class")),
        traffic_class_reason=_str(q.get("traffic_class_reason")),
        cm_tos=_int(q.get("cm_tos")),
        cm_tos_reason=_str(q.get("cm_tos_reason")),
        pfc_stall_prevention=_str(q.get("pfc_stall_prevention")),
        raw=_strmap(q.get("raw")),
        reasons=_strmap(q.get("reasons")),
    )


def _rdma(r: dict[str, Any]) -> RdmaPort:
    return RdmaPort(
        device=_str(r.get("device")),
        port=_int(r.get("port")),
        netdev=_str(r.get("netdev")),
        state=_str(r.get("state")),
        phys_state=_str(r.get("phys_state")),
        link_layer=_str(r.get("link_layer")),
        rate=_str(r.get("rate")),
        rate_gbps=_num(r.get("rate_gbps")),
        fw_ver=None if r.get("fw_ver") is None else str(r["fw_ver"]),
        counters=_counters(r.get("counters")),
        hw_counters=_counters(r.get("hw_counters")),
        gids=tuple(
            Gid(_int(g.get("index")), str(g.get("gid") or ""), _str(g.get("type")), _str(g.get("netdev")))
            for g in r.get("gids") or []
            if isinstance(g, dict)
        ),
    )


def nic(n: Mapping[str, Any]) -> Nic:
    """One NIC from its JSON (``nics[]``)."""
    r, q = n.get("rdma"), n.get("qos")
    return Nic(
        netdev=None if not n.get("netdev") else str(n["netdev"]),
        operstate=_str(n.get("operstate")),
        speed_mbps=_num(n.get("speed_mbps")),
        mtu=_int(n.get("mtu")),
        address=_str(n.get("address")),
        numa_node=_int(n.get("numa_node")),
        pci_address=_str(n.get("pci_address")),
        driver=_str(n.get("driver")),
        rdma=_rdma(r) if isinstance(r, dict) and r else None,
        ethtool_stats=_counters(n.get("ethtool_stats")),
        ethtool_stats_reason=_str(n.get("ethtool_stats_reason"))
        if "ethtool_stats" in n or "ethtool_stats_reason" in n
        else "not in this facts document (an older collector)",
        qos=_qos(q) if isinstance(q, dict) else None,
        samples=tuple(counter_sample(s) for s in n.get("samples") or [] if isinstance(s, dict)),
    )


class NicsFact(FactGroup[Nics]):
    """Network interfaces and their RDMA ports, counters and RoCE QoS (``nics`` of docs/facts.md)."""

    section = "nics"
    command = (
        "collector.collect_nics + collect_ethtool_stats + collect_qos + collect_samples "
        "(sysfs /sys/class/net and /sys/class/infiniband, ethtool -S/-a, mlnx_qos or dcb)"
    )

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> Nics:
        bad = schema_problem(doc)
        nics = None if bad else doc.get("nics")
        at = _str(doc.get("collected_at"))
        if nics is None:
            nics = [] if not bad else None
        if not isinstance(nics, list):
            return Nics(False, (), (bad or "the nics section is malformed",), at)
        return Nics(True, tuple(nic(n) for n in nics if isinstance(n, dict)), _errors(doc, "nics"), at)


# ----------------------------------------------------------------- host (disks)


@dataclass(frozen=True)
class Disk:
    """A mount that holds data (``host.disks[]``), sizes in bytes (None: not read)."""

    mount: str | None
    device: str | None = None
    fstype: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    avail_bytes: int | None = None


@dataclass(frozen=True)
class HostInfo:
    """The parts of the ``host`` section the checks read (the rest stays in the document)."""

    hostname: str | None
    boot_id: str | None
    disks: tuple[Disk, ...]
    #: ``memory.available`` (bytes, /proc/meminfo's MemAvailable); None when not read
    mem_available: float | None = None

    def mount(self, path: str) -> Disk | None:
        return next((d for d in self.disks if d.mount == path), None)


class HostFact(FactGroup[HostInfo]):
    """OS, kernel, memory and disks of the node (``host`` of docs/facts.md)."""

    section = "host"
    command = "collector.collect_host (/etc/os-release, uname, /proc, statvfs of each mount)"

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> HostInfo:
        h = {} if schema_problem(doc) else _dict(doc.get("host"))
        return HostInfo(
            hostname=_str(h.get("hostname")),
            boot_id=_str(h.get("boot_id")),
            disks=tuple(
                Disk(
                    _str(d.get("mount")),
                    _str(d.get("device")),
                    _str(d.get("fstype")),
                    _int(d.get("total_bytes")),
                    _int(d.get("free_bytes")),
                    _int(d.get("avail_bytes")),
                )
                for d in h.get("disks") or []
                if isinstance(d, dict)
            ),
            mem_available=_num(_dict(h.get("memory")).get("available")),
        )


# ----------------------------------------------------------------- rdma_prereqs


@dataclass(frozen=True)
class PeerMemory:
    """Whether ``nvidia_peermem`` (or ``nv_peer_mem``) is loaded; ``loaded`` None: not known (``reason``)."""

    loaded: bool | None
    module: str | None = None
    source: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class AcsBridge:
    """A PCIe switch port between a GPU and an RDMA NIC; ``redirect`` None: ACS not readable."""

    pci_address: str | None
    redirect: bool | None
    acs_ctl: tuple[str, ...] = ()
    source: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class AcsPair:
    gpu: int | None
    netdev: str | None
    bridges: tuple[AcsBridge, ...]


@dataclass(frozen=True)
class Iommu:
    cmdline: tuple[str, ...]
    groups: int | None
    identity_groups: int | None
    translated_groups: int | None
    reason: str | None


@dataclass(frozen=True)
class ProbeMemlock:
    """The probe's own RLIMIT_MEMLOCK (``soft_bytes`` None: unlimited when ``soft_read``)."""

    soft_bytes: int | None
    hard_bytes: int | None
    soft_read: bool
    reason: str | None


@dataclass(frozen=True)
class RdmaPrereqs:
    """The ``rdma_prereqs`` section; a part is None when the document has none (an older
    collector, or another schema: ``reasons``)."""

    peer_memory: PeerMemory | None
    acs: tuple[AcsPair, ...] | None
    iommu: Iommu | None
    probe_memlock: ProbeMemlock | None
    reasons: tuple[str, ...] = ()


class RdmaPrereqsFact(FactGroup[RdmaPrereqs]):
    """GPUDirect RDMA prerequisites (``rdma_prereqs`` of docs/facts.md)."""

    section = "rdma_prereqs"
    command = "collector.collect_rdma_prereqs (/proc/modules, /proc/cmdline, iommu_groups, PCI config or lspci)"

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> RdmaPrereqs:
        bad = schema_problem(doc)
        p = {} if bad else _dict(doc.get("rdma_prereqs"))
        pm, acs, io, ml = p.get("peer_memory"), p.get("acs"), p.get("iommu"), p.get("probe_memlock")
        return RdmaPrereqs(
            peer_memory=PeerMemory(
                _bool(pm.get("loaded")), _str(pm.get("module")), _str(pm.get("source")), _str(pm.get("reason"))
            )
            if isinstance(pm, dict)
            else None,
            acs=tuple(
                AcsPair(
                    _int(a.get("gpu")),
                    _str(a.get("netdev")),
                    tuple(
                        AcsBridge(
                            _str(b.get("pci_address")),
                            _bool(b.get("redirect")),
                            tuple(str(x) for x in b.get("acs_ctl") or [] if isinstance(x, str)),
                            _str(b.get("source")),
                            _str(b.get("reason")),
                        )
                        for b in a.get("bridges") or []
                        if isinstance(b, dict)
                    ),
                )
                for a in acs
                if isinstance(a, dict)
            )
            if isinstance(acs, list)
            else None,
            iommu=Iommu(
                tuple(str(w) for w in io.get("cmdline") or [] if isinstance(w, str)),
                _int(io.get("groups")),
                _int(io.get("identity_groups")),
                _int(io.get("translated_groups")),
                _str(io.get("reason")),
            )
            if isinstance(io, dict)
            else None,
            probe_memlock=ProbeMemlock(
                _int(ml.get("soft_bytes")), _int(ml.get("hard_bytes")), "soft_bytes" in ml, _str(ml.get("reason"))
            )
            if isinstance(ml, dict)
            else None,
            reasons=(bad,) if bad else _errors(doc, "rdma_prereqs"),
        )


# ----------------------------------------------------------------- tools


@dataclass(frozen=True)
class Tools:
    """Optional programs on the node, name -> path (None: absent); ``read`` False when the
    document does not say (an older collector, another schema: ``reasons``)."""

    read: bool
    paths: dict[str, str | None]
    reasons: tuple[str, ...] = ()

    def path(self, name: str) -> str | None:
        return self.paths.get(name)


class ToolsFact(FactGroup[Tools]):
    """``tools`` of docs/facts.md (``ib_write_bw`` for ``doctor --active``)."""

    section = "tools"
    command = "collector.find_tools (each optional program looked up on PATH)"

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> Tools:
        bad = schema_problem(doc)
        t = None if bad else doc.get("tools")
        if not isinstance(t, dict):
            return Tools(False, {}, (bad,) if bad else ())
        return Tools(True, {str(k): str(v) if v else None for k, v in t.items()})


# ----------------------------------------------------------------- node_prereqs


@dataclass(frozen=True)
class LimitLine:
    """A ``memlock``/``nofile`` line of limits.conf (pam_limits(8)): ``type`` soft, hard or ``-``."""

    domain: str
    type: str
    item: str
    value: str
    file: str | None = None


def limit_line(e: Mapping[str, Any]) -> LimitLine:
    """A limits.conf line from its JSON (``node_prereqs.limits[]``)."""
    return LimitLine(
        str(e.get("domain")), str(e.get("type")), str(e.get("item")), str(e.get("value")), _str(e.get("file"))
    )


@dataclass(frozen=True)
class NodePrereqs:
    """The ``node_prereqs`` section: ``read`` False when it is null (the section failed, see
    ``reasons``), absent or of another schema; ``sysctl`` name -> value now (None: no such
    file), ``sysctl_dropin`` None when node setup's drop-in is absent."""

    read: bool
    sysctl: dict[str, str | None]
    sysctl_dropin: dict[str, str] | None
    limits: tuple[LimitLine, ...]
    users: tuple[str, ...]
    reasons: tuple[str, ...] = ()


class NodePrereqsFact(FactGroup[NodePrereqs]):
    """What ``clusterctl node setup`` converges (``node_prereqs`` of docs/facts.md)."""

    section = "node_prereqs"
    command = "collector.collect_node_prereqs (/proc/sys, the sysctl drop-in, limits.conf and limits.d, /etc/passwd)"

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> NodePrereqs:
        bad = schema_problem(doc)
        sec = None if bad else doc.get("node_prereqs")
        if not isinstance(sec, dict):
            return NodePrereqs(False, {}, None, (), (), (bad,) if bad else _errors(doc, "node_prereqs"))
        dropin = sec.get("sysctl_dropin")
        return NodePrereqs(
            True,
            {str(k): None if v is None else str(v) for k, v in _dict(sec.get("sysctl")).items()},
            _strmap(dropin) if isinstance(dropin, dict) else None,
            tuple(limit_line(e) for e in sec.get("limits") or [] if isinstance(e, dict)),
            tuple(str(u) for u in sec.get("users") or [] if isinstance(u, str)),
            _errors(doc, "node_prereqs"),
        )
