"""Faults injected into one lab host's simulated hardware, and ``heal``.

Every fault is a function ``fault(host_dir, **options) -> str`` that edits the
host's state files (atomically) and returns a one-line summary of what
changed; the fake library and tools re-read the files on every call, so a
fault shows up while the host runs.  :data:`FAULTS` maps the CLI names
(``clusterctl lab inject HOST FAULT key=value ...``) to the functions;
:func:`parse_options` turns ``key=value`` strings into typed keyword options
using each function's defaults.  Bad names or values raise :class:`LabError`.

Kernel-log faults (``xid``, ``oom``, ``link-flap``, ``gpu-lost``) append lines
to the host's own ``/var/log/kern.log``; ``heal`` restores healthy hardware
but leaves logs alone (history stays, as on a real node).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from clusterctl.errors import LabError
from clusterctl.lab.hardware import gpus as gpustate
from clusterctl.lab.hardware import kernlog, nics, sysfs
from clusterctl.lab.hardware.host import host_record, hw_dir
from clusterctl.lab.hardware.profiles import gpu_profile
from clusterctl.lab.hardware.tools import nicmodel

#: Default message of each XID, from the shared kernel-log samples.
XID_MESSAGES = {
    13: "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
    31: "Ch 00000018, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f2c_4a000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    43: "Ch 00000018",
    45: "Ch 00000018",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
    "at partition 6, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    74: "NVLink: fatal error detected on link 14(0x100000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected.",
    94: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout waiting for RPC from GSP1! Expected function 76 (GSP_RM_CONTROL) (0x2080014b 0x5).",
}
#: XIDs an application causes: the kernel names its pid and process.
APP_XIDS = {13, 31, 43, 45, 94}

CLOCK_REASONS = {
    "idle": 0x1,
    "app_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display": 0x100,
}
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")


# ------------------------------------------------------------------ helpers


@contextlib.contextmanager
def _gpu_state(host_dir: Path) -> Iterator[dict[str, Any]]:
    hw = hw_dir(host_dir)
    try:
        state = gpustate.load(hw)
    except (OSError, ValueError) as e:
        raise LabError(f"{hw}: no GPU state ({e}); provision the host first") from None
    yield state
    gpustate.save(hw, state)


def _gpu(state: dict[str, Any], gpu: int) -> dict[str, Any]:
    n = len(state["gpus"])
    if not 0 <= gpu < n:
        raise LabError(f"gpu={gpu}: this host has {n} GPU(s) (0..{n - 1})" if n else "this host has no GPUs")
    return state["gpus"][gpu]


@contextlib.contextmanager
def _nic_state(host_dir: Path) -> Iterator[dict[str, Any]]:
    hw = hw_dir(host_dir)
    try:
        state = nics.load(hw)
    except (OSError, ValueError) as e:
        raise LabError(f"{hw}: no NIC state ({e}); provision the host first") from None
    yield state
    nics.save(hw, state)
    sysfs.write_config(hw, state)
    sysfs.refresh_counters(hw, state)


def _nic(state: dict[str, Any], nic: str) -> dict[str, Any]:
    ports = state.get("nics", {})
    if nic not in ports:
        raise LabError(f"nic={nic}: no such data NIC (known: {', '.join(sorted(ports))})")
    return ports[nic]


def _prio(priority: int) -> int:
    if not 0 <= priority <= 7:
        raise LabError(f"priority={priority}: must be 0..7")
    return priority


def _pci_short(g: dict[str, Any]) -> str:
    return f"{g['pci_domain']:04x}:{g['pci_bus']:02x}:{g['pci_device']:02x}"


def _hostname(host_dir: Path) -> str:
    return str(host_record(host_dir)["name"])


# --------------------------------------------------------------- GPU faults


def xid(
    host_dir: Path, code: int = 79, gpu: int = 0, message: str = "", pid: int = 0, name: str = "python3", gi: int = -1
) -> str:
    """Log ``NVRM: Xid (PCI:dddd:bb:dd): CODE, pid=..., name=..., MESSAGE`` for ``gpu``.

    Application XIDs (13, 31, 43, 45, 94) carry ``pid``/``name``; the others
    ``pid='<unknown>', name=<unknown>`` as the driver prints them.  ``gi`` >= 0
    names a MIG GPU instance (``PCI:0000:01:00 GPU-I:05``).
    """
    with _gpu_state(host_dir) as state:
        g = _gpu(state, gpu)
    text = message or XID_MESSAGES.get(code, "Unknown Xid")
    if code in APP_XIDS:
        who = f"pid={pid or 4242}, name={name}"
    else:
        who = "pid='<unknown>', name=<unknown>"
    where = _pci_short(g) + (f" GPU-I:{gi:02d}" if gi >= 0 else "")
    lines = [f"NVRM: Xid (PCI:{where}): {code}, {who}, {text}"]
    if code == 79:
        lines.insert(0, f"NVRM: GPU at PCI:{_pci_short(g)}: {g['uuid']}")
        lines.append(f"NVRM: GPU {_pci_short(g)}.0: GPU has fallen off the bus.")
    path = kernlog.append(host_dir, _hostname(host_dir), lines)
    return f"Xid {code} on GPU {gpu} ({_pci_short(g)}) logged to {path}"


def oom(host_dir: Path, pid: int = 4242, process: str = "python3", rss_gib: float = 180.0) -> str:
    """Log the kernel OOM killer invoking and killing ``pid`` (``process``)."""
    rss_kb = int(rss_gib * 1024 * 1024)
    lines = [
        f"{process} invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,"
        f"global_oom,task_memcg=/system.slice,task={process},pid={pid},uid=0",
        f"Out of memory: Killed process {pid} ({process}) total-vm:{rss_kb + 52_000_000}kB, "
        f"anon-rss:{rss_kb}kB, file-rss:81920kB, shmem-rss:0kB, UID:0 pgtables:{rss_kb // 500}kB "
        "oom_score_adj:0",
    ]
    path = kernlog.append(host_dir, _hostname(host_dir), lines)
    return f"OOM kill of {pid} ({process}) logged to {path}"


def gpu_lost(host_dir: Path, gpu: int = 0, lost: bool = True, log: bool = True) -> str:
    """Make ``gpu`` fall off the bus: it still counts, but NVML calls fail with GPU_IS_LOST.

    With ``log`` the driver's Xid 79 lines are written too, as on a real node.
    """
    with _gpu_state(host_dir) as state:
        _gpu(state, gpu)["lost"] = bool(lost)
    if lost and log:
        xid(host_dir, code=79, gpu=gpu)
    return f"GPU {gpu} {'lost (GPU_IS_LOST)' if lost else 'back on the bus'}"


RECOVERY_ACTIONS = {"none": 0, "reset": 1, "reboot": 2, "drain-p2p": 3, "drain-and-reset": 4}


def recovery(host_dir: Path, gpu: int = 0, action: str = "reset", log_xid: int = 154) -> str:
    """Set what NVML's ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` answers for ``gpu`` (none, reset,
    reboot, drain-p2p, drain-and-reset); with ``log_xid`` > 0 the driver's Xid line for it is logged
    too (154, "GPU recovery action changed"), as a real node does, once."""
    if action not in RECOVERY_ACTIONS:
        raise LabError(f"action={action!r}: one of {', '.join(RECOVERY_ACTIONS)}")
    with _gpu_state(host_dir) as state:
        _gpu(state, gpu)["recovery_action"] = RECOVERY_ACTIONS[action]
    if log_xid and action != "none":
        xid(
            host_dir,
            code=log_xid,
            gpu=gpu,
            message=f"GPU recovery action changed from 0x0 (None) to 0x{RECOVERY_ACTIONS[action]:x}",
        )
    return f"GPU {gpu}: recovery action {action}"


FABRIC_STATES = {"none": None, "not-started": 1, "in-progress": 2, "completed": 3}


def fabric(host_dir: Path, gpu: int = 0, state: str = "completed", status: int = 0) -> str:
    """What ``nvmlDeviceGetGpuFabricInfo`` answers for ``gpu`` (an NVSwitch system): ``state``
    not-started, in-progress or completed (with NVML ``status``), or none (no fabric: NOT_SUPPORTED)."""
    if state not in FABRIC_STATES:
        raise LabError(f"state={state!r}: one of {', '.join(FABRIC_STATES)}")
    with _gpu_state(host_dir) as st:
        code = FABRIC_STATES[state]
        _gpu(st, gpu)["fabric"] = None if code is None else {"state": code, "status": int(status), "clique_id": 1}
    return f"GPU {gpu}: fabric {state}" + (f" (status {status})" if status else "")


def gpu_hang(host_dir: Path, gpu: int = 0, seconds: float = 30.0) -> str:
    """Every NVML call on ``gpu`` blocks ``seconds``, then fails with NVML_ERROR_TIMEOUT
    (as a GPU whose firmware stopped answering, Xid 119); 0 ends the hang.  Other
    GPUs keep answering."""
    if seconds < 0:
        raise LabError(f"seconds={seconds}: must be >= 0")
    with _gpu_state(host_dir) as state:
        g = _gpu(state, gpu)
        if seconds:
            g["hang_s"] = float(seconds)
        else:
            g.pop("hang_s", None)
    return f"GPU {gpu}: NVML calls " + (f"hang {seconds:g} s" if seconds else "answer again")


def driver(host_dir: Path, loaded: bool = False) -> str:
    """Unload (or reload) the NVIDIA driver: ``nvmlInit`` fails with DRIVER_NOT_LOADED."""
    with _gpu_state(host_dir) as state:
        state["driver_loaded"] = bool(loaded)
    return f"driver {'loaded' if loaded else 'not loaded'}"


def ecc(
    host_dir: Path,
    gpu: int = 0,
    corrected: int = 0,
    uncorrected: int = 1,
    location: str = "dram",
    volatile: bool = True,
) -> str:
    """Add ECC errors at ``location``; aggregate counts always grow, volatile ones if ``volatile``."""
    with _gpu_state(host_dir) as state:
        g = _gpu(state, gpu)
        if location not in g["ecc"]["aggregate"]["corrected"]:
            known = ", ".join(g["ecc"]["aggregate"]["corrected"])
            raise LabError(f"location={location}: not on this GPU model (known: {known})")
        for counter in ("volatile", "aggregate") if volatile else ("aggregate",):
            g["ecc"][counter]["corrected"][location] += corrected
            g["ecc"][counter]["uncorrected"][location] += uncorrected
    return f"GPU {gpu}: +{corrected} corrected, +{uncorrected} uncorrected ECC errors ({location})"


def remap(
    host_dir: Path,
    gpu: int = 0,
    pending: bool = True,
    failure: bool = False,
    correctable: int = 0,
    uncorrectable: int = 1,
) -> str:
    """Row remapping (Ampere and later): add remapped rows, set pending / failure."""
    with _gpu_state(host_dir) as state:
        g = _gpu(state, gpu)
        rr = g.get("remapped_rows")
        if rr is None:
            raise LabError(f"{g['name']} has no row remapper (NVML returns NOT_SUPPORTED)")
        rr["correctable"] += correctable
        rr["uncorrectable"] += uncorrectable
        rr["pending"] = int(bool(pending))
        rr["failure"] = int(bool(failure))
        if failure and rr["hist_none"] == 0:
            rr["hist_none"], rr["hist_max"] = 1, max(0, rr["hist_max"] - 1)
    return f"GPU {gpu}: remapped rows +{correctable}/+{uncorrectable}, pending={pending}, failure={failure}"


def retired_pages(host_dir: Path, gpu: int = 0, sbe: int = 0, dbe: int = 1, pending: bool = True) -> str:
    """Retire pages (Volta and earlier; newer GPUs return NOT_SUPPORTED and refuse this fault)."""
    with _gpu_state(host_dir) as state:
        g = _gpu(state, gpu)
        rp = g.get("retired_pages")
        if rp is None:
            raise LabError(f"{g['name']} does not retire pages (NVML returns NOT_SUPPORTED); use the remap fault")
        for cause, n in (("sbe", sbe), ("dbe", dbe)):
            start = len(rp[cause])
            rp[cause] += [0x7F2C4A000 + 0x1000 * (start + i) + (0x100000 if cause == "dbe" else 0) for i in range(n)]
        rp["pending"] = int(bool(pending))
    return f"GPU {gpu}: retired +{sbe} SBE, +{dbe} DBE pages, pending={pending}"


def gpu_mem(host_dir: Path, gpu: int = 0, gib: float = 10.0, pid: int = 0) -> str:
    """A foreign compute process holding ``gib`` GiB on ``gpu`` (``pid`` 0 = one that does not exist)."""
    with _gpu_state(host_dir) as state:
        g = _gpu(state, gpu)
        mib = int(gib * 1024)
        used = g["memory_driver_used_mib"] + sum(p["used_mib"] for p in g["processes"])
        free = g["memory_total_mib"] - g["memory_reserved_mib"] - used
        if mib > free:
            raise LabError(f"gib={gib}: GPU {gpu} has only {free / 1024:.1f} GiB free")
        pid = pid or 3_900_000 + len(g["processes"])
        g["processes"].append({"pid": pid, "used_mib": mib, "foreign": True})
    return f"GPU {gpu}: process {pid} holds {mib} MiB"


def clocks(host_dir: Path, gpu: int = 0, reasons: str = "hw_slowdown,hw_thermal") -> str:
    """Set the clocks event (throttle) reasons: names joined by ',' or a number (0x48)."""
    try:
        mask = int(reasons, 0)
    except ValueError:
        mask = 0
        for r in filter(None, (x.strip() for x in reasons.split(","))):
            if r not in CLOCK_REASONS:
                raise LabError(f"reasons: unknown {r!r} (known: {', '.join(CLOCK_REASONS)})") from None
            mask |= CLOCK_REASONS[r]
    with _gpu_state(host_dir) as state:
        _gpu(state, gpu)["clocks_event_reasons"] = mask
    return f"GPU {gpu}: clocks event reasons 0x{mask:016x}"


def pcie(host_dir: Path, gpu: int = 0, width: int = 8, gen: int = 0, replays: int = 0) -> str:
    """Degrade the PCIe link to ``width`` lanes (and ``gen`` if given); add ``replays``."""
    with _gpu_state(host_dir) as state:
        g = _gpu(state, gpu)
        if not 1 <= width <= g["pcie_width_max"]:
            raise LabError(f"width={width}: must be 1..{g['pcie_width_max']}")
        g["pcie_width_cur"] = width
        if gen:
            if not 1 <= gen <= g["pcie_gen_max"]:
                raise LabError(f"gen={gen}: must be 1..{g['pcie_gen_max']}")
            g["pcie_gen_cur"] = gen
        g["pcie_replay"] += replays
    return f"GPU {gpu}: PCIe x{width} gen {g['pcie_gen_cur']}, replays {g['pcie_replay']}"


def nvlink(
    host_dir: Path,
    gpu: int = 0,
    link: int = 0,
    down: bool = True,
    replay: int = 0,
    recovery: int = 0,
    crc_flit: int = 0,
    crc_data: int = 0,
) -> str:
    """Take NVLink ``link`` down (or up) and add to its error counters (SXM parts only)."""
    with _gpu_state(host_dir) as state:
        g = _gpu(state, gpu)
        if g.get("nvlink_state") is None:
            raise LabError(f"{g['name']} has no NVLink (NVML returns NOT_SUPPORTED)")
        n = len(g["nvlink_state"])
        if not 0 <= link < n:
            raise LabError(f"link={link}: must be 0..{n - 1}")
        g["nvlink_state"][link] = 0 if down else 1
        for i, add in enumerate((replay, recovery, crc_flit, crc_data)):
            g["nvlink_errors"][link][i] += add
    return f"GPU {gpu}: NVLink {link} {'down' if down else 'up'}"


def temp(host_dir: Path, gpu: int = 0, celsius: int = 90, power_w: float = 0.0) -> str:
    """Set the GPU temperature (and power draw in W, when given)."""
    with _gpu_state(host_dir) as state:
        g = _gpu(state, gpu)
        g["temperature_c"] = celsius
        if power_w:
            g["power_mw"] = int(power_w * 1000)
    return f"GPU {gpu}: {celsius} C" + (f", {power_w} W" if power_w else "")


def persistence(host_dir: Path, gpu: int = -1) -> str:
    """Persistence mode off on GPU ``gpu`` (-1: all), as on a node whose nvidia-persistenced is not running."""
    with _gpu_state(host_dir) as state:
        targets = state["gpus"] if gpu == -1 else [_gpu(state, gpu)]
        for g in targets:
            g["persistence_mode"] = 0
    return "persistence mode off on " + ("every GPU" if gpu == -1 else f"GPU {gpu}")


# --------------------------------------------------------------- NIC faults


def pause_storm(
    host_dir: Path,
    nic: str = "eth2",
    priority: int = 3,
    per_s: float = 20000.0,
    paused: float = 0.9,
    direction: str = "rx",
) -> str:
    """PFC pause frames on ``priority``, ``per_s`` a second, pausing ``paused`` of each second.

    ``direction`` "rx": the switch pauses this host (``rx_prioN_pause`` and
    ``_duration`` in µs grow); "tx": this host pauses the switch and the
    NIC's stall watchdog counts ``tx_pause_storm_warning_events``.  ``per_s=0`` stops it.
    """
    if direction not in ("rx", "tx"):
        raise LabError(f"direction={direction}: must be rx or tx")
    if not 0.0 <= paused <= 1.0:
        raise LabError(f"paused={paused}: a fraction 0..1")
    p = _prio(priority)
    with _nic_state(host_dir) as state:
        n = _nic(state, nic)
        nicmodel.set_rate(n, f"{direction}_prio{p}_pause", per_s)
        nicmodel.set_rate(n, f"{direction}_prio{p}_pause_duration", paused * 1e6 if per_s else 0.0)
        if direction == "rx":
            nicmodel.set_rate(n, f"rx_prio{p}_pause_transition", per_s / 2)
        else:
            nicmodel.set_rate(n, "tx_pause_storm_warning_events", 0.2 if per_s and paused > 0.8 else 0.0)
        shown = bool(n["qos"]["pfc"][p])
    note = "" if shown else f" (PFC is off on priority {p}: ethtool will not show these counters)"
    return f"{nic}: {direction} pause storm on priority {p} at {per_s:g}/s{note}"


def cnp(host_dir: Path, nic: str = "eth2", per_s: float = 50000.0, handled: float = -1.0) -> str:
    """Congestion notification: ECN-marked RoCE packets received and CNPs sent, ``per_s`` a
    second; CNPs handled by this host's senders, ``handled`` a second (default 0.95 x per_s)."""
    handled = per_s * 0.95 if handled < 0 else handled
    with _nic_state(host_dir) as state:
        n = _nic(state, nic)
        nicmodel.set_rate(n, "np_ecn_marked_roce_packets", per_s * 1.03)
        nicmodel.set_rate(n, "np_cnp_sent", per_s)
        nicmodel.set_rate(n, "rp_cnp_handled", handled)
    return f"{nic}: CNP sent {per_s:g}/s, handled {handled:g}/s"


