"""Measure the simulated hardware's costs; writes benchmarks/results/lab-hardware-<date>.json.

    python3 benchmarks/lab_hardware.py [--hosts 20] [--out FILE]

Figures: provisioning time per host, one steady ticker pass over all hosts
(it must stay well under the 1 s interval), one ``ethtool -S`` run of the
fake tool, and the fake NVML library read through real pynvml (init + every
field of 8 GPUs).  No root needed; everything lives in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from clusterctl.lab.hardware import nvml, provision_host, ticker
from clusterctl.lab.hardware.host import hw_dir
from clusterctl.lab.hardware.tools import nicmodel

PYNVML_READ = (
    "import pynvml as N; N.nvmlInit(); "
    "[(N.nvmlDeviceGetName(h), N.nvmlDeviceGetMemoryInfo(h), N.nvmlDeviceGetPciInfo(h), "
    "N.nvmlDeviceGetComputeRunningProcesses(h), N.nvmlDeviceGetTotalEccErrors(h, 1, 0), "
    "N.nvmlDeviceGetRemappedRows(h), N.nvmlDeviceGetCurrentClocksEventReasons(h)) "
    "for h in (N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount()))]"
)


def timed(fn, runs: int) -> dict:
    xs = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        xs.append(round(time.perf_counter() - t, 4))
    return {"runs": xs, "median": statistics.median(xs)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lab-hw-bench-") as tmp:
        lab = Path(tmp)
        t = time.perf_counter()
        for i in range(args.hosts):
            provision_host(lab / "hosts" / f"h{i:03d}", f"h{i:03d}", i, 8, "H100-SXM5-80GB")
        provision_s = time.perf_counter() - t
        caches: dict = {}
        ticker.tick(lab, caches)
        tick_files = []

        def one_tick() -> None:
            tick_files.append(ticker.tick(lab, caches))

        time.sleep(1.0)  # a second of simulated traffic, as between two real passes
        tick = timed(one_tick, 3)
        host = lab / "hosts" / "h000"
        env = dict(os.environ, LAB_HW_DIR=str(hw_dir(host)))
        tool = str(Path(nicmodel.__file__).with_name("ethtool.py"))
        ethtool = timed(
            lambda: subprocess.run([sys.executable, tool, "-S", "eth2"], env=env, capture_output=True, check=True), 5
        )
        libdir = nvml.build(lab / "lib", "current").parent
        nenv = dict(os.environ, LD_LIBRARY_PATH=str(libdir), FAKE_NVML_STATE=str(hw_dir(host) / "nvml.json"))
        pynvml = timed(
            lambda: subprocess.run([sys.executable, "-c", PYNVML_READ], env=nenv, capture_output=True, check=True), 5
        )
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "loadavg_1m": os.getloadavg()[0],
        },
        "when": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hosts": args.hosts,
        "provision_ms_per_host": round(provision_s / args.hosts * 1000, 1),
        "ticker_pass_s": tick,
        "ticker_files_per_pass": tick_files[-1] if tick_files else 0,
        "ethtool_S_process_s": ethtool,
        "pynvml_init_and_read_8_gpus_process_s": pynvml,
    }
    out = args.out or Path(__file__).parent / "results" / f"lab-hardware-{datetime.now(timezone.utc):%Y%m%d}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
