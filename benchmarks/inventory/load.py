"""How long loading, validating and selecting from a large inventory takes.

Generates inventories of N hosts (8 GPUs each, racks of 32 as groups with
labels, one TP-8 instance per host outside rack1, a template over rack1) in memory, then times
``load_inventory_text`` (parse + validate + merge, ssh_config off),
``select_hosts`` with a mixed pattern and ``fold`` of all names.  Each figure
is the median of ``--repeat`` runs, in milliseconds.

Usage: python benchmarks/inventory/load.py [--sizes 128,1024,4096] [--repeat 5]
Writes ``benchmarks/results/inventory-load-<date>.json`` (temp file + rename).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def make_inventory(n: int) -> str:
    racks = (n + 31) // 32
    lines = [
        "version: 1",
        "defaults:",
        "  gpus: {count: 8, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}",
        "  nics: [{netdev: eno1, role: management}, {netdev: ens101np0, rdma_device: mlx5_0}]",
        "groups:",
    ]
    for r in range(racks):
        lo, hi = r * 32 + 1, min(n, r * 32 + 32)
        lines.append(f"  rack{r + 1}: {{hosts: 'gpu[{lo:05d}-{hi:05d}]', labels: {{rack: r{r + 1}}}}}")
    lines += [
        "hosts:",
        f"  gpu[00001-{n:05d}]: {{}}",
        "engines: {v: {path: /opt/vllm/bin/vllm, version: 0.11.0}}",
        "models: {m: {path: /models/m, arch: {attention_heads: 64, kv_heads: 8}}}",
        "instances:",
    ]
    for i in range(33, n + 1):  # rack1 stays free for the template
        lines.append(f"  i{i}: {{model: m, engine: v, placement: 'gpu{i:05d}:[0-7]', port: 8000}}")
    lines += ["templates:", "  pool: {model: m, engine: v, replicas: 1, tp: 8, hosts: '@rack1'}"]
    return "\n".join(lines) + "\n"


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return round(statistics.median(times), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="128,1024,4096")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    os.environ["CLUSTERCTL_SSH_CONFIG"] = "none"
    from clusterctl.inventory.loader import load_inventory_text
    from clusterctl.inventory.nodeset import fold
    from clusterctl.inventory.select import select_hosts

    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        text = make_inventory(n)
        inv = load_inventory_text(text, f"bench-{n}.yaml")
        pattern = "@rack1,rack=r2&!gpu00033,gpu[00100-00120]" if n >= 128 else "all"
        row = {
            "hosts": n,
            "instances": len(inv.instances),
            "yaml_bytes": len(text),
            "load_ms": median_ms(lambda: load_inventory_text(text, "b.yaml"), args.repeat),
            "select_ms": median_ms(lambda: select_hosts(inv, pattern), args.repeat),
            "fold_ms": median_ms(lambda: fold(inv.hosts), args.repeat),
        }
        rows.append(row)
        print(json.dumps(row))
    result = {
        "benchmark": "inventory-load",
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"inventory-load-{datetime.now(timezone.utc):%Y%m%d}.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, target)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