def discards(host_dir: Path, nic: str = "eth2", per_s: float = 100.0, priority: int = 3) -> str:
    """Receive drops on the lossless class and the transport retransmits they cause."""
    p = _prio(priority)
    with _nic_state(host_dir) as state:
        n = _nic(state, nic)
        for name in ("rx_discards_phy", f"rx_prio{p}_discards", f"rx_prio{p}_buf_discard"):
            nicmodel.set_rate(n, name, per_s)
        for name in ("out_of_sequence", "packet_seq_err", "duplicate_request"):
            nicmodel.set_rate(n, name, per_s / 10)
    return f"{nic}: {per_s:g} discards/s on priority {p}"


def link_flap(host_dir: Path, nic: str = "eth2", count: int = 1, period_s: float = 0.0, log: bool = True) -> str:
    """``count`` link flaps now (and one every ``period_s`` seconds after, if > 0)."""
    with _nic_state(host_dir) as state:
        n = _nic(state, nic)
        for name in ("link_down_events_phy", "link_downed"):
            nicmodel.add(n, name, count)
            nicmodel.set_rate(n, name, 1.0 / period_s if period_s > 0 else 0.0)
        pci = n.get("pci", "")
    if log and count:
        lines = []
        for _ in range(count):
            lines += [f"mlx5_core {pci} {nic}: Link down", f"mlx5_core {pci} {nic}: Link up"]
        kernlog.append(host_dir, _hostname(host_dir), lines)
    return f"{nic}: {count} link flap(s)" + (f", then one every {period_s:g} s" if period_s > 0 else "")


