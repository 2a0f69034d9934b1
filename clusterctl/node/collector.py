"""The clusterctl node-side collector: print one JSON document of node facts.

This file runs ON THE NODE, not in clusterctl: the control side sends it over
the SSH channel as ``python3 -I -B - [options]`` (see
``clusterctl.probe.payload``), so it must run on Python 3.8 or newer with the
standard library only.  ``pynvml`` is the node's own when it is installed and
new enough, else the copy the payload carries (the bootstrap hands it over as
the global ``CARRIED_PYNVML``, a function returning the module).

Output: exactly one JSON document on stdout, ``{"schema": 1, ...}``, described
field by field in ``docs/facts.md``.  Exit status 0 whenever that document was
written; anything that could not be read (a missing tool, library, file or
permission, a hung NVML call) is recorded in ``errors`` or in the section's
own ``reason``/``field_errors``, never raised.

The collector is read-only: it runs no command that changes state, writes no
file (the payload runs with ``-B``, so not even byte code) and reads the same
sources on the lab's hosts as on real nodes.

Filesystem readers take a ``root`` argument (default ``/``) so tests can point
them at fixture trees; the command line does not expose it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import queue
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Dict, List, Optional, Tuple

SCHEMA = 1

#: Default seconds one NVML call may take before it counts as hung.
NVML_CALL_TIMEOUT_S = 5.0
#: Default seconds all NVML calls together may take.
NVML_BUDGET_S = 60.0
#: Default seconds one command (systemctl, journalctl) or statvfs may take.
COMMAND_TIMEOUT_S = 10.0
#: Default number of kernel-log lines returned.
KERNEL_LOG_MAX_LINES = 2000

Errors = List[Dict[str, str]]


def note(errors: Errors, source: str, reason: str) -> None:
    """Record that ``source`` could not be read fully, and why."""
    errors.append({"source": source, "reason": reason})


def path_in(root: str, path: str) -> str:
    """``path`` (absolute, as on the node) under ``root``."""
    return os.path.join(root, path.lstrip("/"))


def read_text(path: str) -> str:
    """The stripped contents of a small text file; raises OSError."""
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        return f.read().strip()


def read_opt(path: str) -> Optional[str]:
    """Like :func:`read_text`, ``None`` when the file is missing or unreadable."""
    try:
        return read_text(path)
    except (OSError, ValueError):
        return None


def read_int(path: str) -> Optional[int]:
    """An integer file (decimal or 0x hex); ``None`` when unreadable or not a number."""
    text = read_opt(path)
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def os_error_reason(e: OSError) -> str:
    return "%s: %s" % (e.filename or "", e.strerror or e) if e.filename else str(e)


# --------------------------------------------------------------------------
# Timeouts: every call that can hang (NVML, statvfs on a dead NFS mount) runs
# on a worker thread and is waited for at most `timeout` seconds.


class CallTimeout(Exception):
    """A call did not return within its timeout; its worker thread is abandoned."""


class TimedCaller:
    """Runs calls on a daemon worker thread, waiting at most ``timeout`` s each.

    One worker serves calls one after another (cheap: no thread per call).  When
    a call times out its worker is left behind, stuck, and the next call gets a
    fresh worker.
    """

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._jobs: Optional[queue.Queue] = None

    def _start_worker(self) -> queue.Queue:
        jobs: queue.Queue = queue.Queue()

        def work() -> None:
            while True:
                fn, args, box, done = jobs.get()
                try:
                    box.append((True, fn(*args)))
                except BaseException as e:  # handed to the caller
                    box.append((False, e))
                done.set()

        threading.Thread(target=work, name="timed-call", daemon=True).start()
        return jobs

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; raises :class:`CallTimeout` after ``timeout`` seconds."""
        if self._jobs is None:
            self._jobs = self._start_worker()
        box: List[Tuple[bool, Any]] = []
        done = threading.Event()
        self._jobs.put((fn, args, box, done))
        if not done.wait(self.timeout):
            self._jobs = None
            raise CallTimeout()
        ok, value = box[0]
        if ok:
            return value
        raise value


# --------------------------------------------------------------------------
# Host: OS, kernel, CPU, memory, disks.


def parse_os_release(text: str) -> Dict[str, str]:
    """KEY=value lines of os-release(5), values unquoted as a shell would."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        try:
            words = shlex.split(value)
        except ValueError:
            words = [value]
        out[key.strip()] = " ".join(words)
    return out


def read_os_release(root: str = "/") -> Optional[Dict[str, str]]:
    for p in ("/etc/os-release", "/usr/lib/os-release"):
        text = read_opt(path_in(root, p))
        if text is not None:
            return parse_os_release(text)
    return None


MEMINFO_KEYS = {
    "MemTotal": "total",
    "MemFree": "free",
    "MemAvailable": "available",
    "Buffers": "buffers",
    "Cached": "cached",
    "SwapTotal": "swap_total",
    "SwapFree": "swap_free",
    "HugePages_Total": "hugepages_total",
    "HugePages_Free": "hugepages_free",
    "Hugepagesize": "hugepage_size",
}


def parse_meminfo(text: str) -> Dict[str, int]:
    """/proc/meminfo as bytes (``kB`` values times 1024; page counts as is)."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        name = MEMINFO_KEYS.get(key.strip())
        if name is None:
            continue
        parts = rest.split()
        try:
            value = int(parts[0])
        except (IndexError, ValueError):
            continue
        if len(parts) > 1 and parts[1].lower() == "kb":
            value *= 1024
        out[name] = value
    return out


def parse_cpuinfo(text: str) -> Dict[str, Any]:
    """Model name, logical CPU count and socket count from /proc/cpuinfo."""
    model = None
    count = 0
    sockets = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            count += 1
        elif key in ("model name", "Model", "cpu model") and model is None:
            model = value.strip()
        elif key == "physical id":
            sockets.add(value.strip())
    return {"model": model, "count": count or None, "sockets": len(sockets) or None}


#: Filesystem types that hold no data of their own.
PSEUDO_FS = frozenset(
    """
    autofs binfmt_misc bpf cgroup cgroup2 configfs debugfs devpts devtmpfs efivarfs
    fuse.gvfsd-fuse fusectl hugetlbfs mqueue nsfs proc pstore ramfs rpc_pipefs
    securityfs selinuxfs sysfs tracefs tmpfs squashfs nfsd
""".split()
)


def unescape_mount(field: str) -> str:
    """Undo the octal escapes of /proc/mounts (``\\040`` is a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> List[Dict[str, str]]:
    """Data-holding mounts from /proc/self/mounts (pseudo filesystems left out,
    except ``/dev/shm``, which NCCL uses), one entry per mount point."""
    out: List[Dict[str, str]] = []
    seen = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mount, fstype = unescape_mount(parts[0]), unescape_mount(parts[1]), parts[2]
        if (fstype in PSEUDO_FS and mount != "/dev/shm") or mount in seen:
            continue
        seen.add(mount)
        out.append({"device": device, "mount": mount, "fstype": fstype})
    return out


def disk_usage(mounts: List[Dict[str, str]], timeout: float, errors: Errors) -> List[Dict[str, Any]]:
    """statvfs of each mount, each call bounded by ``timeout`` seconds (a dead NFS
    server hangs statvfs).  Sizes in bytes."""
    caller = TimedCaller(timeout)
    out = []
    for m in mounts:
        entry: Dict[str, Any] = dict(
            m, total_bytes=None, free_bytes=None, avail_bytes=None, inodes_total=None, inodes_free=None
        )
        try:
            st = caller.call(os.statvfs, m["mount"])
        except CallTimeout:
            note(errors, "disks", "statvfs %s timed out after %g s" % (m["mount"], timeout))
        except OSError as e:
            note(errors, "disks", "statvfs %s: %s" % (m["mount"], e.strerror or e))
        else:
            entry.update(
                total_bytes=st.f_blocks * st.f_frsize,
                free_bytes=st.f_bfree * st.f_frsize,
                avail_bytes=st.f_bavail * st.f_frsize,
                inodes_total=st.f_files,
                inodes_free=st.f_ffree,
            )
        out.append(entry)
    return out


def collect_host(args: argparse.Namespace, errors: Errors, root: str = "/") -> Dict[str, Any]:
    """OS, kernel, boot id, uptime, CPU, memory, disks and Python of the node."""
    uname = os.uname()
    host: Dict[str, Any] = {
        "hostname": socket.gethostname(),
        "os_release": read_os_release(root),
        "kernel": {"release": uname.release, "version": uname.version, "machine": uname.machine},
        "boot_id": read_opt(path_in(root, "/proc/sys/kernel/random/boot_id")),
        "uptime_s": None,
        "cpu": None,
        "memory": None,
        "disks": None,
        "python": {"version": platform.python_version(), "executable": sys.executable},
    }
    if host["os_release"] is None:
        note(errors, "host.os_release", "neither /etc/os-release nor /usr/lib/os-release is readable")
    uptime = read_opt(path_in(root, "/proc/uptime"))
    if uptime:
        host["uptime_s"] = float(uptime.split()[0])
    cpuinfo = read_opt(path_in(root, "/proc/cpuinfo"))
    host["cpu"] = parse_cpuinfo(cpuinfo or "")
    if host["cpu"]["count"] is None:
        host["cpu"]["count"] = os.cpu_count()
    meminfo = read_opt(path_in(root, "/proc/meminfo"))
    if meminfo is None:
        note(errors, "host.memory", "/proc/meminfo is not readable")
    else:
        host["memory"] = parse_meminfo(meminfo)
    mounts = read_opt(path_in(root, "/proc/self/mounts"))
    if mounts is None:
        note(errors, "host.disks", "/proc/self/mounts is not readable")
    else:
        host["disks"] = disk_usage(parse_mounts(mounts), args.cmd_timeout, errors)
    return host


# --------------------------------------------------------------------------
# GPUs through NVML.

#: Clock event (throttle) reason bits, NVML ``nvmlClocksEventReason*``.
CLOCK_EVENT_REASONS = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
]

#: ``nvmlDeviceGetTopologyCommonAncestor`` levels, nearest first.
TOPOLOGY_LEVELS = {0: "INTERNAL", 10: "SINGLE", 20: "MULTIPLE", 30: "HOSTBRIDGE", 40: "NODE", 50: "SYSTEM"}

#: ``nvmlDeviceGetNvLinkErrorCounter`` counters.
NVLINK_COUNTERS = [(0, "replay"), (1, "recovery"), (2, "crc_flit"), (3, "crc_data")]

# NVML return codes (nvml.h), compared by value so an old pynvml works too.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15


class GpuLost(Exception):
    """NVML answered GPU_IS_LOST: the GPU fell off the bus or stopped answering."""


class NvmlHung(Exception):
    """An NVML call timed out; further calls on that GPU are skipped."""


class FieldUnavailable(Exception):
    """One field could not be read (not supported, no permission, an NVML error);
    the message is the reason, ``code`` the NVML return code when there is one."""

    def __init__(self, reason: str, code: Optional[int] = None):
        super().__init__(reason)
        self.code = code


def new_enough(nv: Any) -> bool:
    """Whether a pynvml module has every function the collector relies on."""
    return all(
        hasattr(nv, n)
        for n in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetNumaNodeId")
    )


def load_pynvml() -> Tuple[Any, Dict[str, Any]]:
    """The pynvml module to use and ``{origin, version, reason}`` about it.

    The node's own pynvml wins when it is new enough; else the carried copy; else
    an old node copy.  Returns ``(None, info)`` with the reason when there is none.
    """
    node = None
    reason = None
    try:
        import pynvml as node  # type: ignore[no-redef]
    except Exception as e:  # a broken install is as good as none
        reason = "no pynvml on the node (%s)" % e
    else:
        if new_enough(node):
            return node, {"origin": "node", "version": _dist_version("nvidia-ml-py"), "reason": None}
        reason = "the node's pynvml is too old"
    carried = globals().get("CARRIED_PYNVML")
    if carried is not None:
        sys.modules.pop("pynvml", None)
        return carried(), {"origin": "carried", "version": globals().get("CARRIED_PYNVML_VERSION"), "reason": None}
    if node is not None:
        return node, {"origin": "node", "version": _dist_version("nvidia-ml-py"), "reason": reason}
    return None, {"origin": None, "version": None, "reason": reason}


def _dist_version(name: str) -> Optional[str]:
    try:
        from importlib import metadata

        return metadata.version(name)
    except Exception:
        return None


def text(value: Any) -> str:
    """NVML strings come as bytes from old pynvml versions."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def nvml_error_code(e: BaseException) -> Optional[int]:
    value = getattr(e, "value", None)
    return value if isinstance(value, int) else None


