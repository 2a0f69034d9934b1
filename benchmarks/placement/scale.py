"""How long placement takes on large fleets: a first placement, a no-change re-run, a scale-up.

Fleets of N hosts with 8 GPUs each (two sockets, GPU pairs on one PCIe
switch, as facts ``gpus.topology`` reports them), one TP-2 template filling
all but a few GPU pairs, one explicit TP-1 instance per 16 hosts.  Times
``desired_instances`` (pure; no I/O) for: the first placement of every
replica, a second run on the saved state (nothing to place: what every
deploy pays), and scaling up by 1% of the replicas.  Each figure is the
median of ``--repeat`` runs, in seconds.

Usage: python benchmarks/placement/scale.py [--sizes 100,1000,2000] [--repeat 3]
Writes ``benchmarks/results/placement-<date>.json`` (temp file + rename).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from clusterctl.deploy.placement.place import desired_instances  # noqa: E402
from clusterctl.deploy.state import DeployState  # noqa: E402
from clusterctl.inventory.model import (  # noqa: E402
    Engine,
    GpuRef,
    GpuSpec,
    Host,
    Instance,
    InstanceTemplate,
    Inventory,
    Model,
)


def topology8() -> list[dict[str, Any]]:
    out = []
    for a in range(8):
        for b in range(a + 1, 8):
            level = "SINGLE" if a // 2 == b // 2 else "NODE" if a // 4 == b // 4 else "SYSTEM"
            out.append({"gpus": [a, b], "level": level})
    return out


def fleet(n: int) -> tuple[Inventory, int]:
    inv = Inventory(path="bench.yaml")
    inv.models["m"] = Model(name="m", path="/models/m")
    inv.engines["e"] = Engine(name="e", path="/opt/vllm/bin/vllm", version="0.11.0")
    for i in range(n):
        name = f"gpu{i:05d}"
        inv.hosts[name] = Host(name=name, address=name, gpus=GpuSpec(count=8, interconnect="nvlink"))
        if i % 16 == 0:
            inv.instances[f"x{i}"] = Instance(
                name=f"x{i}", model="m", engine="e", placement=(GpuRef(name, 7),), port=9000
            )
    replicas = n * 4 - n // 16 - 4
    inv.templates["pool"] = InstanceTemplate(
        name="pool", model="m", engine="e", replicas=replicas, tp=2, hosts="gpu*", port_base=8000
    )
    return inv, replicas


def median_s(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times), 4), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000,2000")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        inv, replicas = fleet(n)
        topo = {h: topology8() for h in inv.hosts}
        first_s, first = median_s(lambda: desired_instances(inv, DeployState(), topology=topo), args.repeat)
        again_s, again = median_s(lambda: desired_instances(inv, first.state, topology=topo), args.repeat)
        assert not again.changed
        grown = first.state.copy()
        grown.replicas["pool"] = replicas + max(1, replicas // 100)
        grow_s, up = median_s(lambda: desired_instances(inv, grown, topology=topo), args.repeat)
        rows.append(
            {
                "hosts": n,
                "gpus": n * 8,
                "replicas": replicas,
                "placed": len(first.new),
                "first_placement_s": first_s,
                "rerun_nothing_to_place_s": again_s,
                "scale_up_1pct_s": grow_s,
                "scale_up_added": len(up.new),
                "scale_up_unplaced": len(up.unplaced),
            }
        )
        print(json.dumps(rows[-1]))
    doc = {
        "benchmark": "placement",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "results": rows,
    }
    out = REPO / "benchmarks" / "results" / f"placement-{datetime.now(timezone.utc):%Y-%m-%dT%H%M}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