def link_down(host_dir: Path, nic: str = "eth2", down: bool = True) -> str:
    """Port down (or back up): sysfs state/operstate, ethtool and rdma link follow."""
    with _nic_state(host_dir) as state:
        n = _nic(state, nic)
        if down and n.get("link_up", True):
            nicmodel.add(n, "link_down_events_phy", 1)
            nicmodel.add(n, "link_downed", 1)
        n["link_up"] = not down
    return f"{nic}: link {'down' if down else 'up'}"


def qos_pfc(host_dir: Path, nic: str = "eth2", priority: int = 4) -> str:
    """PFC enabled on ``priority`` only (the RoCE class is 3 on a correct host)."""
    p = _prio(priority)
    with _nic_state(host_dir) as state:
        qos = _nic(state, nic)["qos"]
        qos["pfc"] = [1 if i == p else 0 for i in range(8)]
        qos["buffer"] = list(qos["pfc"])
    return f"{nic}: PFC on priority {p} only"


def qos_trust(host_dir: Path, nic: str = "eth2", trust: str = "pcp") -> str:
    """Set the priority trust state ("pcp" misclassifies untagged RoCEv2 into priority 0)."""
    if trust not in ("pcp", "dscp"):
        raise LabError(f"trust={trust}: must be pcp or dscp")
    with _nic_state(host_dir) as state:
        _nic(state, nic)["qos"]["trust"] = trust
    return f"{nic}: trust {trust}"


