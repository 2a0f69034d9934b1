"""Fakes for the probe tests: a fake pynvml module and the collector's args.

The fake answers the pynvml functions the collector calls from a per-GPU
dict (function name -> value), and can make any call raise an NVML error
code or hang, so the collector's handling of NOT_SUPPORTED, GPU_IS_LOST and
hung calls is tested without a GPU.
"""

from __future__ import annotations

import argparse
import threading
import types
from pathlib import Path
from typing import Any


from clusterctl.node import collector

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "probe"

NOT_SUPPORTED = 3
LIBRARY_NOT_FOUND = 12
GPU_IS_LOST = 15

_MESSAGES = {
    NOT_SUPPORTED: "Not Supported",
    LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    GPU_IS_LOST: "GPU is lost",
    999: "Unknown Error",
}


class NVMLError(Exception):
    def __init__(self, value: int):
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"error {self.value}")


class Hang:
    """A call that blocks until the test releases it (or for ``seconds``)."""

    def __init__(self, seconds: float = 30.0):
        self.seconds = seconds
        self.release = threading.Event()
        self.calls = 0


def h100(index: int) -> dict[str, Any]:
    """NVML answers for one healthy H100 with a vLLM process on it."""
    gib = 1024**3
    return {
        "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        "nvmlDeviceGetPciInfo": types.SimpleNamespace(busId=f"00000000:{0x18 + index:02X}:00.0"),
        "nvmlDeviceGetMemoryInfo": types.SimpleNamespace(total=80 * gib, used=70 * gib, free=10 * gib),
        "nvmlDeviceGetComputeRunningProcesses": [types.SimpleNamespace(pid=4242, usedGpuMemory=70 * gib)],
        "nvmlDeviceGetTotalEccErrors": lambda etype, ctype: {(0, 0): 3, (1, 0): 0, (0, 1): 12, (1, 1): 1}[
            (etype, ctype)
        ],
        "nvmlDeviceGetEccMode": [1, 1],
        "nvmlDeviceGetRemappedRows": (2, 0, False, False),
        "nvmlDeviceGetRetiredPages": NVMLError(NOT_SUPPORTED),
        "nvmlDeviceGetRetiredPagesPendingStatus": NVMLError(NOT_SUPPORTED),
        "nvmlDeviceGetCurrentClocksEventReasons": 0x4 | 0x40,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetPcieReplayCounter": 0,
        "nvmlDeviceGetNvLinkState": lambda link: 1 if link < 2 else NVMLError(NOT_SUPPORTED),
        "nvmlDeviceGetNvLinkErrorCounter": lambda link, counter: 7 if (link, counter) == (1, 2) else 0,
        "nvmlDeviceGetTemperature": 41,
        "nvmlDeviceGetPowerUsage": 112500,
        "nvmlDeviceGetEnforcedPowerLimit": 700000,
        "nvmlDeviceGetUtilizationRates": types.SimpleNamespace(gpu=97, memory=60),
        "nvmlDeviceGetPersistenceMode": 1,
        "nvmlDeviceGetVbiosVersion": "96.00.89.00.01",
        "nvmlDeviceGetNumaNodeId": index // 4,
    }


class FakeNvml(types.ModuleType):
    """A stand-in for the pynvml module (only what the collector calls)."""

    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, gpus: list[dict[str, Any]], init: Any = None):
        super().__init__("pynvml")
        self.gpus = gpus
        self.init = init
        self.NVMLError = NVMLError
        self.calls: list[str] = []
        self.shutdown_called = False
        for name in set(k for g in gpus for k in g) | set(h100(0)):
            setattr(self, name, self._device_fn(name))

    def _answer(self, value: Any, *args: Any) -> Any:
        if callable(value) and not isinstance(value, (Hang, types.SimpleNamespace)):
            value = value(*args)
        if isinstance(value, Hang):
            value.calls += 1
            value.release.wait(value.seconds)
            raise NVMLError(999)
        if isinstance(value, Exception):
            raise value
        return value

    def _device_fn(self, name: str):
        def fn(handle: int, *args: Any) -> Any:
            self.calls.append(name)
            return self._answer(self.gpus[handle].get(name, NVMLError(NOT_SUPPORTED)), *args)

        return fn

    def nvmlInit(self) -> None:
        self._answer(self.init)

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.124.06"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.570.124.06"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return self._answer(self.gpus[index].get("handle", index))

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return 10 if a // 4 == b // 4 else 50


def collector_args(**over: Any) -> argparse.Namespace:
    """The collector's parsed command line, defaults unless overridden."""
    args = collector.parse_args([])
    for k, v in over.items():
        setattr(args, k, v)
    return args
