"""Advance every lab host's fake sysfs counters with wall-clock time.

``python3 -m clusterctl.lab.hardware.ticker LAB_DIR [--interval S] [--once]``

Every ``interval`` seconds (default 1) it finds the hosts under ``LAB_DIR``
(any ``*/hw/nic.json`` or ``*/*/hw/nic.json``), re-reads each host's NIC state
(so injected faults apply at once) and rewrites the counter files whose
value changed, each atomically.  The fake tools compute the same values from
the same state and clock, so sysfs and ``ethtool``/``rdma`` agree.  A broken
or vanished host is skipped, never fatal.  SIGTERM/SIGINT stop it cleanly
(exit 0).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from clusterctl.lab.hardware import nics, sysfs


def host_hw_dirs(lab_dir: Path) -> list[Path]:
    """The ``hw`` directories of every provisioned host under ``lab_dir``."""
    found = set(lab_dir.glob("*/hw/nic.json")) | set(lab_dir.glob("*/*/hw/nic.json"))
    return sorted(p.parent for p in found)


def tick(lab_dir: Path, caches: dict[Path, dict[str, Any]], now: float | None = None) -> int:
    """One pass over every host; returns the number of files rewritten.

    ``caches`` keeps, per host, the parsed ``nic.json`` (re-read only when the
    file changed: faults replace it) and the last value written to each file.
    """
    written = 0
    t = time.time() if now is None else now
    for hw in host_hw_dirs(lab_dir):
        entry = caches.setdefault(hw, {"sig": None, "state": None, "files": {}})
        try:
            st = os.stat(hw / nics.STATE_FILE)
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
            if sig != entry["sig"]:
                entry["state"], entry["sig"] = nics.load(hw), sig
            written += sysfs.refresh_counters(hw, entry["state"], t, entry["files"])
        except (OSError, ValueError, KeyError):
            caches.pop(hw, None)  # half-provisioned or being removed: try again next time
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m clusterctl.lab.hardware.ticker", description="Advance the lab's fake NIC counters in sysfs."
    )
    ap.add_argument("lab_dir", type=Path, help="lab state directory holding the host dirs")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between passes (default 1)")
    ap.add_argument("--once", action="store_true", help="one pass, then exit")
    args = ap.parse_args(argv)
    if not args.lab_dir.is_dir():
        print(f"ticker: {args.lab_dir}: no such directory", file=sys.stderr)
        return 3
    stop = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    caches: dict[Path, dict[str, Any]] = {}
    while True:
        started = time.monotonic()
        tick(args.lab_dir, caches)
        if args.once or stop:
            return 0
        # Sleep in short steps so a signal ends the loop promptly.
        while not stop and time.monotonic() - started < args.interval:
            time.sleep(min(0.1, args.interval))
        if stop:
            return 0


if __name__ == "__main__":
    sys.exit(main())