def qos_dscp(host_dir: Path, nic: str = "eth2", dscp: int = 26, priority: int = 0) -> str:
    """Map ``dscp`` to ``priority`` (RoCE's DSCP 26 belongs on the PFC priority 3)."""
    if not 0 <= dscp <= 63:
        raise LabError(f"dscp={dscp}: must be 0..63")
    p = _prio(priority)
    with _nic_state(host_dir) as state:
        _nic(state, nic)["qos"]["dscp2prio"][dscp] = p
    return f"{nic}: DSCP {dscp} -> priority {p}"


def qos_tos(host_dir: Path, nic: str = "eth2", tos: int = 0) -> str:
    """The RDMA-CM default ToS of the NIC's RDMA port (configfs ``default_roce_tos``; the kernel's
    default is 0, the profile's 106 = DSCP 26 << 2 | ECT(0))."""
    if not 0 <= tos <= 255:
        raise LabError(f"tos={tos}: must be 0..255")
    with _nic_state(host_dir) as state:
        n = _nic(state, nic)
        nicmodel.write_cm_tos(str(hw_dir(host_dir)), n["rdma_device"], int(n.get("port", 1)), tos)
    return f"{nic}: RDMA-CM default ToS {tos}"


def qos_global_pause(host_dir: Path, nic: str = "eth2", on: bool = True) -> str:
    """Turn 802.3x global pause on (its ``*_global_pause*`` counters appear in ethtool -S)."""
    with _nic_state(host_dir) as state:
        _nic(state, nic)["qos"]["global_pause"] = bool(on)
    return f"{nic}: global pause {'on' if on else 'off'}"


