"""Doctor benchmark: `clusterctl doctor all` over an N-host nspawn lab (default 16).

Brings up its own lab (``CLUSTERCTL_LAB_*`` defaults below, so a working lab
is left alone), adds instances over the hosts (two TP-2 groups per host), and
runs ``clusterctl doctor all --json --interval I`` as a fresh process
``--rounds`` times, then as many times with ``--interval 0`` (one sample,
no waiting: the cost of the round trips alone). The issue's target: a run finishes within its sampling
interval plus 3 s. ``--baseline REV``: also run the clusterctl of git revision
REV (exported to a scratch directory), alternating with this tree round by
round, so that both see the same load on a shared machine. Writes
``benchmarks/results/doctor-<date>.json`` (wall seconds per round, the 1-minute
load average before each round, exit codes, finding counts) and tears the lab
down unless ``--keep``. Needs root.

Example: python3 benchmarks/doctor/run.py --hosts 16 --interval 2 --rounds 5 --baseline 96c76d9
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

ENV = {
    "CLUSTERCTL_LAB_DIR": "/var/lib/clusterctl-lab-doc",
    "CLUSTERCTL_LAB_BRIDGE": "labdoc0",
    "CLUSTERCTL_LAB_NET": "10.83",
    "CLUSTERCTL_LAB_PREFIX": "doc",
}


def with_instances(inventory: Path, names: list[str], out: Path) -> Path:
    data = yaml.safe_load(inventory.read_text())
    engine = next(iter(data.get("engines") or {"vllm": None}))
    data["models"] = {
        "qwen3-8b": {
            "path": "/models/qwen3-8b",
            "arch": {
                "layers": 36,
                "hidden_size": 4096,
                "attention_heads": 32,
                "kv_heads": 8,
                "head_dim": 128,
                "vocab": 151936,
                "params": 8190735360,
                "dtype": "bfloat16",
            },
        }
    }
    data["instances"] = {}
    for h in names:
        for k, gpus in enumerate(("[0-1]", "[2-3]")):
            data["instances"][f"{h}-{k}"] = {
                "model": "qwen3-8b",
                "engine": engine,
                "placement": f"{h}:{gpus}",
                "port": 8100 + k,
                "args": {"max-model-len": 32768, "gpu-memory-utilization": 0.85},
            }
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def export(rev: str, dest: Path) -> Path:
    """The tree of git revision ``rev`` (its clusterctl/ and checks/) in ``dest``."""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "clusterctl", "checks"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def one_round(tree: Path, inv: Path, interval: float) -> dict:
    """``clusterctl doctor`` of ``tree`` as a fresh process; wall time, phases, findings."""
    load = os.getloadavg()[0]
    env = dict(os.environ, PYTHONPATH=str(tree))
    t = time.monotonic()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "clusterctl.cli.main",
            "doctor",
            "all",
            "-i",
            str(inv),
            "--json",
            "--interval",
            str(interval),
            "--sudo",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tree,
        env=env,
    )
    wall = time.monotonic() - t
    doc = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {}
    return {
        "interval_s": interval,
        "wall_s": round(wall, 3),
        "exit_code": p.returncode,
        "load_1m": round(load, 2),
        "in_process_s": doc.get("meta", {}).get("duration_s"),
        "phases_s": doc.get("meta", {}).get("phases_s"),
        "counts": doc.get("summary", {}).get("counts"),
        "not_ok": sorted({f["check"] for f in doc.get("findings", []) if f["severity"] != "OK"}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    ap.add_argument("--baseline", metavar="REV", help="also time the clusterctl of this git revision")
    args = ap.parse_args()
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    from clusterctl.lab.config import LabConfig
    from clusterctl.lab.session import LabSession

    cfg = LabConfig.from_env()
    t0 = time.monotonic()
    session = LabSession.start(cfg, hosts=args.hosts, on_event=lambda s: print(f"lab: {s}", file=sys.stderr))
    up_s = time.monotonic() - t0
    rounds = []
    try:
        for name in session.names:  # a fresh lab host has no kern.log yet (no kernel line logged)
            session.run(name, ": >> /var/log/kern.log", check=True)
        scratch = tempfile.TemporaryDirectory(prefix="doctor-bench-")
        inv = with_instances(Path(session.inventory), session.names, Path(scratch.name) / "inventory.yaml")
        trees = {"current": REPO}
        if args.baseline:
            trees["baseline"] = export(args.baseline, Path(scratch.name) / "baseline")
        for interval in [args.interval] * args.rounds + [0.0] * args.rounds:
            for label, tree in trees.items():
                rounds.append(one_round(tree, inv, interval) | {"tree": label})
                print(
                    f"round {label}: {rounds[-1]['wall_s']:.2f} s, exit {rounds[-1]['exit_code']}, "
                    f"load {rounds[-1]['load_1m']}",
                    file=sys.stderr,
                )
    finally:
        if not args.keep:
            session.stop()
        if "scratch" in locals():
            scratch.cleanup()

    def median(label: str, interval: float) -> float | None:
        walls = [r["wall_s"] for r in rounds if r["tree"] == label and r["interval_s"] == interval]
        return statistics.median(walls) if walls else None

    result = {
        "benchmark": "doctor",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()},
        "hosts": args.hosts,
        "gpus_per_host": 8,
        "instances": 2 * args.hosts,
        "interval_s": args.interval,
        "lab_up_s": round(up_s, 2),
        "rounds": rounds,
        "median_wall_s": median("current", args.interval),
        "median_wall_s_interval_0": median("current", 0.0),
        "baseline": args.baseline,
        "baseline_median_wall_s": median("baseline", args.interval),
        "baseline_median_wall_s_interval_0": median("baseline", 0.0),
        "target_s": args.interval + 3,
        "within_target": (median("current", args.interval) or 1e9) <= args.interval + 3,
        "command": "clusterctl doctor all -i INV --json --interval I --sudo (fresh process each round)",
    }
    out = REPO / "benchmarks" / "results" / f"doctor-{dt.datetime.now():%Y-%m-%dT%H%M}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_wall_s", "baseline_median_wall_s", "target_s", "within_target")}))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
