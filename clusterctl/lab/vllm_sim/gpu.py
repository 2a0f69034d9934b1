"""The simulated GPUs: read through NVML (ctypes), register this process in the lab's state.

Reads go through ``libnvidia-ml.so.1`` exactly as on a real node (the lab's
fake library answers), so the simulator sees what ``nvidia-smi`` or the probe
sees: device count, names, total/reserved/free memory.

Registering memory has no NVML call (a real driver learns it from CUDA), so
the simulator edits the fake library's state file, ``$FAKE_NVML_STATE``
(default ``/var/lib/lab-hw/nvml.json``): it adds
``{"pid", "used_mib", "vllm_sim": true}`` to the GPU's ``processes`` and
removes it on exit.  Entries of simulator processes that died without
cleaning up (SIGKILL) are dropped by the next registration, as a driver frees
a dead process's memory.  Edits are serialised with ``flock`` on
``<state>.lock`` and written with temp + rename.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

MiB = 1 << 20
DEFAULT_STATE = "/var/lib/lab-hw/nvml.json"


class GpuError(Exception):
    """NVML unusable or the GPU selection is invalid (message is printed as-is)."""


@dataclass(frozen=True)
class GpuInfo:
    index: int  # NVML index
    name: str
    uuid: str
    total: int  # bytes CUDA reports as total (NVML total minus reserved)
    free: int  # bytes free now


class _Mem2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class _Mem1(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Nvml:
    """A minimal ctypes NVML binding: count, name, UUID, memory."""

    def __init__(self, lib: str = "libnvidia-ml.so.1") -> None:
        try:
            self._lib = ctypes.CDLL(lib)
        except OSError as e:
            raise GpuError(f"RuntimeError: Failed to infer device type ({lib}: {e})") from None
        rc = self._lib.nvmlInit_v2()
        if rc != 0:
            raise GpuError(f"RuntimeError: Failed to infer device type (nvmlInit_v2 returned {rc})")

    def _call(self, fn: str, *args: Any) -> None:
        rc = getattr(self._lib, fn)(*args)
        if rc != 0:
            raise GpuError(f"RuntimeError: CUDA error: {fn} returned NVML error {rc}")

    def count(self) -> int:
        n = ctypes.c_uint()
        self._call("nvmlDeviceGetCount_v2", ctypes.byref(n))
        return n.value

    def info(self, index: int) -> GpuInfo:
        h = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(h))
        name = ctypes.create_string_buffer(96)
        self._call("nvmlDeviceGetName", h, name, ctypes.c_uint(96))
        uuid = ctypes.create_string_buffer(96)
        self._call("nvmlDeviceGetUUID", h, uuid, ctypes.c_uint(96))
        if hasattr(self._lib, "nvmlDeviceGetMemoryInfo_v2"):
            m2 = _Mem2(version=ctypes.sizeof(_Mem2) | (2 << 24))
            self._call("nvmlDeviceGetMemoryInfo_v2", h, ctypes.byref(m2))
            total, free = m2.total - m2.reserved, m2.free
        else:  # older drivers: v1 counts reserved memory as used
            m1 = _Mem1()
            self._call("nvmlDeviceGetMemoryInfo", h, ctypes.byref(m1))
            total, free = m1.free + m1.used, m1.free
        return GpuInfo(index, name.value.decode(), uuid.value.decode(), total, free)

    def shutdown(self) -> None:
        self._lib.nvmlShutdown()


def visible_devices(env: dict[str, str], nvml: Nvml) -> list[int]:
    """NVML indices selected by ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs).

    Unset means all GPUs; an empty value means none.  Raises :class:`GpuError`
    for an index or UUID that does not exist.
    """
    n = nvml.count()
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(n))
    out: list[int] = []
    uuids: dict[str, int] | None = None
    for item in filter(None, (x.strip() for x in raw.split(","))):
        if item.isdigit():
            idx = int(item)
            if idx >= n:
                break  # CUDA ignores this and every later entry
            out.append(idx)
        else:
            if uuids is None:
                uuids = {nvml.info(i).uuid: i for i in range(n)}
            match = [i for u, i in uuids.items() if u.startswith(item)]
            if len(match) != 1:
                break
            out.append(match[0])
    return out


def state_path(env: dict[str, str]) -> str:
    return env.get("FAKE_NVML_STATE") or DEFAULT_STATE


@contextmanager
def _locked_state(path: str) -> Iterator[dict[str, Any]]:
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        yield state
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(state, indent=1) + "\n")
        os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def register(path: str, usage: dict[int, int], pid: int | None = None) -> None:
    """Set this process's memory to ``usage[gpu]`` bytes on each listed GPU (0 removes it).

    Also drops the entries of simulator processes that no longer exist.
    Raises ``OSError``/``ValueError`` when the state file is missing or broken.
    """
    pid = pid or os.getpid()
    with _locked_state(path) as state:
        for g in state.get("gpus", []):
            procs = [
                p
                for p in g.get("processes", [])
                if not (p.get("vllm_sim") and (p.get("pid") == pid or not _alive(p["pid"])))
            ]
            used = usage.get(g["index"], 0)
            if used > 0:
                procs.append({"pid": pid, "used_mib": -(-used // MiB), "vllm_sim": True})
            g["processes"] = procs


def release(path: str, pid: int | None = None) -> None:
    """Remove this process from every GPU (no error when the file is gone)."""
    try:
        register(path, {}, pid)
    except (OSError, ValueError):
        pass


def other_processes(path: str, gpu: int, pid: int | None = None) -> list[tuple[int, int]]:
    """``(pid, bytes)`` of the other processes on ``gpu`` (for PyTorch's OOM message)."""
    pid = pid or os.getpid()
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return []
    for g in state.get("gpus", []):
        if g.get("index") == gpu:
            return [(p["pid"], p["used_mib"] * MiB) for p in g.get("processes", []) if p.get("pid") != pid]
    return []