def counter(host_dir: Path, nic: str = "eth2", name: str = "", per_s: float = -1.0, add: int = 0) -> str:
    """Any counter: make it advance ``per_s`` a second (when >= 0) and/or ``add`` to it now."""
    if not name:
        raise LabError("name=: which counter (an ethtool -S or hw_counters name)")
    with _nic_state(host_dir) as state:
        n = _nic(state, nic)
        if add:
            nicmodel.add(n, name, add)
        if per_s >= 0:
            nicmodel.set_rate(n, name, per_s)
        value = nicmodel.value(n, name)
    return f"{nic}: {name} = {value}" + (f", {per_s:g}/s" if per_s >= 0 else "")


# --------------------------------------------------------------------- heal


def heal(host_dir: Path) -> str:
    """Healthy hardware again: GPUs as provisioned (keeping non-foreign processes), QoS
    correct, links up, counter rates back to the baseline (values never go back)."""
    rec = host_record(host_dir)
    hw = hw_dir(host_dir)
    profile = gpu_profile(rec["gpu_model"])
    fresh = gpustate.new_state(profile, rec["name"], rec["index"], rec["gpus"])
    try:
        old = gpustate.load(hw)
    except (OSError, ValueError):
        old = {"gpus": []}
    for g_new, g_old in zip(fresh["gpus"], old.get("gpus", [])):
        g_new["processes"] = [p for p in g_old.get("processes", []) if not p.get("foreign")]
    gpustate.save(hw, fresh)
    with _nic_state(host_dir) as state:
        for n in state["nics"].values():
            n["qos"] = nicmodel.default_qos()
            nicmodel.write_cm_tos(str(hw), n["rdma_device"], int(n.get("port", 1)), nicmodel.DEFAULT_CM_TOS)
            n["link_up"] = True
            for name in list(n.get("counters", {})):
                nicmodel.set_rate(n, name, nics.BASE_RATES.get(name, 0.0))
    return "hardware healed"


