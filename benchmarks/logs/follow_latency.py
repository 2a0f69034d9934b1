#!/usr/bin/env python3
"""How long a line written on a host takes to show in ``clusterctl logs -f``.

Needs a lab (``clusterctl lab up --hosts 16``; any size) and root.  Writes an
inventory that adds one instance per host (``lat-HOST`` on GPU 0), starts
``clusterctl logs 'lat-*' -f -n 0 --json`` (one SSH channel per host), then, round
after round, runs a transient ``clusterctl-lat-HOST.service`` on every host at once
that echoes the node's clock (``date +%s.%N``).  Latency = when the line is read
from clusterctl's stdout here minus the node's clock at the echo (the lab's hosts
share this machine's clock).  Results: ``benchmarks/results/logs-follow-latency-*.json``.

    python3 benchmarks/logs/follow_latency.py --inventory /var/lib/clusterctl-lab-24/inventory.yaml --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from clusterctl.inventory.loader import load_inventory  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inventory", required=True, help="The lab's inventory.")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()

    inv = load_inventory(args.inventory)
    hosts = list(inv.hosts)
    data = yaml.safe_load(Path(args.inventory).read_text())
    data.setdefault("models", {})["lat-model"] = {
        "path": "/models/lat",
        "arch": {
            "layers": 2,
            "hidden_size": 64,
            "attention_heads": 4,
            "kv_heads": 4,
            "head_dim": 16,
            "vocab": 1000,
            "params": 1000000,
            "dtype": "bfloat16",
        },
    }
    engine = next(iter(data.get("engines") or {"vllm": None}))
    data["instances"] = {
        f"lat-{h}": {"model": "lat-model", "engine": engine, "placement": f"{h}:0", "port": 8000} for h in hosts
    }
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"clusterctl-logs-latency-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    inv_path = work / "inventory.yaml"
    inv_path.write_text(yaml.safe_dump(data, sort_keys=False))
    env = dict(os.environ, PYTHONPATH=str(ROOT), CLUSTERCTL_INVENTORY=str(inv_path), XDG_STATE_HOME=str(work / "state"))

    arrivals: "queue.Queue[tuple[float, dict]]" = queue.Queue()
    t_start = time.monotonic()
    follower = subprocess.Popen(
        [sys.executable, "-m", "clusterctl.cli.main", "logs", "lat-*", "-f", "-n", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        bufsize=1,
    )

    def reader() -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            arrivals.put((time.time(), json.loads(line)))

    threading.Thread(target=reader, daemon=True).start()
    write = "systemd-run --quiet --collect --unit=clusterctl-lat-$(hostname).service sh -c 'echo MARK $(date +%s.%N)'"

    def write_marks() -> None:
        subprocess.run(
            [sys.executable, "-m", "clusterctl.cli.main", "exec", "all", "--sudo", "--", write],
            env=env,
            capture_output=True,
            timeout=120,
        )

    def collect(wait_s: float, on_mark) -> set[str]:
        seen: set[str] = set()
        deadline = time.monotonic() + wait_s
        while len(seen) < len(hosts) and time.monotonic() < deadline:
            try:
                at, doc = arrivals.get(timeout=0.5)
            except queue.Empty:
                continue
            msg = doc.get("message", "")
            if msg.startswith("MARK "):
                seen.add(doc["host"])
                on_mark(doc["host"], at - float(msg.split()[1]))
        return seen

    # the follower is up when marks arrive from every host (it starts with -n 0: earlier ones are not shown)
    ready: set[str] = set()
    for _ in range(20):
        write_marks()
        ready |= collect(3, lambda h, lat: None)
        if len(ready) == len(hosts):
            break
    ready_s = time.monotonic() - t_start
    if len(ready) < len(hosts):
        print(f"error: only {len(ready)}/{len(hosts)} hosts streamed within {ready_s:.0f} s", file=sys.stderr)
    time.sleep(1)
    while not arrivals.empty():
        arrivals.get()
    latencies: list[float] = []
    per_host: dict[str, list[float]] = {h: [] for h in hosts}
    missing = 0
    rounds = 0

    def record(h: str, lat: float) -> None:
        latencies.append(lat)
        per_host[h].append(lat)

    for _ in range(args.rounds):
        write_marks()
        missing += len(hosts) - len(collect(10, record))
        rounds += 1
        time.sleep(0.5)
    follower.terminate()
    try:
        follower.wait(timeout=15)
    except subprocess.TimeoutExpired:
        follower.kill()

    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else float("nan")

    result = {
        "benchmark": "logs -f latency: line written on a host -> printed by clusterctl",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hosts": len(hosts),
        "rounds": rounds,
        "lines": len(latencies),
        "missing": missing,
        "follower_ready_s": round(ready_s or 0, 2),
        "latency_s": {
            "p50": round(pct(0.5), 3),
            "p95": round(pct(0.95), 3),
            "max": round(latencies[-1], 3) if latencies else None,
            "mean": round(statistics.mean(latencies), 3) if latencies else None,
        },
        "per_host_max_s": {h: round(max(v), 3) for h, v in per_host.items() if v},
        "machine": {"cpus": os.cpu_count(), "load1": os.getloadavg()[0]},
    }
    out = Path(args.out) / f"logs-follow-latency-{time.strftime('%Y-%m-%dT%H%M', time.gmtime())}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("hosts", "rounds", "lines", "missing", "latency_s")}))
    print(f"written: {out}")
    return 0 if latencies and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
