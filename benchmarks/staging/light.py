"""Staging by relay chain on 2-32 light lab hosts: wall time against S/B, and where each node's time goes.

The release benchmark's set-up (``benchmarks/release/run.py``) without the release: a
light lab (one real sshd per host on a loopback address, real SSH through
``clusterctl.fleet``), nginx in a network namespace of its own behind a veth pair tbf
limits to B both ways (so the head reads the source at B), a model of S random bytes.
For each host count (``--hosts``, default 2,4,8,16,32) and ``--repeat`` times, the
model is staged afresh (``clusterctl.stage.run.stage_model``, chain) and timed.

Every run records the 1-minute load average before and after, and per node: the wall
time seen here, the node program's own seconds, ``start_s`` (from the call here to the
node program's start: SSH connect, exec, the interpreter and the program's imports),
``end_s`` (from the call here to the node program's end), first and last chunk
written, the head's last chunk forwarded and the node program's CPU seconds; per run the
share of this machine's CPUs busy over it (``machine_busy``, /proc/stat, whoever used them)
and the chain's breakdown (``chain``: head start, head's last chunk, the tail's last chunk
after it, the end after that).  The summary per host count gives the median seconds and
x S/B, the median latest node start and node seconds, and the medians of those.

Writes ``benchmarks/results/staging-light-<date>.json`` (temp + rename).  Needs root.
Tears down its lab and nginx.

Example: nice -n 10 python3 benchmarks/staging/light.py --hosts 2,4,8,16,32 --repeat 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from clusterctl.fleet import Fleet  # noqa: E402
from clusterctl.inventory.loader import load_inventory  # noqa: E402
from clusterctl.inventory.model import Model  # noqa: E402
from clusterctl.lab import light, netfaults  # noqa: E402
from clusterctl.node.stage import manifest as mf  # noqa: E402
from clusterctl.stage.plan import load_manifest, parse_source, write_manifest  # noqa: E402
from clusterctl.stage.run import stage_model  # noqa: E402

_spec = importlib.util.spec_from_file_location("release_run", HERE.parent / "release" / "run.py")
assert _spec and _spec.loader
release_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(release_run)

MODEL_PATH = "/root/models/bench"


def node_row(r: Any, t0_unix: float) -> dict[str, Any]:
    t = r.data.get("timings") or {}

    def since(key: str) -> float | None:
        return None if t.get(key) is None else round(t[key] - t0_unix, 3)

    return {
        "host": r.host,
        "wall_s": round(r.duration_s, 3),
        "node_s": r.data.get("seconds"),
        "start_s": since("start_unix"),
        "end_s": since("end_unix"),
        "first_chunk_s": t.get("first_chunk_s"),
        "last_chunk_s": t.get("last_chunk_s"),
        "last_sent_s": t.get("last_sent_s"),
        "cpu_s": t.get("cpu_s"),
        "upstream": r.data.get("upstream"),
        "events": r.data.get("events"),
        "chunks_from_relay": r.data.get("chunks"),
    }


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU of this machine since boot (/proc/stat)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]  # idle + iowait
    return sum(f) - idle, sum(f)


def chain_row(nodes: list[dict[str, Any]], seconds: float, relay: str = "chain") -> dict[str, Any]:
    """Where a relay's time went: the head's start, its last chunk, the last node's last chunk
    after the head's (a chain: the per-hop forward delay summed over its hops), the end after
    the last chunk anywhere."""

    def at(x: dict[str, Any]) -> float | None:
        return None if x["start_s"] is None or x["last_chunk_s"] is None else x["start_s"] + x["last_chunk_s"]

    head = nodes[0]
    h = at(head)
    out: dict[str, Any] = {"head_start_s": head["start_s"], "head_last_chunk_s": None if h is None else round(h, 3)}
    ends = [t for t in (at(x) for x in nodes) if t is not None]
    if ends and at(head) is not None and len(nodes) > 1:
        lag = max(ends) - at(head)  # type: ignore[operator]
        out["chain_lag_s"] = round(lag, 3)
        if relay == "chain":
            out["per_hop_s"] = round(lag / (len(nodes) - 1), 4)
    if ends:
        out["after_last_chunk_s"] = round(seconds - max(ends), 3)
    return out


def summary(runs: list[dict[str, Any]], bound: float) -> list[dict[str, Any]]:
    out = []
    for n, relay in sorted({(r["hosts"], r.get("relay", "chain")) for r in runs}):
        rows = [r for r in runs if r["hosts"] == n and r.get("relay", "chain") == relay]
        secs = statistics.median(r["seconds"] for r in rows)
        starts = [max(x["start_s"] for x in r["nodes"] if x["start_s"] is not None) for r in rows]
        heads = [r["nodes"][0]["start_s"] for r in rows if r["nodes"][0]["start_s"] is not None]
        node_s = [max(x["node_s"] or 0 for x in r["nodes"]) for r in rows]

        def med(key: str, rows: list[dict[str, Any]] = rows) -> float | None:
            vals = [r[key] for r in rows if r.get(key) is not None]
            return round(statistics.median(vals), 3) if vals else None

        def med_chain(key: str, rows: list[dict[str, Any]] = rows) -> float | None:
            vals = [r["chain"][key] for r in rows if r.get("chain", {}).get(key) is not None]
            return round(statistics.median(vals), 3) if vals else None

        out.append(
            {
                "hosts": n,
                "relay": relay,
                "runs": len(rows),
                "median_s": round(secs, 2),
                "x_S_over_B": round(secs / bound, 2),
                "min_s": min(r["seconds"] for r in rows),
                "max_s": max(r["seconds"] for r in rows),
                "median_head_start_s": round(statistics.median(heads), 2) if heads else None,
                "median_last_start_s": round(statistics.median(starts), 2),
                "median_longest_node_s": round(statistics.median(node_s), 2),
                "median_chain_lag_s": med_chain("chain_lag_s"),
                "median_per_hop_s": med_chain("per_hop_s"),
                "median_after_last_chunk_s": med_chain("after_last_chunk_s"),
                "median_nodes_cpu_s": med("nodes_cpu_s"),
                "median_machine_busy": med("machine_busy"),
                "load1": [min(r["load1_before"] for r in rows), max(r["load1_after"] for r in rows)],
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", default="2,4,8,16,32", help="host counts, comma-separated (at most 100)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per host count")
    ap.add_argument("--rate", default="50mbit", help="B: the source's rate")
    ap.add_argument("--size", default="64M", help="model size S (random bytes in 64 MiB shards)")
    ap.add_argument("--workers", type=int, default=8, help="ranged reads per node")
    ap.add_argument("--lab-dir", default="/var/lib/clusterctl-lab-27/staging-light")
    ap.add_argument("--base", default="127.27", help="light hosts' addresses: BASE.x.y")
    ap.add_argument(
        "--net",
        default=os.environ.get("CLUSTERCTL_LAB_NET", "10.27"),
        help="the source's link is NET.250.0/30 (default: $CLUSTERCTL_LAB_NET)",
    )
    ap.add_argument("--netns", default="ccstl27src", help="the source's network namespace")
    ap.add_argument(
        "--relay",
        default="chain",
        help="chain, tree (fan-out 2) or both (the two alternate per run, at the same load)",
    )
    ap.add_argument("--label", default="", help="a word for the result's name and record (e.g. before, after)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    if max(counts) > 100:
        ap.error("--hosts: at most 100 hosts on this shared machine")
    total = int(float(args.size[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[args.size[-1].upper()])
    bound = total * 8 / netfaults.parse_rate(args.rate)
    lab = Path(args.lab_dir)
    if light._read_state(lab):
        light.down(lab)
    work = Path(tempfile.mkdtemp(prefix="staging-light-"))
    os.chmod(work, 0o755)
    release_run.write_random_model(work / "v1", total)
    write_manifest(str(work / "v1"), mf.compute(str(work / "v1"), "bench", "v1", 1 << 20))
    started = dt.datetime.now(dt.timezone.utc)
    runs: list[dict[str, Any]] = []
    inv_path = light.up(lab, max(counts), base=args.base, prefix="sl")
    model = Model("bench", MODEL_PATH)
    try:
        inv = load_inventory(str(inv_path))
        names_all = sorted(inv.hosts)
        with release_run.Source(args.netns, args.net, work, args.rate) as src:
            source = parse_source(src.url("v1"))
            man = load_manifest(source, "bench", "v1")
            for n in counts:
                hosts = [inv.hosts[h] for h in names_all[:n]]
                for k in range(args.repeat * (2 if args.relay == "both" else 1)):
                    relay = args.relay if args.relay != "both" else ("chain", "tree")[k % 2]
                    with Fleet(hosts, fanout=n, command_timeout=600) as fl:
                        fl.run("rm -rf /root/models", timeout=60)
                    load = round(os.getloadavg()[0], 2)
                    with Fleet(hosts, fanout=n, command_timeout=600) as fl:
                        j0 = cpu_jiffies()
                        t0, t0_unix = time.monotonic(), time.time()
                        rep = stage_model(fl, hosts, model, source, man, relay=relay, workers=args.workers)
                        secs = time.monotonic() - t0
                        j1 = cpu_jiffies()
                    nodes = [node_row(r, t0_unix) for r in rep.rows]
                    cpus = [x["cpu_s"] for x in nodes if x["cpu_s"] is not None]
                    row = {
                        "hosts": n,
                        "relay": relay,
                        "run": k,
                        "seconds": round(secs, 3),
                        "x_S_over_B": round(secs / bound, 3),
                        "ok": rep.ok,
                        "load1_before": load,
                        "load1_after": round(os.getloadavg()[0], 2),
                        "nodes_cpu_s": round(sum(cpus), 3) if cpus else None,
                        # every CPU of this machine busy (all processes) over the run: 1.0 = saturated
                        "machine_busy": round((j1[0] - j0[0]) / max(1, j1[1] - j0[1]), 3),
                        "chain": chain_row(nodes, secs, relay),
                        "nodes": nodes,
                        "failures": [r.to_dict() for r in rep.rows if not r.ok],
                    }
                    print(
                        json.dumps(
                            {
                                k2: row[k2]
                                for k2 in (
                                    "hosts",
                                    "relay",
                                    "run",
                                    "seconds",
                                    "x_S_over_B",
                                    "ok",
                                    "load1_before",
                                    "nodes_cpu_s",
                                    "machine_busy",
                                    "chain",
                                )
                            }
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
                    runs.append(row)
                with Fleet(hosts, fanout=n, command_timeout=600) as fl:
                    fl.run("rm -rf /root/models", timeout=60)
    finally:
        light.down(lab)
        shutil.rmtree(work, ignore_errors=True)
    doc = {
        "benchmark": "staging-light",
        "label": args.label,
        "date": started.isoformat(timespec="seconds"),
        "bytes": total,
        "rate": args.rate,
        "S_over_B_s": round(bound, 3),
        "workers": args.workers,
        "machine": f"{os.cpu_count()} shared CPUs; light lab hosts (sshd in namespaces)",
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "summary": summary(runs, bound),
        "runs": runs,
    }
    name = f"staging-light-{started:%Y-%m-%dT%H%M}" + (f"-{args.label}" if args.label else "") + ".json"
    out = Path(args.out or REPO / "benchmarks" / "results" / name)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    for s in doc["summary"]:
        print(json.dumps(s))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