def _typed(fn: Callable[..., str]) -> Callable[..., str]:
    """Wrap a fault so options arriving as CLI strings/numbers get its defaults' types."""
    defaults = {p.name: p.default for p in list(inspect.signature(fn).parameters.values())[1:]}

    @functools.wraps(fn)
    def call(host_dir: Path, **options: Any) -> str:
        typed = {k: _coerce(fn.__name__, k, v, defaults[k]) if k in defaults else v for k, v in options.items()}
        return fn(Path(host_dir), **typed)

    return call


def _coerce(fault: str, key: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        return value if isinstance(value, bool) else _convert(fault, key, str(value), default)
    if isinstance(default, int) and not isinstance(value, bool):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value if isinstance(value, int) else _convert(fault, key, str(value), default)
    if isinstance(default, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(default, float):
        return _convert(fault, key, str(value), default)
    return str(value)


_RAW_FAULTS: dict[str, Callable[..., str]] = {
    "xid": xid,
    "oom": oom,
    "gpu-lost": gpu_lost,
    "gpu-hang": gpu_hang,
    "recovery": recovery,
    "fabric": fabric,
    "driver": driver,
    "ecc": ecc,
    "remap": remap,
    "retired-pages": retired_pages,
    "gpu-mem": gpu_mem,
    "clocks": clocks,
    "pcie": pcie,
    "nvlink": nvlink,
    "temp": temp,
    "persistence": persistence,
    "pause-storm": pause_storm,
    "cnp": cnp,
    "discards": discards,
    "link-flap": link_flap,
    "link-down": link_down,
    "qos-pfc": qos_pfc,
    "qos-trust": qos_trust,
    "qos-dscp": qos_dscp,
    "qos-tos": qos_tos,
    "qos-global-pause": qos_global_pause,
    "counter": counter,
}
FAULTS: dict[str, Callable[..., str]] = {k: _typed(f) for k, f in _RAW_FAULTS.items()}


def fault_options(fault: str) -> dict[str, Any]:
    """The options of ``fault`` and their defaults (raises LabError for an unknown fault)."""
    fn = _lookup(fault)
    params = list(inspect.signature(fn).parameters.values())[1:]
    return {p.name: p.default for p in params}


def _lookup(fault: str) -> Callable[..., str]:
    try:
        return FAULTS[fault]
    except KeyError:
        raise LabError(f"unknown fault {fault!r} (known: {', '.join(sorted(FAULTS))})") from None


def _convert(fault: str, key: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            low = raw.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if isinstance(default, int):
            return int(raw, 0)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        kind = type(default).__name__
        raise LabError(f"{fault}: {key}={raw!r} is not a valid {kind}") from None
    return raw


def parse_options(fault: str, pairs: list[str]) -> dict[str, Any]:
    """``["gpu=1", "code=48"]`` -> ``{"gpu": 1, "code": 48}``, typed by the fault's defaults."""
    known = fault_options(fault)
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or key not in known:
            names = ", ".join(known) or "none"
            raise LabError(f"{fault}: bad option {pair!r} (expected key=value; options: {names})")
        out[key] = _convert(fault, key, raw, known[key])
    return out


def inject(host_dir: Path, fault: str, **options: Any) -> str:
    """Apply ``fault`` with keyword ``options`` to the host; returns its summary."""
    fn = _lookup(fault)
    unknown = set(options) - set(fault_options(fault))
    if unknown:
        raise LabError(f"{fault}: unknown option(s) {', '.join(sorted(unknown))}")
    return fn(Path(host_dir), **options)