def nvml_reason(e: BaseException) -> str:
    """A short reason for an NVML failure that does not stop the collection."""
    code = nvml_error_code(e)
    if code == NVML_ERROR_NOT_SUPPORTED:
        return "not supported"
    if code == NVML_ERROR_FUNCTION_NOT_FOUND or type(e).__name__ == "NVMLLibraryMismatchError":
        # pynvml >= 12 calls the newest versioned symbol, which older drivers lack
        return "not supported by this driver (function not found)"
    if code == NVML_ERROR_NO_PERMISSION:
        return "no permission"
    if isinstance(e, AttributeError):
        return "not available in this pynvml"
    return "NVML error: %s" % e


class Nvml:
    """pynvml calls under a timeout per call and a budget for all of them.

    ``call`` raises :class:`GpuLost`, :class:`NvmlHung` (the call timed out, or
    the budget is spent) or :class:`FieldUnavailable` (with the reason as
    message).  The caller stops asking about a GPU after GpuLost or NvmlHung.
    """

    def __init__(self, nv: Any, timeout: float, budget: float):
        self.nv = nv
        self.caller = TimedCaller(timeout)
        self.timeout = timeout
        self.deadline = time.monotonic() + budget
        self.hung = False
        self.timed_out: List[str] = []

    def call(self, name: str, *args: Any) -> Any:
        if time.monotonic() > self.deadline:
            raise NvmlHung("NVML budget spent; %s skipped" % name)
        fn = getattr(self.nv, name, None)
        if fn is None:
            raise FieldUnavailable("not available in this pynvml (%s)" % name)
        try:
            return self.caller.call(fn, *args)
        except CallTimeout:
            self.hung = True
            self.timed_out.append(name)
            raise NvmlHung("NVML call %s timed out after %g s" % (name, self.timeout))
        except Exception as e:
            if nvml_error_code(e) == NVML_ERROR_GPU_IS_LOST:
                raise GpuLost("%s: GPU is lost" % name)
            raise FieldUnavailable(nvml_reason(e), nvml_error_code(e))


