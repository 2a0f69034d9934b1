"""Lab timings: template build, `lab up` from the cached template, `lab down`.

Usage (root): python3 benchmarks/lab/timings.py [--hosts 4,20] [--repeat 3]
                  [--template-build] [--out benchmarks/lab/results.json]

Runs its own lab (prefix ``bench``, bridge ``benchbr0``, 10.76.0.0/16, state
in a temporary directory) so it never disturbs a lab that is up.
``--template-build`` also times a from-scratch template build into a
temporary cache (debootstrap from apt's mirror; about a minute).
Writes one JSON document: machine facts and every measurement in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from clusterctl.lab import manager, template
from clusterctl.lab.config import LabConfig


def _timed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return round(time.monotonic() - t0, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="4,20", help="comma-separated lab sizes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--template-build", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).with_name("results.json")))
    args = ap.parse_args()
    manager.require_root()
    work = Path(tempfile.mkdtemp(prefix="clusterctl-bench-", dir="/var/tmp"))
    os.chmod(work, 0o755)
    cfg = LabConfig(lab_dir=work / "lab", bridge="benchbr0", net="10.76", prefix="bench")
    result: dict = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # The CPUs may be shared: the load says how quiet the run was.
        "loadavg_1m_before": os.getloadavg()[0],
    }
    try:
        if args.template_build:
            cache = work / "cache"
            result["template_build_s"] = _timed(lambda: template.ensure(cache))
            result["template_size_mb"] = round(
                sum(f.stat().st_size for f in cache.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6
            )
            shutil.rmtree(cache)
        template.ensure(cfg.cache_dir)  # the runs below start from the cached template
        for n in (int(x) for x in args.hosts.split(",")):
            ups, downs, ready = [], [], []
            for _ in range(args.repeat):
                t0 = time.monotonic()
                res = manager.up(cfg, hosts=n)
                ups.append(round(time.monotonic() - t0, 3))
                ready.append(round(res.ready_s, 3))
                downs.append(_timed(lambda: manager.down(cfg)))
            result[f"up_{n}_hosts_s"] = {"runs": ups, "median": statistics.median(ups)}
            result[f"ready_{n}_hosts_s"] = {"runs": ready, "median": statistics.median(ready)}
            result[f"down_{n}_hosts_s"] = {"runs": downs, "median": statistics.median(downs)}
            print(f"{n} hosts: up {statistics.median(ups)} s, down {statistics.median(downs)} s", file=sys.stderr)
    finally:
        manager.down(cfg)
        shutil.rmtree(work, ignore_errors=True)
    result["loadavg_1m_after"] = os.getloadavg()[0]
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.rename(out)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