def _memory(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    m = nvml.call("nvmlDeviceGetMemoryInfo", h)
    return {"memory_total": int(m.total), "memory_used": int(m.used), "memory_free": int(m.free)}


def process_owner(pid: int, root: str = "/") -> Dict[str, Any]:
    """Name (``comm``) and systemd unit (from the cgroup path) of a process, if visible."""
    comm = read_opt(path_in(root, "/proc/%d/comm" % pid))
    unit = None
    cgroup = read_opt(path_in(root, "/proc/%d/cgroup" % pid)) or ""
    for line in cgroup.splitlines():
        for part in reversed(line.rsplit(":", 1)[-1].split("/")):
            if part.endswith((".service", ".scope")):
                unit = part
                break
        if unit:
            break
    return {"name": comm, "unit": unit}


def _processes(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    procs = []
    try:
        found = nvml.call("nvmlDeviceGetComputeRunningProcesses", h)
    except FieldUnavailable as e:  # pynvml asks for _v3, which drivers before R510 lack
        if "function not found" not in str(e):
            raise
        found = nvml.call("nvmlDeviceGetComputeRunningProcesses_v2", h)
    for p in found:
        pid = int(p.pid)
        used = getattr(p, "usedGpuMemory", None)
        entry: Dict[str, Any] = {"pid": pid, "used_memory": int(used) if used is not None else None}
        entry.update(process_owner(pid))
        procs.append(entry)
    return {"processes": procs}


def _ecc(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    # nvmlDeviceGetTotalEccErrors(h, errorType 0=corrected 1=uncorrected, counterType 0=volatile 1=aggregate)
    out: Dict[str, Any] = {}
    for counter, ctype in (("volatile", 0), ("aggregate", 1)):
        out[counter] = {
            kind: get("ecc.%s.%s" % (counter, kind), "nvmlDeviceGetTotalEccErrors", h, etype, ctype)
            for kind, etype in (("corrected", 0), ("uncorrected", 1))
        }
    mode = get("ecc.mode", "nvmlDeviceGetEccMode", h)
    out["enabled"] = bool(mode[0]) if mode is not None else None
    out["pending_enabled"] = bool(mode[1]) if mode is not None else None
    return {"ecc": out}


def _remapped_rows(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    corr, unc, pending, failure = nvml.call("nvmlDeviceGetRemappedRows", h)[:4]
    return {
        "remapped_rows": {
            "correctable": int(corr),
            "uncorrectable": int(unc),
            "pending": bool(pending),
            "failure": bool(failure),
        }
    }


#: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and its values (nvml.h nvmlDeviceGpuRecoveryAction_t).
FI_GPU_RECOVERY_ACTION = 230
RECOVERY_ACTIONS = {0: "none", 1: "reset", 2: "reboot", 3: "drain_p2p", 4: "drain_and_reset"}


def _recovery_action(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    """What the driver says must happen to the GPU after an uncorrectable error (R550+);
    read from NVML, not the kernel log, whose XID 154 lines rotate away."""
    fv = nvml.call("nvmlDeviceGetFieldValues", h, [FI_GPU_RECOVERY_ACTION])[0]
    if int(fv.nvmlReturn) != 0:
        raise FieldUnavailable(
            "recovery action not supported (NVML return %d)" % int(fv.nvmlReturn), int(fv.nvmlReturn)
        )
    value = int(fv.value.uiVal)
    return {"recovery_action": RECOVERY_ACTIONS.get(value, "unknown_%d" % value)}


#: nvmlGpuFabricState_t (nvml.h).
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def _fabric(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    """The GPU's registration with the NVLink fabric (NVSwitch systems): ``nvmlDeviceGetGpuFabricInfo``.
    Not supported (a GPU without NVSwitch, a driver before R530) raises FieldUnavailable."""
    struct = getattr(nvml.nv, "c_nvmlGpuFabricInfo_t", None)
    if struct is None:
        raise FieldUnavailable("not available in this pynvml (nvmlDeviceGetGpuFabricInfo)")
    import ctypes

    info = struct()
    nvml.call("nvmlDeviceGetGpuFabricInfo", h, ctypes.byref(info))
    state = int(info.state) & 0xFF  # nvmlGpuFabricState_t is an unsigned char in nvml.h
    if state == 0:
        raise FieldUnavailable("not supported (no NVLink fabric)")
    return {
        "fabric": {
            "state": FABRIC_STATES.get(state, "unknown_%d" % state),
            "status": int(info.status),
            "clique_id": int(info.cliqueId),
        }
    }


def fabric_manager_state(timeout: float) -> Optional[Dict[str, Any]]:
    """``nvidia-fabricmanager.service`` as systemd sees it (``load_state``, ``active_state``,
    ``sub_state``); None when systemctl cannot answer."""
    try:
        rc, out, _ = run_command(
            ["systemctl", "show", "--no-pager", "-p", "LoadState,ActiveState,SubState", "nvidia-fabricmanager.service"],
            timeout,
        )
    except FileNotFoundError:
        return None
    if rc != 0:
        return None
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {
        "load_state": props.get("LoadState"),
        "active_state": props.get("ActiveState"),
        "sub_state": props.get("SubState"),
    }


def _retired_pages(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    # cause 0 = multiple single-bit ECC errors, 1 = double-bit ECC error
    sbe = nvml.call("nvmlDeviceGetRetiredPages", h, 0)
    dbe = nvml.call("nvmlDeviceGetRetiredPages", h, 1)
    pending = get("retired_pages.pending", "nvmlDeviceGetRetiredPagesPendingStatus", h)
    return {
        "retired_pages": {
            "single_bit_ecc": len(sbe),
            "double_bit_ecc": len(dbe),
            "pending": bool(pending) if pending is not None else None,
        }
    }


def decode_clock_reasons(mask: int) -> List[str]:
    """Names of the set bits of a clocks-event-reasons mask (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    if mask & ~known:
        names.append("0x%x" % (mask & ~known))
    return names


def _clocks(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    try:
        mask = nvml.call("nvmlDeviceGetCurrentClocksEventReasons", h)
    except FieldUnavailable:  # drivers before 535 know the old name only
        mask = nvml.call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    mask = int(mask)
    return {"clocks_event_reasons": {"mask": "0x%x" % mask, "active": decode_clock_reasons(mask)}}


def _pcie(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    return {
        "pcie": {
            "width": get("pcie.width", "nvmlDeviceGetCurrPcieLinkWidth", h),
            "max_width": get("pcie.max_width", "nvmlDeviceGetMaxPcieLinkWidth", h),
            "gen": get("pcie.gen", "nvmlDeviceGetCurrPcieLinkGeneration", h),
            "max_gen": get("pcie.max_gen", "nvmlDeviceGetMaxPcieLinkGeneration", h),
            "replay_counter": get("pcie.replay_counter", "nvmlDeviceGetPcieReplayCounter", h),
        }
    }


def _nvlink(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    """Every NVLink the GPU has: the list ends at the first link whose state NVML
    refuses (NOT_SUPPORTED, INVALID_ARGUMENT past the last link), so a PCIe GPU
    has ``[]``."""
    links = []
    for link in range(getattr(nvml.nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = nvml.call("nvmlDeviceGetNvLinkState", h, link)
        except FieldUnavailable:
            break
        errs = {
            name: get("nvlink.%d.%s" % (link, name), "nvmlDeviceGetNvLinkErrorCounter", h, link, c)
            for c, name in NVLINK_COUNTERS
        }
        links.append({"link": link, "state": "active" if state else "inactive", "errors": errs})
    return {"nvlink": links}


def _scalar(key: str, fn: str, convert: Callable[[Any], Any] = lambda v: v, *extra: Any):
    def getter(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
        return {key: convert(nvml.call(fn, h, *extra))}

    return getter


def _pci(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    bus_id = text(nvml.call("nvmlDeviceGetPciInfo", h).busId)
    return {"pci_bus_id": bus_id, "pci_address": normalize_pci(bus_id)}


def normalize_pci(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as sysfs writes it: ``0000:3b:00.0``."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    if rest and len(domain) > 4:
        domain = domain[-4:]
    return "%s:%s" % (domain, rest) if rest else bus_id


def _utilization(nvml: Nvml, h: Any, get: Callable[..., Any]) -> Dict[str, Any]:
    u = nvml.call("nvmlDeviceGetUtilizationRates", h)
    return {"utilization": {"gpu": int(u.gpu), "memory": int(u.memory)}}


#: (field-error key, keys it fills, getter) in collection order.
DEVICE_FIELDS: List[Tuple[str, Tuple[str, ...], Callable[..., Dict[str, Any]]]] = [
    ("name", ("name",), _scalar("name", "nvmlDeviceGetName", text)),
    ("uuid", ("uuid",), _scalar("uuid", "nvmlDeviceGetUUID", text)),
    ("pci_bus_id", ("pci_bus_id", "pci_address"), _pci),
    ("memory", ("memory_total", "memory_used", "memory_free"), _memory),
    ("processes", ("processes",), _processes),
    ("ecc", ("ecc",), _ecc),
    ("remapped_rows", ("remapped_rows",), _remapped_rows),
    ("retired_pages", ("retired_pages",), _retired_pages),
    ("recovery_action", ("recovery_action",), _recovery_action),
    ("fabric", ("fabric",), _fabric),
    ("clocks_event_reasons", ("clocks_event_reasons",), _clocks),
    ("pcie", ("pcie",), _pcie),
    ("nvlink", ("nvlink",), _nvlink),
    ("temperature_c", ("temperature_c",), _scalar("temperature_c", "nvmlDeviceGetTemperature", int, 0)),
    ("power_w", ("power_w",), _scalar("power_w", "nvmlDeviceGetPowerUsage", lambda mw: mw / 1000.0)),
    (
        "power_limit_w",
        ("power_limit_w",),
        _scalar("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", lambda mw: mw / 1000.0),
    ),
    ("utilization", ("utilization",), _utilization),
    ("persistence_mode", ("persistence_mode",), _scalar("persistence_mode", "nvmlDeviceGetPersistenceMode", bool)),
    ("vbios_version", ("vbios_version",), _scalar("vbios_version", "nvmlDeviceGetVbiosVersion", text)),
    ("numa_node", ("numa_node",), _scalar("numa_node", "nvmlDeviceGetNumaNodeId", int)),
]

#: Every key a device entry has, in order (the schema's stable key set).
DEVICE_KEYS = (
    ["index"] + [k for _, keys, _ in DEVICE_FIELDS for k in keys] + ["nearest_nics", "lost", "hung", "field_errors"]
)


def collect_device(nvml: Nvml, index: int, root: str = "/") -> Tuple[Dict[str, Any], Any]:
    """One GPU's entry and its NVML handle (``None`` when it could not be had).

    A field that cannot be read is ``null`` with its reason in ``field_errors``.
    A lost GPU (``lost``) or a hung NVML call (``hung``) stops this GPU's
    collection; its remaining fields stay ``null``.
    """
    dev: Dict[str, Any] = {k: None for k in DEVICE_KEYS}
    dev.update(index=index, lost=False, hung=False, field_errors={})
    errs = dev["field_errors"]

    def get(key: str, fn: str, *args: Any) -> Any:
        try:
            return nvml.call(fn, *args)
        except FieldUnavailable as e:
            errs[key] = str(e)
            return None

    try:
        handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
    except FieldUnavailable as e:
        errs["handle"] = str(e)
        return dev, None
    except (GpuLost, NvmlHung) as e:
        return _stopped(dev, e), None
    for key, _keys, getter in DEVICE_FIELDS:
        try:
            dev.update(getter(nvml, handle, get))
        except FieldUnavailable as e:
            errs[key] = str(e)
        except (GpuLost, NvmlHung) as e:
            return _stopped(dev, e), None
    if dev["numa_node"] is None and dev["pci_address"]:
        node = read_int(path_in(root, "/sys/bus/pci/devices/%s/numa_node" % dev["pci_address"]))
        if node is not None and node >= 0:
            dev["numa_node"] = node
            errs.pop("numa_node", None)
    return dev, handle


def _stopped(dev: Dict[str, Any], e: Exception) -> Dict[str, Any]:
    if isinstance(e, GpuLost):
        dev["lost"] = True
    else:
        dev["hung"] = True
    dev["field_errors"]["device"] = str(e)
    return dev


def collect_topology(nvml: Nvml, handles: Dict[int, Any]) -> List[Dict[str, Any]]:
    """The common PCIe ancestor of every GPU pair (NVML topology level names)."""
    out = []
    idx = sorted(handles)
    for n, a in enumerate(idx):
        for b in idx[n + 1 :]:
            entry: Dict[str, Any] = {"gpus": [a, b], "level": None, "reason": None}
            try:
                level = nvml.call("nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b])
                entry["level"] = TOPOLOGY_LEVELS.get(int(level), str(level))
            except (FieldUnavailable, GpuLost, NvmlHung) as e:
                entry["reason"] = str(e)
            out.append(entry)
    return out


def collect_gpus(args: argparse.Namespace, errors: Errors, root: str = "/") -> Dict[str, Any]:
    """Every GPU through NVML; ``available: false`` with a reason when NVML
    cannot be used (no pynvml, no libnvidia-ml, no driver, nvmlInit hung)."""
    gpus: Dict[str, Any] = {
        "available": False,
        "reason": None,
        "driver_version": None,
        "nvml_version": None,
        "cuda_driver_version": None,
        "pynvml": None,
        "count": None,
        "devices": [],
        "topology": [],
        "timed_out_calls": [],
        "fabric_manager": None,
    }
    nv, info = load_pynvml()
    gpus["pynvml"] = info
    if nv is None:
        gpus["reason"] = info["reason"]
        return gpus
    nvml = Nvml(nv, args.nvml_timeout, args.nvml_budget)
    try:
        nvml.call("nvmlInit")
    except (FieldUnavailable, NvmlHung, GpuLost) as e:
        gpus["reason"] = init_reason(e)
        gpus["timed_out_calls"] = nvml.timed_out
        return gpus
    gpus["available"] = True
    try:
        for key, fn, conv in (
            ("driver_version", "nvmlSystemGetDriverVersion", text),
            ("nvml_version", "nvmlSystemGetNVMLVersion", text),
            ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion", int),
        ):
            try:
                gpus[key] = conv(nvml.call(fn))
            except FieldUnavailable as e:
                note(errors, "gpus." + key, str(e))
        gpus["count"] = int(nvml.call("nvmlDeviceGetCount"))
    except FieldUnavailable as e:
        gpus["reason"] = "nvmlDeviceGetCount: %s" % e
        return gpus
    except (NvmlHung, GpuLost) as e:
        gpus["reason"] = str(e)
        gpus["timed_out_calls"] = nvml.timed_out
        return gpus
    handles: Dict[int, Any] = {}
    for i in range(gpus["count"]):
        dev, handle = collect_device(nvml, i, root)
        gpus["devices"].append(dev)
        if handle is not None:
            handles[i] = handle
    gpus["topology"] = collect_topology(nvml, handles)
    if any(d.get("fabric") for d in gpus["devices"]):  # an NVSwitch system: is its fabric manager running?
        gpus["fabric_manager"] = fabric_manager_state(args.cmd_timeout)
    gpus["timed_out_calls"] = nvml.timed_out
    if not nvml.hung:  # a shutdown would wait for the hung call's lock
        try:
            nvml.call("nvmlShutdown")
        except Exception:
            pass
    return gpus


def init_reason(e: BaseException) -> str:
    """Why nvmlInit failed, in words an operator acts on."""
    msg = str(e)
    if msg.startswith("NVML error: "):
        msg = msg[len("NVML error: ") :]
    code = getattr(e, "code", None)
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return "NVML library (libnvidia-ml.so.1) not found: %s" % msg
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return "NVIDIA driver not loaded: %s" % msg
    if isinstance(e, (NvmlHung, GpuLost)):
        return msg
    return "nvmlInit failed: %s" % msg


# --------------------------------------------------------------------------
# NICs and RDMA ports, from /sys/class/net and /sys/class/infiniband.


def parse_rate_gbps(rate: Optional[str]) -> Optional[float]:
    """``400 Gb/sec (4X NDR)`` -> 400.0."""
    m = re.match(r"\s*([0-9.]+)\s*Gb", rate or "")
    return float(m.group(1)) if m else None


def state_name(raw: Optional[str]) -> Optional[str]:
    """``4: ACTIVE`` -> ``ACTIVE``; ``5: LinkUp`` -> ``LinkUp``."""
    if raw is None:
        return None
    return raw.split(":", 1)[1].strip() if ":" in raw else raw.strip()


def read_counter_dir(path: str) -> Optional[Dict[str, int]]:
    """Every readable integer file of a counters directory; ``None`` if absent.
    Unreadable counters (EINVAL, EOPNOTSUPP) are left out: missing is not zero."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return None
    out = {}
    for name in names:
        value = read_int(os.path.join(path, name))
        if value is not None:
            out[name] = value
    return out


def read_gids(port_dir: str) -> List[Dict[str, Any]]:
    """Populated GID table entries (all-zero GIDs and unreadable ones skipped)."""
    out: List[Dict[str, Any]] = []
    gid_dir = os.path.join(port_dir, "gids")
    try:
        indexes = sorted(int(n) for n in os.listdir(gid_dir) if n.isdigit())
    except OSError:
        return out
    for i in indexes:
        gid = read_opt(os.path.join(gid_dir, str(i)))
        if not gid or set(gid.replace(":", "")) <= {"0"}:
            continue
        out.append(
            {
                "index": i,
                "gid": gid,
                "type": read_opt(os.path.join(port_dir, "gid_attrs", "types", str(i))),
                "netdev": read_opt(os.path.join(port_dir, "gid_attrs", "ndevs", str(i))),
            }
        )
    return out


def collect_rdma(root: str = "/") -> List[Dict[str, Any]]:
    """One entry per port of every device in /sys/class/infiniband."""
    base = path_in(root, "/sys/class/infiniband")
    out: List[Dict[str, Any]] = []
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return out
    for dev in devices:
        ports_dir = os.path.join(base, dev, "ports")
        try:
            ports = sorted((int(p) for p in os.listdir(ports_dir) if p.isdigit()))
        except OSError:
            continue
        for port in ports:
            pd = os.path.join(ports_dir, str(port))
            rate = read_opt(os.path.join(pd, "rate"))
            gids = read_gids(pd)
            netdevs = sorted({g["netdev"] for g in gids if g["netdev"]})
            out.append(
                {
                    "device": dev,
                    "port": port,
                    "netdev": netdevs[0] if netdevs else None,
                    "state": state_name(read_opt(os.path.join(pd, "state"))),
                    "phys_state": state_name(read_opt(os.path.join(pd, "phys_state"))),
                    "link_layer": read_opt(os.path.join(pd, "link_layer")),
                    "rate": rate,
                    "rate_gbps": parse_rate_gbps(rate),
                    "fw_ver": read_opt(os.path.join(base, dev, "fw_ver")),
                    "counters": read_counter_dir(os.path.join(pd, "counters")),
                    "hw_counters": read_counter_dir(os.path.join(pd, "hw_counters")),
                    "gids": gids,
                }
            )
    return out


def device_rdma_names(net_dir: str) -> List[str]:
    """RDMA devices the NIC's PCI function exposes (``device/infiniband/*``)."""
    try:
        return sorted(os.listdir(os.path.join(net_dir, "device", "infiniband")))
    except OSError:
        return []


def read_nic(net_dir: str, name: str) -> Dict[str, Any]:
    """One netdev from /sys/class/net/<name>: link, addresses and byte counters."""
    speed = read_int(os.path.join(net_dir, "speed"))  # EINVAL while the link is down
    numa = read_int(os.path.join(net_dir, "device", "numa_node"))
    device_link = os.path.join(net_dir, "device")
    pci = os.path.basename(os.path.realpath(device_link)) if os.path.exists(device_link) else None
    stats = os.path.join(net_dir, "statistics")
    nic: Dict[str, Any] = {
        "netdev": name,
        "operstate": read_opt(os.path.join(net_dir, "operstate")),
        "speed_mbps": speed if speed is not None and speed >= 0 else None,
        "mtu": read_int(os.path.join(net_dir, "mtu")),
        "address": read_opt(os.path.join(net_dir, "address")),
        "numa_node": numa if numa is not None and numa >= 0 else None,
        "pci_address": pci if pci and re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:", pci) else None,
        "driver": None,
        "rx_bytes": read_int(os.path.join(stats, "rx_bytes")),
        "tx_bytes": read_int(os.path.join(stats, "tx_bytes")),
        "rx_errors": read_int(os.path.join(stats, "rx_errors")),
        "tx_errors": read_int(os.path.join(stats, "tx_errors")),
        "rx_dropped": read_int(os.path.join(stats, "rx_dropped")),
        "tx_dropped": read_int(os.path.join(stats, "tx_dropped")),
        "rdma": None,
        "ethtool_stats": None,
        "ethtool_stats_reason": None,
        "qos": None,
        "samples": None,
    }
    driver = os.path.join(net_dir, "device", "driver")
    if os.path.islink(driver):
        nic["driver"] = os.path.basename(os.readlink(driver))
    return nic


def collect_nics(errors: Errors, root: str = "/") -> List[Dict[str, Any]]:
    """Every netdev but ``lo``, each with its RDMA port (matched by the port's
    GID netdevs, else by the PCI function's RDMA device), then RDMA ports that
    match no netdev, with ``netdev: null``."""
    base = path_in(root, "/sys/class/net")
    try:
        names = sorted(os.listdir(base))
    except OSError as e:
        note(errors, "nics", "cannot list /sys/class/net: %s" % (e.strerror or e))
        names = []
    ports = collect_rdma(root)
    used = set()
    nics = []
    for name in names:
        if name == "lo":
            continue
        nic = read_nic(os.path.join(base, name), name)
        match = [p for p in ports if p["netdev"] == name]
        if not match:
            devs = device_rdma_names(os.path.join(base, name))
            match = [p for p in ports if p["device"] in devs and p["netdev"] is None]
        if match:
            nic["rdma"] = match[0]
            used.add((match[0]["device"], match[0]["port"]))
        nics.append(nic)
    for p in ports:
        if (p["device"], p["port"]) not in used:
            orphan: Dict[str, Any] = {k: None for k in read_nic_keys()}
            orphan["rdma"] = p
            nics.append(orphan)
    return nics


def read_nic_keys() -> List[str]:
    return [
        "netdev",
        "operstate",
        "speed_mbps",
        "mtu",
        "address",
        "numa_node",
        "pci_address",
        "driver",
        "rx_bytes",
        "tx_bytes",
        "rx_errors",
        "tx_errors",
        "rx_dropped",
        "tx_dropped",
        "rdma",
        "ethtool_stats",
        "ethtool_stats_reason",
        "qos",
        "samples",
    ]


# --------------------------------------------------------------------------
# Driver statistics: `ethtool -S IF`.  PFC pause counters, physical-port
# discards and errors of a ConnectX port exist only there (mlx5 prints
# `rx_prio3_pause`, `rx_discards_phy`, ... in no sysfs file).

#: Per-queue counters, left out: ``ch3_events``, ``rx12_packets``, ``tx0_xdp_xmit``
#: (mlx5), ``rx_queue_0_bytes`` (ice, virtio), ``[0]: rx_ucast_packets`` (bnxt).
#: The port-wide sums carry the same information, and a NIC with 64 channels
#: prints thousands of them (about 100 KB of JSON per NIC).
PER_QUEUE_COUNTER = re.compile(r"^(?:(?:ch|rx|tx)\d+_|(?:rx|tx)_queue_\d+_|\[\d+\])")
#: Most ``ethtool -S`` processes running at once.
ETHTOOL_WORKERS = 8


def parse_ethtool_stats(text: str) -> Dict[str, int]:
    """The counters of ``ethtool -S IF`` output, by name.

    The format is ``NIC statistics:`` and then one ``     name: value`` line
    per counter (ethtool's ``do_gstats``: the name, ``": "``, an unsigned
    decimal).  Lines are matched by name, never by position: the driver's set
    of counters differs by NIC, firmware and configuration (mlx5 prints
    ``rx_prioN_pause`` only for PFC-enabled priorities).  Per-queue counters
    (:data:`PER_QUEUE_COUNTER`) and lines whose value is not an unsigned integer
    are left out (never read as 0); a name printed twice keeps its first value.
    """
    out: Dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().rpartition(": ")
        value = value.strip()
        if not sep or not name or not (value.isascii() and value.isdigit()) or PER_QUEUE_COUNTER.match(name):
            continue
        out.setdefault(name, int(value))
    return out


#: Where administration tools live, searched after PATH: an SSH session of a
#: user other than root gets a PATH without them (Debian: /usr/bin:/bin only).
SBIN_DIRS = "/usr/local/sbin:/usr/sbin:/sbin"


def find_program(name: str) -> str:
    """``name``'s path on PATH, else in :data:`SBIN_DIRS`; ``name`` itself when
    neither has it (running it then raises FileNotFoundError)."""
    return shutil.which(name) or shutil.which(name, path=SBIN_DIRS) or name


def ethtool_stats(netdev: str, timeout: float) -> Tuple[Optional[Dict[str, int]], Optional[str]]:
    """Run ``ethtool -S netdev`` (at most ``timeout`` seconds); ``(counters, None)``
    or ``(None, reason)``: ethtool missing, a non-zero exit with ethtool's own
    message (``Operation not supported``, ``no stats available``, a permission
    error) or a timeout.  The counters are ``{}`` when the driver has only
    per-queue ones (virtio_net)."""
    try:
        rc, out, err = run_command([find_program("ethtool"), "-S", netdev], timeout)
    except FileNotFoundError:
        return None, "ethtool not found"
    except OSError as e:
        return None, "cannot run ethtool: %s" % (e.strerror or e)
    if rc is None:
        return None, "ethtool -S timed out after %g s" % timeout
    if rc != 0:
        said = "; ".join(x.strip() for x in (err or out).splitlines() if x.strip())[:300]
        return None, "ethtool -S failed (rc %d)%s" % (rc, ": " + said if said else "")
    return parse_ethtool_stats(out), None


def wants_ethtool(nic: Dict[str, Any], root: str = "/") -> Optional[str]:
    """``None`` when the NIC's driver statistics are to be read, else why not.

    Asked: netdevs with a device behind them (``/sys/class/net/IF/device``: a
    PCI function, a virtio device...) and netdevs with an RDMA port.  Not
    asked: virtual interfaces (bridge, bond, VLAN, veth, ifb: no ``device``),
    whose pause and physical-port counters are on the port below them, so
    that a node with many of them does not pay one process each.
    """
    if not nic.get("netdev"):
        return "no netdev to ask ethtool about"
    if nic.get("rdma") is None and not os.path.exists(path_in(root, "/sys/class/net/%s/device" % nic["netdev"])):
        return "not read: virtual interface (no device behind it, no RDMA port)"
    return None


def collect_ethtool_stats(nics: List[Dict[str, Any]], timeout: float, errors: Errors, root: str = "/") -> None:
    """Fill ``ethtool_stats`` (or ``ethtool_stats_reason``) of every NIC; each
    reason of a NIC that was asked and did not answer is also noted in
    ``errors`` once, with the NICs it concerns (``ethtool not found (eth2, eth3)``).

    One ``ethtool -S`` per NIC that :func:`wants_ethtool`, up to
    :data:`ETHTOOL_WORKERS` at once, each given ``timeout`` seconds; all of
    them together get ``2 * timeout``.  A call still running then (ethtool
    stuck in the kernel, e.g. on a firmware command of a wedged NIC, does not
    die when killed) is abandoned on its daemon thread and recorded.
    """
    todo: "queue.Queue[Dict[str, Any]]" = queue.Queue()
    for nic in nics:
        reason = wants_ethtool(nic, root)
        if reason:
            nic["ethtool_stats_reason"] = reason
        else:
            todo.put(nic)
    pending = todo.qsize()
    if not pending:
        return
    finished = threading.Semaphore(0)
    results: Dict[int, Tuple[Optional[Dict[str, int]], Optional[str]]] = {}

    def work() -> None:
        while True:
            try:
                nic = todo.get_nowait()
            except queue.Empty:
                return
            results[id(nic)] = ethtool_stats(nic["netdev"], timeout)
            finished.release()

    for _ in range(min(ETHTOOL_WORKERS, pending)):
        threading.Thread(target=work, name="ethtool", daemon=True).start()
    deadline = time.monotonic() + 2 * timeout
    for _ in range(pending):
        if not finished.acquire(timeout=max(0.0, deadline - time.monotonic())):
            break
    failed: Dict[str, List[str]] = {}
    for nic in nics:
        if nic.get("ethtool_stats_reason") is None:
            stats, reason = results.get(
                id(nic),
                (
                    None,
                    "ethtool -S did not finish within %g s, the "
                    "time all ethtool calls together may take" % (2 * timeout),
                ),
            )
            nic["ethtool_stats"], nic["ethtool_stats_reason"] = stats, reason
            if reason:
                failed.setdefault(reason, []).append(nic["netdev"])
    for reason, names in failed.items():
        note(errors, "nics.ethtool_stats", "%s (%s)" % (reason, ", ".join(names)))


# --------------------------------------------------------------------------
# RoCE QoS configuration of each RDMA NIC on Ethernet: trust mode, PFC
# priorities, DSCP -> priority map, ECN enables, RoCE traffic class, global
# pause.  `mlnx_qos -i IF` where NVIDIA's tools are installed, else iproute2
# `dcb`; every output is parsed by the names it prints, never by position,
# and kept verbatim in `raw`.  A tool that is missing or fails is a reason.


def roce_nics(nics: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """NICs with a netdev and an RDMA port on Ethernet (RoCE)."""
    return [
        n
        for n in nics
        if n.get("netdev") and n.get("rdma") and (n["rdma"].get("link_layer") or "Ethernet") == "Ethernet"
    ]


def _csv_ints(text: str) -> List[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def parse_mlnx_qos(text: str) -> Dict[str, Any]:
    """``mlnx_qos -i IF`` (mlnx-tools ``pretty_print()``) by its line labels.

    Returns ``dcbx`` (``os``/``firmware``), ``trust``, ``dscp2prio`` (DSCP as a
    string -> priority; only with trust dscp; lists may be ascending,
    descending or wrapped over several ``prio:N`` lines), ``buffer_size``
    (bytes per buffer), ``cable_len``, ``pfc_enabled`` (priorities),
    ``prio2buffer``, ``prio2tc``, ``tc_tsa`` and ``lldpad_warning``.  A line
    that is not there leaves its key ``None``.
    """
    out: Dict[str, Any] = {
        "dcbx": None,
        "trust": None,
        "dscp2prio": None,
        "buffer_size": None,
        "cable_len": None,
        "pfc_enabled": None,
        "prio2buffer": None,
        "prio2tc": None,
        "tc_tsa": None,
        "lldpad_warning": "lldpad" in text,
    }
    header: List[int] = []
    tc: Optional[int] = None
    for raw in text.splitlines():
        line = raw.strip()
        low = line.lower()
        if low.startswith("dcbx mode:"):
            out["dcbx"] = (
                "firmware"
                if "firmware" in low
                else "os"
                if "os" in low.split(":", 1)[1]
                else line.split(":", 1)[1].strip()
            )
        elif low.startswith("priority trust state:"):
            out["trust"] = line.split(":", 1)[1].strip().lower() or None
        elif low.startswith("prio:") and "dscp:" in low:
            m = re.match(r"prio:\s*(\d+)\s+dscp:(.*)$", line)
            if m:
                d2p = out["dscp2prio"] = out["dscp2prio"] or {}
                for d in _csv_ints(m.group(2)):
                    d2p[str(d)] = int(m.group(1))
        elif low.startswith("receive buffer size"):
            sizes = line.split(":", 1)[1].split("max_buffer_size")[0]
            out["buffer_size"] = _csv_ints(sizes)
        elif low.startswith("cable len:"):
            nums = _csv_ints(line.split(":", 1)[1])
            out["cable_len"] = nums[0] if nums else None
        elif low.startswith("priority ") and not low.startswith("priority trust"):
            header = _csv_ints(line)
        elif (low.startswith("enabled ") or low.startswith("buffer ")) and header:
            vals = _csv_ints(line)
            row = dict(zip(header, vals))
            if low.startswith("enabled"):
                out["pfc_enabled"] = sorted(p for p, v in row.items() if v)
            else:
                out["prio2buffer"] = [row.get(p) for p in range(8)]
        elif low.startswith("tc:"):
            m = re.match(r"tc:\s*(\d+)", line)
            tc = int(m.group(1)) if m else None
            m = re.search(r"tsa:\s*([a-z]+)", low)
            if tc is not None and m:
                out["tc_tsa"] = out["tc_tsa"] or {}
                out["tc_tsa"][str(tc)] = m.group(1)
        elif low.startswith("priority:") and tc is not None:
            p2t = out["prio2tc"] = out["prio2tc"] or [None] * 8
            for p in _csv_ints(line):
                if 0 <= p < 8:
                    p2t[p] = tc
    return out


def parse_dcb_pfc(text: str) -> Optional[List[int]]:
    """PFC-enabled priorities from ``dcb pfc show dev IF`` (``prio-pfc 0:off ... 3:on``)."""
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "prio-pfc":
            return sorted(int(k) for k, _, v in (w.partition(":") for w in words[1:]) if k.isdigit() and v == "on")
    return None


def parse_dcb_app_dscp(text: str) -> Dict[str, int]:
    """DSCP -> priority from ``dcb -N app show dev IF`` (``dscp-prio 0:0 ... 26:3``)."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "dscp-prio":
            for w in words[1:]:
                k, _, v = w.partition(":")
                if k.isdigit() and v.isdigit():
                    out[k] = int(v)
    return out


def parse_dcb_apptrust(text: str) -> Optional[str]:
    """The first selector of ``dcb apptrust show dev IF`` (``order: dscp pcp``), as trust."""
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "order:":
            return words[1] if len(words) > 1 else None
    return None


def parse_ethtool_pause(text: str) -> Optional[Dict[str, Optional[bool]]]:
    """802.3x global pause from ``ethtool -a IF``: ``{autoneg, rx, tx}`` (booleans)."""
    out: Dict[str, Optional[bool]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and key in ("autonegotiate", "rx", "tx"):
            out["autoneg" if key == "autonegotiate" else key] = value.strip().lower() == "on"
    return out or None


def read_ecn(net_dir: str) -> Optional[Dict[str, Any]]:
    """MLNX_OFED ECN knobs under ``/sys/class/net/IF/ecn``: ``roce_np`` and
    ``roce_rp`` enables per priority, ``cnp_dscp``, ``cnp_802p_prio``
    (parameters directly under ``roce_np/`` or under ``roce_np/params/``).
    ``None`` when the directory does not exist (inbox driver).  The files are
    read as ``grep . ecn/...`` would print them and parsed by
    :func:`parse_ecn_dump`, the function ``doctor --from`` uses on such a dump."""
    base = os.path.join(net_dir, "ecn")
    if not os.path.isdir(base):
        return None
    lines = []
    listed = []
    for side in ("roce_np", "roce_rp"):
        enable = os.path.join(base, side, "enable")
        try:
            prios = sorted(int(p) for p in os.listdir(enable) if p.isdigit())
        except OSError:
            continue
        listed.append(side)
        for p in prios:
            lines.append("ecn/%s/enable/%d:%s" % (side, p, (read_opt(os.path.join(enable, str(p))) or "").strip()))
    for key in ("cnp_dscp", "cnp_802p_prio"):
        for rel in ("roce_np/", "roce_np/params/"):
            v = read_opt(os.path.join(base, rel + key))
            if v is not None:
                lines.append("ecn/%s%s:%s" % (rel, key, v.strip()))
    out = parse_ecn_dump("\n".join(lines)) or {
        "roce_np": None,
        "roce_rp": None,
        "cnp_dscp": None,
        "cnp_802p_prio": None,
    }
    for side in listed:
        if out[side] is None:
            out[side] = {}
    return out


def parse_traffic_class(text: Optional[str]) -> Tuple[Optional[int], Optional[str]]:
    """The content of ``DEV/tc/PORT/traffic_class`` (``Global tclass=106``): ``(value, None)``
    or ``(None, "not set")``."""
    m = re.search(r"Global tclass=(\d+)", text or "")
    return (int(m.group(1)), None) if m else (None, "not set")


def read_traffic_class(root: str, device: str, port: int) -> Tuple[Optional[int], Optional[str]]:
    """MLNX_OFED's global RoCE traffic class (``Global tclass=106``) of ``DEV/tc/PORT``:
    ``(value, None)``, or ``(None, why)``: file absent (inbox driver) or empty (not set)."""
    path = path_in(root, "/sys/class/infiniband/%s/tc/%d/traffic_class" % (device, port))
    if not os.path.exists(path):
        return None, "no %s (not an MLNX_OFED/DOCA driver)" % path.replace(root.rstrip("/"), "", 1)
    return parse_traffic_class(read_opt(path))


CM_TOS = "/sys/kernel/config/rdma_cm"


def read_cm_tos(root: str, device: str, port: int) -> Tuple[Optional[int], Optional[str]]:
    """The RDMA-CM default RoCE ToS of ``DEV`` port ``PORT`` (configfs
    ``rdma_cm/DEV/ports/PORT/default_roce_tos``, 0-255, the kernel prints ``%u``):
    ``(value, None)`` or ``(None, why)``.  The ``DEV`` directory exists only once someone
    made it: as NVIDIA's lshca does, it is made, read and removed again (root only; the
    value lives in the kernel's device, not in the directory)."""
    base = path_in(root, CM_TOS)
    shown = CM_TOS + "/" + device
    if not os.path.isdir(base):
        return None, "no %s (configfs not mounted or the rdma_cm module not loaded)" % CM_TOS
    dev_dir = os.path.join(base, device)
    made = False
    if not os.path.isdir(dev_dir):
        try:
            os.mkdir(dev_dir)
            made = True
        except OSError as e:
            return None, "cannot create %s: %s" % (shown, e.strerror or e)
    try:
        text = read_opt(os.path.join(dev_dir, "ports", str(port), "default_roce_tos"))
    finally:
        if made:
            try:
                os.rmdir(dev_dir)
            except OSError:
                pass
    if text is None:
        return None, "no %s/ports/%d/default_roce_tos" % (shown, port)
    try:
        value = int(text.split()[0])
    except (ValueError, IndexError):
        return None, "%s/ports/%d/default_roce_tos reads %r" % (shown, port, text[:40])
    return value, None


def parse_ecn_dump(text: str) -> Optional[Dict[str, Any]]:
    """The ECN knobs as ``grep . /sys/class/net/IF/ecn/*/*/*`` (or ``grep -r . ecn/``) prints them,
    one ``PATH:VALUE`` a line, in :func:`read_ecn`'s shape; ``None`` when no line is about ECN."""
    out = {"roce_np": None, "roce_rp": None, "cnp_dscp": None, "cnp_802p_prio": None}  # type: Dict[str, Any]
    seen = False
    for line in text.splitlines():
        path, sep, value = line.strip().rpartition(":")
        value = value.strip()
        if not sep or "ecn/" not in path or not (value.isascii() and value.lstrip("-").isdigit()):
            continue
        parts = path.split("ecn/", 1)[1].split("/")
        seen = True
        if len(parts) >= 3 and parts[0] in ("roce_np", "roce_rp") and parts[1] == "enable" and parts[2].isdigit():
            side = out[parts[0]] = out[parts[0]] or {}
            side[parts[2]] = int(value)
        elif parts[-1] in ("cnp_dscp", "cnp_802p_prio") and parts[0] == "roce_np" and out[parts[-1]] is None:
            out[parts[-1]] = int(value)
    return out if seen else None


def parse_dcb_ets(text: str) -> Optional[List[Optional[int]]]:
    """Priority -> traffic class from ``dcb ets show dev IF`` (``prio-tc 0:0 1:0 ... 3:3``)."""
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "prio-tc":
            p2t = [None] * 8  # type: List[Optional[int]]
            for w in words[1:]:
                k, _, v = w.partition(":")
                if k.isdigit() and v.isdigit() and int(k) < 8:
                    p2t[int(k)] = int(v)
            return p2t
    return None


def parse_ibdev2netdev(text: str) -> List[Dict[str, Any]]:
    """``ibdev2netdev`` lines (``mlx5_0 port 1 ==> eth2 (Up)``): device, port, netdev, state."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^\s*(\S+) port (\d+) ==> (\S+) \((\w+)\)", line)
        if m:
            out.append({"device": m.group(1), "port": int(m.group(2)), "netdev": m.group(3), "state": m.group(4)})
    return out


def parse_show_gids(text: str) -> List[Dict[str, Any]]:
    """MLNX_OFED ``show_gids`` rows (``DEV PORT INDEX GID IPv4 VER DEV``) as GID entries of
    :func:`read_gids`' shape, plus ``device`` and ``port``."""
    out = []
    for line in text.splitlines():
        w = line.split()
        if len(w) >= 6 and w[1].isdigit() and w[2].isdigit() and ":" in w[3]:
            ver = w[-2] if len(w) >= 7 else w[4]
            out.append(
                {
                    "device": w[0],
                    "port": int(w[1]),
                    "index": int(w[2]),
                    "gid": w[3],
                    "type": "RoCE v2" if ver.lower() == "v2" else "IB/RoCE v1" if ver.lower() == "v1" else ver,
                    "netdev": w[-1],
                }
            )
    return out


def parse_rdma_statistic(text: str) -> Dict[Tuple[str, int], Dict[str, int]]:
    """``rdma statistic show`` (text) or ``rdma -j statistic show`` (JSON): (device, port) -> the
    port's hw counters by name (the same names as ``ports/P/hw_counters``)."""
    out = {}  # type: Dict[Tuple[str, int], Dict[str, int]]
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            doc = json.loads(stripped)
        except ValueError:
            return out
        for entry in doc if isinstance(doc, list) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("ifname"), str):
                continue
            try:
                port = int(entry.get("port") or 1)
            except (TypeError, ValueError):
                continue
            counters = {
                k: int(v)
                for k, v in entry.items()
                if isinstance(v, int) and not isinstance(v, bool) and k not in ("ifindex", "port")
            }
            out[(entry["ifname"], port)] = counters
        return out
    current = None  # type: Optional[Dict[str, int]]
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "link" and "/" in words[1]:
            dev, _, port_text = words[1].partition("/")
            current = out.setdefault((dev, int(port_text) if port_text.isdigit() else 1), {})
            words = words[2:]
        if current is None:
            continue
        for name, value in zip(words[::2], words[1::2]):
            if value.isascii() and value.isdigit():
                current[name] = int(value)
    return out


def _tool(
    argv: List[str], timeout: float, raw: Dict[str, str], reasons: Dict[str, str], deadline: Optional[float] = None
) -> Optional[str]:
    """Run a read-only tool; its stdout (kept in ``raw``), or ``None`` with the reason.

    Not run once another tool timed out on the same NIC (``reasons`` says so:
    a wedged NIC hangs them all) or past ``deadline`` (monotonic seconds)."""
    label = " ".join(argv)
    if any(v.startswith("timed out") for v in reasons.values()):
        reasons[label] = "skipped: an earlier QoS tool timed out on this NIC"
        return None
    if deadline is not None:
        timeout = min(timeout, deadline - time.monotonic())
        if timeout <= 0:
            reasons[label] = "skipped: the QoS tools of all NICs ran out of time"
            return None
    try:
        rc, out, err = run_command([find_program(argv[0])] + argv[1:], timeout)
    except FileNotFoundError:
        reasons[label] = "%s not installed" % argv[0]
        return None
    except OSError as e:
        reasons[label] = "cannot run %s: %s" % (argv[0], e.strerror or e)
        return None
    if rc is None:
        reasons[label] = "timed out after %g s" % timeout
        return None
    if rc != 0:
        said = "; ".join(x.strip() for x in (err or out).splitlines() if x.strip())[:300]
        reasons[label] = "failed (rc %d)%s" % (rc, ": " + said if said else "")
        return None
    raw[label] = out
    return out


def empty_qos() -> Dict[str, Any]:
    """A ``qos`` entry with every key and nothing known."""
    return {
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
        "cm_tos": None,
        "cm_tos_reason": None,
        "pfc_stall_prevention": None,
        "raw": {},
        "reasons": {},
    }


def qos_from_outputs(
    q: Dict[str, Any],
    mlnx_qos: Optional[str] = None,
    dcb_pfc: Optional[str] = None,
    dcb_app: Optional[str] = None,
    dcb_apptrust: Optional[str] = None,
    ethtool_a: Optional[str] = None,
    dcb_ets: Optional[str] = None,
) -> Dict[str, Any]:
    """Fill ``q`` (see :func:`empty_qos`) from the tools' outputs that are there (``None``: not run
    or failed).  The one place the QoS tools' texts become facts: the live probe and
    ``doctor --from`` on raw outputs both go through it."""
    if mlnx_qos is not None:
        m = parse_mlnx_qos(mlnx_qos)
        q.update(
            tool="mlnx_qos",
            trust=m["trust"],
            trust_source="mlnx_qos" if m["trust"] else None,
            pfc_enabled=m["pfc_enabled"],
            dscp2prio=m["dscp2prio"],
            prio2buffer=m["prio2buffer"],
            prio2tc=m["prio2tc"],
            dcbx=m["dcbx"],
            lldpad_warning=m["lldpad_warning"],
            cable_len=m["cable_len"],
        )
    else:
        if dcb_pfc is not None:
            q["tool"] = "dcb"
            q["pfc_enabled"] = parse_dcb_pfc(dcb_pfc)
        if dcb_app is not None:
            q["tool"] = "dcb"
            q["dscp2prio"] = parse_dcb_app_dscp(dcb_app) or None
        if dcb_ets is not None and parse_dcb_ets(dcb_ets) is not None:
            q["tool"] = "dcb"
            q["prio2tc"] = parse_dcb_ets(dcb_ets)
        if dcb_apptrust is not None and parse_dcb_apptrust(dcb_apptrust):
            q["trust"], q["trust_source"] = parse_dcb_apptrust(dcb_apptrust), "dcb apptrust"
        elif dcb_app is not None:
            # As mlnx_qos decides without sysfs: DSCP entries in the APP table mean trust dscp.
            q["trust"] = "dscp" if q["dscp2prio"] else "pcp"
            q["trust_source"] = "dcb app (DSCP entries %s)" % ("present" if q["dscp2prio"] else "absent")
    if ethtool_a is not None:
        q["global_pause"] = parse_ethtool_pause(ethtool_a)
    return q


def nic_qos(nic: Dict[str, Any], timeout: float, root: str = "/", deadline: Optional[float] = None) -> Dict[str, Any]:
    """The QoS configuration of one RoCE NIC (see :func:`collect_qos`)."""
    dev = nic["netdev"]
    q = empty_qos()
    raw, reasons = q["raw"], q["reasons"]
    net_dir = path_in(root, "/sys/class/net/" + dev)
    text = _tool(["mlnx_qos", "-i", dev], timeout, raw, reasons, deadline)
    pfc = app = trust = None
    if text is None:
        pfc = _tool(["dcb", "pfc", "show", "dev", dev], timeout, raw, reasons, deadline)
        app = _tool(["dcb", "-N", "app", "show", "dev", dev], timeout, raw, reasons, deadline)
        trust = _tool(["dcb", "apptrust", "show", "dev", dev], timeout, raw, reasons, deadline)
    qos_from_outputs(q, mlnx_qos=text, dcb_pfc=pfc, dcb_app=app, dcb_apptrust=trust)
    sys_trust = read_opt(os.path.join(net_dir, "qos", "trust"))
    if sys_trust:
        q["trust"], q["trust_source"] = sys_trust.strip().lower(), "sysfs"
    pause = _tool(["ethtool", "-a", dev], timeout, raw, reasons, deadline)
    if pause is not None:
        qos_from_outputs(q, ethtool_a=pause)
    q["ecn"] = read_ecn(net_dir)
    rdma = nic.get("rdma") or {}
    if rdma.get("device"):
        q["traffic_class"], q["traffic_class_reason"] = read_traffic_class(
            root, rdma["device"], int(rdma.get("port") or 1)
        )
        q["cm_tos"], q["cm_tos_reason"] = read_cm_tos(root, rdma["device"], int(rdma.get("port") or 1))
    q["pfc_stall_prevention"] = read_opt(os.path.join(net_dir, "pfc_stall_prevention"))
    return q


#: Optional programs whose presence the analyzers need to know (``tools`` in the facts).
TOOLS = ("ib_write_bw",)


def find_tools() -> Dict[str, Optional[str]]:
    """Path of each program in :data:`TOOLS` (PATH, then the sbin dirs), ``None`` when absent."""
    return {n: shutil.which(n) or shutil.which(n, path=SBIN_DIRS) for n in TOOLS}


def collect_qos(nics: List[Dict[str, Any]], timeout: float, errors: Errors, root: str = "/") -> None:
    """Fill ``qos`` of every RoCE NIC (:func:`roce_nics`).  Each tool gets at
    most ``timeout`` seconds and all of them together ``2 * timeout``; after a
    timeout the NIC's remaining tools are skipped.  Tools that timed out or
    were skipped are noted in ``errors`` with the NICs they concern."""
    deadline = time.monotonic() + 2 * timeout
    hit: Dict[str, List[str]] = {}
    for nic in roce_nics(nics):
        nic["qos"] = q = nic_qos(nic, timeout, root, deadline)
        for reason in q["reasons"].values():
            if reason.startswith(("timed out", "skipped")):
                hit.setdefault(reason, []).append(nic["netdev"])
    for reason, names in hit.items():
        note(errors, "nics.qos", "%s (%s)" % (reason, ", ".join(sorted(set(names)))))


# --------------------------------------------------------------------------
# Counter samples: the RDMA NICs' counters read twice, `interval` seconds
# apart, each read stamped with this node's monotonic clock, so that rates do
# not depend on the SSH round trip.


def sample_nic(nic: Dict[str, Any], timeout: float, root: str = "/") -> Dict[str, Any]:
    """One sample: ``t`` (monotonic s, midpoint of the ``ethtool -S`` run),
    ``t_sysfs`` (midpoint of the two sysfs directory reads), ``read_s`` (how
    long all reads took), ``ethtool_stats``, ``hw_counters``, ``counters``,
    ``reason`` (why ethtool gave nothing, else ``None``)."""
    rdma = nic.get("rdma") or {}
    pd = path_in(root, "/sys/class/infiniband/%s/ports/%s" % (rdma.get("device"), rdma.get("port")))
    t0 = time.monotonic()
    stats, reason = ethtool_stats(nic["netdev"], timeout)
    t1 = time.monotonic()
    hw = read_counter_dir(os.path.join(pd, "hw_counters"))
    counters = read_counter_dir(os.path.join(pd, "counters"))
    t2 = time.monotonic()
    return {
        "t": round((t0 + t1) / 2, 6),
        "t_sysfs": round((t1 + t2) / 2, 6),
        "read_s": round(t2 - t0, 6),
        "ethtool_stats": stats,
        "hw_counters": hw,
        "counters": counters,
        "reason": reason,
    }


def _sample_all(nics: List[Dict[str, Any]], timeout: float, root: str) -> None:
    threads = []
    for nic in nics:

        def work(n: Dict[str, Any] = nic) -> None:
            n["samples"].append(sample_nic(n, timeout, root))

        t = threading.Thread(target=work, name="sample", daemon=True)
        t.start()
        threads.append(t)
    deadline = time.monotonic() + 2 * timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def collect_samples(
    nics: List[Dict[str, Any]], interval: float, timeout: float, errors: Errors, root: str = "/"
) -> None:
    """Fill ``samples`` of every RoCE NIC with two samples: the second reads
    start ``interval`` seconds after the first ones ended, so the samples are
    at least ``interval`` apart however slow a read was.  The NICs are read in
    parallel, each read bounded like ``ethtool -S``."""
    finish_samples(start_samples(nics, timeout, errors, root), interval, timeout, errors, root)


def start_samples(
    nics: List[Dict[str, Any]], timeout: float, errors: Errors, root: str = "/"
) -> Tuple[List[Dict[str, Any]], float]:
    """The first samples (see :func:`collect_samples`); returns the NICs sampled
    and when their reads ended (monotonic), for :func:`finish_samples`."""
    todo = []
    for n in roce_nics(nics):
        why = n.get("ethtool_stats_reason") or ""
        if "timed out" in why or "did not finish" in why:  # a wedged NIC: do not wait on it twice more
            note(errors, "nics.samples", "%s: not sampled, ethtool -S hung before" % n["netdev"])
            continue
        n["samples"] = []
        todo.append(n)
    if todo:
        _sample_all(todo, timeout, root)
    return todo, time.monotonic()


def finish_samples(
    started: Tuple[List[Dict[str, Any]], float], interval: float, timeout: float, errors: Errors, root: str = "/"
) -> None:
    """The second samples, ``interval`` s after the first reads ended (other
    work may run in between: only the rest of the interval is waited)."""
    todo, ended = started
    if not todo:
        return
    time.sleep(max(0.0, ended + interval - time.monotonic()))
    _sample_all(todo, timeout, root)
    short = [n["netdev"] for n in todo if len(n["samples"]) < 2]
    if short:
        note(
            errors, "nics.samples", "a counter sample did not finish within %g s (%s)" % (2 * timeout, ", ".join(short))
        )


def pci_path(root: str, sysfs_link: str) -> Optional[List[str]]:
    """The PCI path of a device (its realpath's components under /sys/devices)."""
    p = path_in(root, sysfs_link)
    if not os.path.exists(p):
        return None
    parts = os.path.realpath(p).split(os.sep)
    return [x for x in parts if re.match(r"^(pci)?[0-9a-f]{4}:[0-9a-f]{2}", x)] or None


def nearest_nics(gpus: Dict[str, Any], nics: List[Dict[str, Any]], root: str = "/") -> None:
    """Fill each GPU's ``nearest_nics``: the NICs sharing its deepest PCI ancestor,
    with ``depth`` = how many PCI path components they share (1 = only the root
    complex)."""
    nic_paths = []
    for nic in nics:
        if nic.get("pci_address") and nic.get("netdev"):
            path = pci_path(root, "/sys/class/net/%s/device" % nic["netdev"])
            if path:
                nic_paths.append((nic["netdev"], path))
    for dev in gpus.get("devices", []):
        if not dev.get("pci_address") or not nic_paths:
            continue
        gpath = pci_path(root, "/sys/bus/pci/devices/%s" % dev["pci_address"])
        if not gpath:
            continue
        best, names = 0, []
        for name, npath in nic_paths:
            depth = 0
            for a, b in zip(gpath, npath):
                if a != b:
                    break
                depth += 1
            if depth > best:
                best, names = depth, [name]
            elif depth == best and depth:
                names.append(name)
        if best:
            dev["nearest_nics"] = {"netdevs": names, "depth": best}


# --------------------------------------------------------------------------
# RDMA prerequisites: GPUDirect peer memory, IOMMU, PCIe ACS, memlock.

PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")

#: PCIe extended capability ID of Access Control Services.
PCI_EXT_CAP_ACS = 0x000D

#: ACS Control register bits, as lspci names them (PCIe base spec 7.7.11.3).
ACS_CTL_BITS = [
    (0, "SrcValid"),
    (1, "TransBlk"),
    (2, "ReqRedir"),
    (3, "CmpltRedir"),
    (4, "UpstreamFwd"),
    (5, "EgressCtrl"),
    (6, "DirectTrans"),
]

IOMMU_CMDLINE = re.compile(r"^(iommu|intel_iommu|amd_iommu|iommu\.passthrough|iommu\.strict)=")


def peer_memory(root: str = "/") -> Dict[str, Any]:
    """Whether nvidia-peermem (or the older nv_peer_mem) is loaded: ``/proc/modules``,
    else ``/sys/module/NAME`` (built-in or where /proc/modules is hidden)."""
    text = read_opt(path_in(root, "/proc/modules"))
    if text is not None:
        loaded = {line.split()[0] for line in text.splitlines() if line.split()}
        mod = next((m for m in PEERMEM_MODULES if m in loaded), None)
        return {"loaded": mod is not None, "module": mod, "source": "/proc/modules", "reason": None}
    sys_module = path_in(root, "/sys/module")
    if os.path.isdir(sys_module):
        mod = next((m for m in PEERMEM_MODULES if os.path.isdir(os.path.join(sys_module, m))), None)
        return {"loaded": mod is not None, "module": mod, "source": "/sys/module", "reason": None}
    return {
        "loaded": None,
        "module": None,
        "source": None,
        "reason": "neither /proc/modules nor /sys/module is readable",
    }


def iommu_state(root: str = "/") -> Dict[str, Any]:
    """IOMMU settings: the kernel command line's iommu parameters, how many
    groups ``/sys/kernel/iommu_groups`` has (0: no IOMMU in use) and how many
    of them have a domain ``type`` of ``identity`` (passthrough) or
    ``DMA``/``DMA-FQ`` (translated: every DMA goes through the IOMMU's page tables)."""
    out: Dict[str, Any] = {
        "cmdline": None,
        "groups": None,
        "identity_groups": None,
        "translated_groups": None,
        "reason": None,
    }
    cmdline = read_opt(path_in(root, "/proc/cmdline"))
    if cmdline is not None:
        out["cmdline"] = [w for w in cmdline.split() if IOMMU_CMDLINE.match(w)]
    groups_dir = path_in(root, "/sys/kernel/iommu_groups")
    try:
        groups = os.listdir(groups_dir)
    except OSError as e:
        out["reason"] = "%s: %s" % ("/sys/kernel/iommu_groups", os_error_reason(e))
        return out
    out["groups"] = len(groups)
    types = [read_opt(os.path.join(groups_dir, g, "type")) or "" for g in groups]
    out["identity_groups"] = sum(1 for t in types if t == "identity")
    out["translated_groups"] = sum(1 for t in types if t.startswith("DMA"))
    if cmdline is None:
        out["reason"] = "/proc/cmdline is not readable"
    return out


def acs_from_config(data: bytes) -> Tuple[Optional[int], Optional[str]]:
    """ACS Control register from a device's config space bytes, by walking the
    extended capability list from offset 0x100; ``(None, reason)`` without it."""
    if len(data) < 0x104:
        return None, "extended config space not readable (%d bytes; needs root)" % len(data)
    off, seen = 0x100, 0
    while off and off + 8 <= len(data) and seen < 64:
        header = int.from_bytes(data[off : off + 4], "little")
        if header in (0, 0xFFFFFFFF):
            break
        if header & 0xFFFF == PCI_EXT_CAP_ACS:
            return int.from_bytes(data[off + 6 : off + 8], "little"), None
        off, seen = (header >> 20) & 0xFFC, seen + 1
    return None, "no ACS capability"


def parse_lspci_acsctl(text: str) -> Optional[int]:
    """The ACS Control register from ``lspci -vvv`` (``ACSCtl: SrcValid+ ...``)."""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("ACSCtl:"):
            flags = dict((w[:-1], w[-1] == "+") for w in s[len("ACSCtl:") :].split() if w[-1:] in "+-")
            return sum(1 << bit for bit, name in ACS_CTL_BITS if flags.get(name))
    return None


def acs_control(root: str, address: str, timeout: float) -> Dict[str, Any]:
    """One bridge's ACS control: sysfs ``config`` first, ``lspci -vvv -s`` where
    the config space beyond 256 bytes is hidden (non-root)."""
    entry: Dict[str, Any] = {"pci_address": address, "acs_ctl": None, "redirect": None, "source": None, "reason": None}
    try:
        with open(path_in(root, "/sys/bus/pci/devices/%s/config" % address), "rb") as f:
            value, why = acs_from_config(f.read(4096))
        source = "config"
    except OSError as e:
        value, why, source = None, "config: %s" % os_error_reason(e), "config"
    if value is None and why and why.startswith(("extended", "config:")) and root == "/":
        try:
            rc, out, err = run_command([find_program("lspci"), "-vvv", "-s", address], timeout)
            if rc == 0:
                value, source = parse_lspci_acsctl(out), "lspci"
                why = (
                    None
                    if value is not None
                    else (
                        "lspci: capabilities <access denied> (needs root)"
                        if "<access denied>" in out
                        else "lspci shows no ACSCtl line"
                    )
                )
            else:
                why = "%s; lspci failed (rc %s)" % (why, rc)
        except OSError:
            why = "%s; lspci not installed" % why
    if value is not None:
        entry["acs_ctl"] = [name for bit, name in ACS_CTL_BITS if value & (1 << bit)]
        entry["redirect"] = bool(value & 0b1100)
    entry["source"], entry["reason"] = source, why
    return entry


def acs_paths(
    gpus: Dict[str, Any], nics: List[Dict[str, Any]], timeout: float, root: str = "/"
) -> List[Dict[str, Any]]:
    """Each GPU and RDMA NIC under a common PCIe switch: the bridges between
    them below their deepest common ancestor (the switch ports whose ACS
    redirect would send GPUDirect P2P up through the root complex)."""
    pairs: List[Dict[str, Any]] = []
    cache: Dict[str, Dict[str, Any]] = {}
    nic_paths = []
    for nic in nics:
        if nic.get("rdma") and nic.get("netdev"):
            p = pci_path(root, "/sys/class/net/%s/device" % nic["netdev"])
            if p:
                nic_paths.append((nic["netdev"], p))
    for dev in gpus.get("devices") or []:
        gpath = pci_path(root, "/sys/bus/pci/devices/%s" % dev.get("pci_address")) if dev.get("pci_address") else None
        if not gpath:
            continue
        for netdev, npath in nic_paths:
            common = 0
            for a, b in zip(gpath, npath):
                if a != b:
                    break
                common += 1
            # common == 1: only the root complex (pciDDDD:BB) is shared
            if common < 2:
                continue
            between = [x for x in gpath[common:-1] + npath[common:-1]]
            for addr in between:
                if addr not in cache:
                    cache[addr] = acs_control(root, addr, timeout)
            pairs.append({"gpu": dev.get("index"), "netdev": netdev, "bridges": [cache[a] for a in between]})
    return pairs


def memlock_limit() -> Dict[str, Any]:
    """The probe process's own RLIMIT_MEMLOCK in bytes (``None`` = unlimited):
    context for the units' ``LimitMEMLOCK``, which is what vLLM gets."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ImportError, OSError, ValueError) as e:
        return {"soft_bytes": None, "hard_bytes": None, "reason": str(e)}

    def val(v: int) -> Optional[int]:
        return None if v == resource.RLIM_INFINITY else v

    return {"soft_bytes": val(soft), "hard_bytes": val(hard), "reason": None}


def collect_rdma_prereqs(
    gpus: Dict[str, Any], nics: List[Dict[str, Any]], timeout: float, errors: Errors, root: str = "/"
) -> Dict[str, Any]:
    """``rdma_prereqs``: peer memory module, IOMMU, ACS on GPU-NIC paths, memlock."""
    return {
        "peer_memory": peer_memory(root),
        "iommu": iommu_state(root),
        "acs": acs_paths(gpus, nics, timeout, root),
        "probe_memlock": memlock_limit(),
    }


# --------------------------------------------------------------------------
# systemd units clusterctl manages.


#: With ``--raw-outputs``: every command's argv, rc, verbatim stdout/stderr and
#: start time, in the document's ``raw_outputs`` (for ``clusterctl collect``).
RAW_OUTPUTS = None  # type: Optional[List[Dict[str, Any]]]


def run_command(argv: List[str], timeout: float) -> Tuple[Optional[int], str, str]:
    """Run a read-only command; ``(rc, stdout, stderr)``, rc ``None`` when it
    timed out.  Raises FileNotFoundError when the program is missing."""
    t0 = time.time()
    try:
        p = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            env=dict(os.environ, SYSTEMD_PAGER="", SYSTEMD_COLORS="0", LC_ALL="C"),
        )
        rc, out, err = p.returncode, _dec(p.stdout), _dec(p.stderr)  # type: Tuple[Optional[int], str, str]
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, _dec(e.stdout), _dec(e.stderr)
    if RAW_OUTPUTS is not None:
        RAW_OUTPUTS.append(
            {
                "argv": list(argv),
                "rc": rc,
                "stdout": out,
                "stderr": err,
                "started_at": iso(t0),
                "duration_s": round(time.time() - t0, 3),
            }
        )
    return rc, out, err


def _dec(b: Optional[bytes]) -> str:
    return b.decode("utf-8", "replace") if b else ""


def first_line(s: str) -> str:
    lines = [x for x in s.strip().splitlines() if x.strip()]
    return lines[0].strip() if lines else ""


def parse_unit_names(text: str) -> List[str]:
    """Unit names (first column) of ``systemctl list-units/list-unit-files --plain --no-legend``."""
    names = []
    for line in text.splitlines():
        words = [w for w in line.split() if w not in ("●", "*")]
        if words and "." in words[0]:
            names.append(words[0])
    return names


UNIT_PROPERTIES = [
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "UnitFileState",
    "Result",
    "NRestarts",
    "MainPID",
    "ExecMainStatus",
    "StateChangeTimestamp",
    "StateChangeTimestampMonotonic",
    "LimitMEMLOCK",
    "Environment",
    "EnvironmentFiles",
]

#: Environment variables whose values the facts may carry (names always):
#: NCCL's and vLLM's settings, never a name that looks like a secret.
ENV_VALUE_PREFIXES = ("NCCL_", "VLLM_")
SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def parse_show(text: str) -> List[Dict[str, str]]:
    """``systemctl show`` output: KEY=value blocks separated by blank lines."""
    blocks: List[Dict[str, str]] = []
    cur: Dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                blocks.append(cur)
                cur = {}
            continue
        key, _, value = line.partition("=")
        cur[key] = value
    if cur:
        blocks.append(cur)
    return blocks


def unit_entry(props: Dict[str, str], boot_epoch: Optional[float]) -> Dict[str, Any]:
    """One unit: state, substate, restarts and when it last changed state."""

    def num(key: str) -> Optional[int]:
        try:
            return int(props.get(key, ""))
        except ValueError:
            return None

    since = None
    mono = num("StateChangeTimestampMonotonic")
    if boot_epoch is not None and mono:
        since = iso(boot_epoch + mono / 1e6)
    return {
        "unit": props.get("Id"),
        "load_state": props.get("LoadState"),
        "active_state": props.get("ActiveState"),
        "sub_state": props.get("SubState"),
        "unit_file_state": props.get("UnitFileState") or None,
        "result": props.get("Result"),
        "restarts": num("NRestarts"),
        "main_pid": num("MainPID") or None,
        "exec_main_status": num("ExecMainStatus"),
        "since": since,
        "since_text": props.get("StateChangeTimestamp") or None,
        "limit_memlock": parse_limit(props.get("LimitMEMLOCK")),
    }


def parse_limit(value: Optional[str]) -> Any:
    """A systemd ``Limit*`` property: bytes, ``"infinity"``, or ``None`` when not shown."""
    if not value:
        return None
    if value == "infinity":
        return value
    try:
        return int(value)
    except ValueError:
        return None


def env_entry(assignment: str) -> Tuple[str, Optional[str]]:
    """``NAME=value`` → ``(NAME, value)``, the value kept only for a non-secret
    NCCL_/VLLM_ name (:data:`ENV_VALUE_PREFIXES`, :data:`SECRET_NAME_PARTS`)."""
    name, _, value = assignment.partition("=")
    keep = name.startswith(ENV_VALUE_PREFIXES) and not any(p in name.upper() for p in SECRET_NAME_PARTS)
    return name, (value if keep else None)


def parse_unit_environment(text: str) -> Dict[str, Dict[str, Any]]:
    """``systemctl show -p Id,Environment,EnvironmentFiles`` → per unit
    ``{"environment": {NAME: value-or-None}, "environment_files": [path]}``.
    Environment is space-separated and shell-quoted where a value has spaces;
    each EnvironmentFiles line is ``PATH (ignore_errors=yes|no)``."""
    out: Dict[str, Dict[str, Any]] = {}
    blocks: List[List[Tuple[str, str]]] = [[]]
    for line in text.splitlines():
        if not line.strip():
            blocks.append([])
            continue
        key, _, value = line.partition("=")
        blocks[-1].append((key, value))
    for block in blocks:
        unit = next((v for k, v in block if k == "Id"), None)
        if not unit:
            continue
        env: Dict[str, Optional[str]] = {}
        files: List[str] = []
        for key, value in block:
            if key == "Environment" and value:
                try:
                    words = shlex.split(value)
                except ValueError:
                    words = value.split()
                for w in words:
                    name, val = env_entry(w)
                    env[name] = val
            elif key == "EnvironmentFiles" and value:
                files.append(re.sub(r"\s+\(ignore_errors=\w+\)$", "", value))
        out[unit] = {"environment": env, "environment_files": files}
    return out


def redact_environment(text: str) -> str:
    """``systemctl show`` output with every ``Environment=`` value that
    :func:`env_entry` would not keep replaced by ``<redacted>``."""
    lines = []
    for line in text.splitlines():
        if line.startswith("Environment=") and len(line) > len("Environment="):
            try:
                words = shlex.split(line[len("Environment=") :])
            except ValueError:
                words = line[len("Environment=") :].split()
            kept = []
            for w in words:
                name, val = env_entry(w)
                kept.append(shlex.quote("%s=%s" % (name, "<redacted>" if val is None else val)))
            line = "Environment=" + " ".join(kept)
        lines.append(line)
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def collect_units(
    args: argparse.Namespace, errors: Errors, uptime_s: Optional[float]
) -> Optional[List[Dict[str, Any]]]:
    """systemd units matching ``--unit-pattern`` (loaded or only installed);
    ``None`` when systemctl cannot answer."""
    t = args.cmd_timeout
    names: List[str] = []
    try:
        for cmd in (
            ["systemctl", "list-units", args.unit_pattern, "--all", "--plain", "--no-legend", "--no-pager"],
            ["systemctl", "list-unit-files", args.unit_pattern, "--plain", "--no-legend", "--no-pager"],
        ):
            rc, out, err = run_command(cmd, t)
            if rc is None:
                note(errors, "units", "%s timed out after %g s" % (" ".join(cmd[:2]), t))
                return None
            if rc != 0 and (out.strip() or err.strip()):
                note(errors, "units", "%s failed (rc %d): %s" % (" ".join(cmd[:2]), rc, first_line(err)))
                return None
            # list-unit-files exits 1, silently, when no file matches
            names += [n for n in parse_unit_names(out) if n not in names]
    except FileNotFoundError:
        note(errors, "units", "systemctl not found")
        return None
    if not names:
        return []
    rc, out, err = run_command(
        ["systemctl", "show", "--no-pager", "--property=" + ",".join(UNIT_PROPERTIES), "--"] + names, t
    )
    if RAW_OUTPUTS:
        # the verbatim output would carry every Environment= value, secrets included
        RAW_OUTPUTS[-1]["stdout"] = redact_environment(out)
    if rc != 0:
        note(errors, "units", "systemctl show failed (rc %s): %s" % (rc, first_line(err) or "timed out"))
        return None
    boot_epoch = time.time() - uptime_s if uptime_s is not None else None
    units = [unit_entry(p, boot_epoch) for p in parse_show(out)]
    units = [u for u in units if u["load_state"] != "not-found" or u["unit_file_state"]]
    envs = parse_unit_environment(out)
    for u in units:
        got = envs.get(u["unit"] or "") or {}
        u["environment"] = got.get("environment", {})
        u["environment_files"] = got.get("environment_files", [])
    return units


# --------------------------------------------------------------------------
# Kernel log since a cursor: the journal where it has kernel messages, else
# /var/log/kern.log.  File cursors are ``file:<path>:<inode>:<offset>``.

KERN_LOG = "/var/log/kern.log"


def journal_line(entry: Dict[str, Any]) -> Dict[str, Any]:
    msg = entry.get("MESSAGE")
    if isinstance(msg, list):  # non-UTF-8 messages come as a byte array
        msg = bytes(x for x in msg if isinstance(x, int) and 0 <= x < 256).decode("utf-8", "replace")
    ts = entry.get("__REALTIME_TIMESTAMP")
    prio = entry.get("PRIORITY")
    return {
        "time": int(ts) / 1e6 if ts and str(ts).isdigit() else None,
        "boot_id": entry.get("_BOOT_ID"),
        "priority": int(prio) if prio is not None and str(prio).isdigit() else None,
        "text": msg if isinstance(msg, str) else "",
    }


def read_journal(cursor: Optional[str], max_lines: int, timeout: float, errors: Errors) -> Optional[Dict[str, Any]]:
    """Kernel messages from the journal after ``cursor`` (this boot's last
    ``max_lines`` without one).  ``None`` when the journal has none to offer."""
    cmd = ["journalctl", "-k", "-o", "json", "--no-pager"]
    cmd += ["--after-cursor", cursor] if cursor else ["-b", "-n", str(max_lines)]
    try:
        rc, out, err = run_command(cmd, timeout)
    except FileNotFoundError:
        return None
    if rc is None:
        note(errors, "kernel_log", "journalctl timed out after %g s" % timeout)
        return None
    if rc != 0:
        note(errors, "kernel_log", "journalctl failed (rc %d): %s" % (rc, first_line(err)))
        return None
    entries = []
    for line in out.splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    if not entries and not cursor:
        if err.strip():
            note(errors, "kernel_log", "journalctl: %s" % first_line(err))
        return None
    truncated = len(entries) > max_lines
    entries = entries[:max_lines]
    return {
        "source": "journal",
        "cursor": entries[-1].get("__CURSOR") if entries else cursor,
        "truncated": truncated,
        "rotated": False,
        "lines": [journal_line(e) for e in entries],
    }


ISO_PREFIX = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:?\d{2}|Z))\s")


def file_line(line: str) -> Dict[str, Any]:
    ts = None
    m = ISO_PREFIX.match(line)
    if m:
        try:
            ts = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        except ValueError:
            ts = None
    return {"time": ts, "boot_id": None, "priority": None, "text": line}


def parse_file_cursor(cursor: str) -> Optional[Tuple[str, int, int]]:
    try:
        _, rest = cursor.split(":", 1)
        path, ino, off = rest.rsplit(":", 2)
        return path, int(ino), int(off)
    except ValueError:
        return None


def read_lines_from(f: Any, offset: int, max_lines: int) -> Tuple[List[str], int, bool]:
    """Whole lines from ``offset``: at most ``max_lines``; a last line without
    its newline (still being written) is left for the next read."""
    f.seek(offset)
    lines: List[str] = []
    pos = offset
    while True:
        raw = f.readline()
        if not raw or not raw.endswith(b"\n"):
            return lines, pos, False
        if len(lines) == max_lines:
            return lines, pos, True
        lines.append(raw.rstrip(b"\r\n").decode("utf-8", "replace"))
        pos += len(raw)


def tail_lines(f: Any, size: int, max_lines: int) -> Tuple[List[str], int]:
    """The last ``max_lines`` whole lines of a file of ``size`` bytes."""
    start = max(0, size - max_lines * 512)
    f.seek(start)
    data = f.read(size - start)
    if start:
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""
    end = data.rfind(b"\n") + 1
    lines = [x.decode("utf-8", "replace") for x in data[:end].split(b"\n")[:-1]]
    return list(deque(lines, maxlen=max_lines)), size - (len(data) - end)


def read_kern_log(cursor: Optional[str], max_lines: int, errors: Errors, root: str = "/") -> Optional[Dict[str, Any]]:
    """Lines of /var/log/kern.log after a file cursor (its last ``max_lines``
    without one).  A cursor into a rotated file continues in ``kern.log.1``
    first.  ``None`` when the file cannot be read."""
    path = KERN_LOG
    parsed = parse_file_cursor(cursor) if cursor else None
    real = path_in(root, path)
    try:
        f = open(real, "rb")
    except OSError as e:
        if not isinstance(e, FileNotFoundError):
            note(errors, "kernel_log", "%s: %s" % (path, e.strerror or e))
        return None
    lines: List[str] = []
    rotated = truncated = False
    with f:
        st = os.fstat(f.fileno())
        if parsed is None:
            lines, offset = tail_lines(f, st.st_size, max_lines)
        elif parsed[1] == st.st_ino and parsed[2] <= st.st_size:
            lines, offset, truncated = read_lines_from(f, parsed[2], max_lines)
        else:
            rotated = True
            lines = rotated_rest(real + ".1", parsed, max_lines)
            more, offset, truncated = read_lines_from(f, 0, max_lines - len(lines))
            lines += more
    return {
        "source": path,
        "cursor": "file:%s:%d:%d" % (path, st.st_ino, offset),
        "truncated": truncated,
        "rotated": rotated,
        "lines": [file_line(x) for x in lines],
    }


def rotated_rest(old_path: str, parsed: Tuple[str, int, int], max_lines: int) -> List[str]:
    """What was appended to the file the cursor points into, now renamed to ``.1``."""
    try:
        with open(old_path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_ino != parsed[1] or parsed[2] > st.st_size:
                return []
            return read_lines_from(f, parsed[2], max_lines)[0]
    except OSError:
        return []


def collect_kernel_log(args: argparse.Namespace, errors: Errors, root: str = "/") -> Dict[str, Any]:
    """Kernel-log lines since ``--kernel-log-cursor``, with the cursor to pass next time."""
    cursor = args.kernel_log_cursor or None
    empty: Dict[str, Any] = {"source": None, "cursor": cursor, "truncated": False, "rotated": False, "lines": []}
    if cursor and cursor.startswith("file:"):
        got = read_kern_log(cursor, args.kernel_log_max, errors, root)
    else:
        got = read_journal(cursor, args.kernel_log_max, args.cmd_timeout, errors)
        if got is None and not cursor:
            got = read_kern_log(None, args.kernel_log_max, errors, root)
    if got is None:
        state = "not readable" if os.path.lexists(path_in(root, KERN_LOG)) else "does not exist"
        note(errors, "kernel_log", "no kernel log: the journal has no kernel messages and %s %s" % (KERN_LOG, state))
        return empty
    return got


# --------------------------------------------------------------------------


def iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat()


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="clusterctl-collector", description=__doc__.splitlines()[0])
    p.add_argument(
        "--kernel-log-cursor", default=None, help="return kernel-log lines after this cursor (from a previous run)"
    )
    p.add_argument("--kernel-log-max", type=int, default=KERNEL_LOG_MAX_LINES, help="most kernel-log lines returned")
    p.add_argument("--nvml-timeout", type=float, default=NVML_CALL_TIMEOUT_S, help="seconds one NVML call may take")
    p.add_argument("--nvml-budget", type=float, default=NVML_BUDGET_S, help="seconds all NVML calls together may take")
    p.add_argument(
        "--cmd-timeout", type=float, default=COMMAND_TIMEOUT_S, help="seconds one command or statvfs may take"
    )
    p.add_argument("--unit-pattern", default="clusterctl-*", help="systemd units to report")
    p.add_argument(
        "--counter-interval",
        type=float,
        default=0.0,
        help="seconds between two samples of the RDMA NICs' counters (0: no samples)",
    )
    p.add_argument(
        "--raw-outputs", action="store_true", help="add raw_outputs: every command's verbatim output (for bundles)"
    )
    return p.parse_args(argv)


def guarded(errors: Errors, source: str, default: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; a bug in one section is recorded, and the others still run."""
    try:
        return fn(*args)
    except Exception as e:
        note(errors, source, "internal error: %s: %s" % (type(e).__name__, e))
        return default


# --------------------------------------------------------------------------
# What ``clusterctl node setup`` converges (kernel parameters, the service user's limits).

#: Kernel parameters node setup may set by default (bringup/nodesetup.py ``wanted_sysctls``).
NODE_SYSCTLS = ("kernel.numa_balancing", "net.ipv4.conf.all.arp_ignore", "net.ipv4.conf.all.arp_announce")
#: node setup's drop-in: every parameter it set (the inventory's ``vars.sysctl`` included).
SYSCTL_DROPIN = "/etc/sysctl.d/90-clusterctl.conf"
LIMITS_FILES = ("/etc/security/limits.conf", "/etc/security/limits.d")
_SYSCTL_NAME = re.compile(r"^[a-z0-9_][a-z0-9_.-]*$")


def parse_sysctl_conf(text: str) -> Dict[str, str]:
    """``name = value`` lines of a sysctl.d file (``#``/``;`` comments; values with runs of blanks as one)."""
    out = {}  # type: Dict[str, str]
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        k, v = line.split("=", 1)
        k = k.strip().lstrip("-").replace("/", ".")
        if _SYSCTL_NAME.match(k):
            out[k] = " ".join(v.split())
    return out


def parse_limits(text: str, source: str) -> List[Dict[str, str]]:
    """``DOMAIN TYPE ITEM VALUE`` lines of a limits.conf file (pam_limits(8)), ``memlock``/``nofile`` only."""
    out = []  # type: List[Dict[str, str]]
    for line in text.splitlines():
        f = line.split("#", 1)[0].split()
        if len(f) == 4 and f[2] in ("memlock", "nofile"):
            out.append({"domain": f[0], "type": f[1], "item": f[2], "value": f[3], "file": source})
    return out


def collect_node_prereqs(root: str = "/") -> Dict[str, Any]:
    """The kernel parameters node setup manages (its defaults and every name in its drop-in) with
    their values now, the drop-in itself, the ``memlock``/``nofile`` lines of limits.conf and
    limits.d (in pam_limits' reading order) and the local user names."""
    dropin_text = read_opt(path_in(root, SYSCTL_DROPIN))
    dropin = parse_sysctl_conf(dropin_text) if dropin_text is not None else None
    values = {}  # type: Dict[str, Optional[str]]
    for name in list(NODE_SYSCTLS) + sorted(dropin or {}):
        v = read_opt(path_in(root, "/proc/sys/" + name.replace(".", "/")))
        values[name] = " ".join(v.split()) if v is not None else None
    limits = []  # type: List[Dict[str, str]]
    main_conf, conf_d = LIMITS_FILES
    text = read_opt(path_in(root, main_conf))
    if text is not None:
        limits += parse_limits(text, main_conf)
    try:
        names = sorted(n for n in os.listdir(path_in(root, conf_d)) if n.endswith(".conf"))
    except OSError:
        names = []
    for n in names:
        text = read_opt(path_in(root, conf_d + "/" + n))
        if text is not None:
            limits += parse_limits(text, conf_d + "/" + n)
    passwd = read_opt(path_in(root, "/etc/passwd")) or ""
    users = sorted({ln.split(":", 1)[0] for ln in passwd.splitlines() if ":" in ln})
    return {"sysctl": values, "sysctl_dropin": dropin, "limits": limits, "users": users}


def collect(args: argparse.Namespace) -> Dict[str, Any]:
    """The whole facts document."""
    t0 = time.time()
    errors: Errors = []
    host = guarded(errors, "host", {}, collect_host, args, errors)
    nics = guarded(errors, "nics", [], collect_nics, errors)
    guarded(errors, "nics.ethtool_stats", None, collect_ethtool_stats, nics, args.cmd_timeout, errors)
    # The counter interval runs while the GPUs, QoS, units and kernel log are read.
    sampling = None
    if args.counter_interval > 0:
        sampling = guarded(errors, "nics.samples", None, start_samples, nics, args.cmd_timeout, errors)
    gpus = guarded(
        errors,
        "gpus",
        {"available": False, "reason": "internal error", "devices": [], "topology": []},
        collect_gpus,
        args,
        errors,
    )
    guarded(errors, "gpus.nearest_nics", None, nearest_nics, gpus, nics)
    guarded(errors, "nics.qos", None, collect_qos, nics, args.cmd_timeout, errors)
    prereqs = guarded(errors, "rdma_prereqs", None, collect_rdma_prereqs, gpus, nics, args.cmd_timeout, errors)
    units = guarded(errors, "units", None, collect_units, args, errors, host.get("uptime_s"))
    klog = guarded(errors, "kernel_log", None, collect_kernel_log, args, errors)
    tools = guarded(errors, "tools", None, find_tools)
    node_prereqs = guarded(errors, "node_prereqs", None, collect_node_prereqs)
    if sampling is not None:
        guarded(errors, "nics.samples", None, finish_samples, sampling, args.counter_interval, args.cmd_timeout, errors)
    return {
        "schema": SCHEMA,
        "collected_at": iso(t0),
        "duration_s": round(time.time() - t0, 3),
        "host": host,
        "gpus": gpus,
        "nics": nics,
        "units": units,
        "kernel_log": klog,
        "tools": tools,
        "rdma_prereqs": prereqs,
        "node_prereqs": node_prereqs,
        "errors": errors,
    }


def main(argv: List[str]) -> None:
    global RAW_OUTPUTS
    args = parse_args(argv)
    if args.raw_outputs:
        RAW_OUTPUTS = []
    doc = collect(args)
    if RAW_OUTPUTS is not None:
        doc["raw_outputs"] = RAW_OUTPUTS
    sys.stdout.write(json.dumps(doc, sort_keys=False) + "\n")
    sys.stdout.flush()
    # A hung NVML call may still hold its thread; do not wait for it on exit.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
