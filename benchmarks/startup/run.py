"""CLI start-up benchmark: the same commands from two source trees, interleaved.

Compares ``--before`` (a checkout of an older revision, e.g. made with
``git worktree add /tmp/before REV``) with this tree: ``--help``,
``inventory validate`` and ``exec`` on 1 and on 100 light-mode lab hosts that
the script starts itself (127.5.x.y).  Each run is a fresh interpreter that
imports clusterctl from the given tree (the editable-install finder is removed
from ``sys.meta_path``), so the numbers are start-up plus work.  Reports the
median wall and client CPU (user + sys) milliseconds per case and tree, and
the load average.  Writes ``benchmarks/results/startup-<date>.json``.  Needs
root (light lab).

Example: python3 benchmarks/startup/run.py --before /tmp/before --rounds 9
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))

from clusterctl.lab import light  # noqa: E402

LAB_DIR = Path("/var/lib/clusterctl-lab/bench-startup")
WRAP = (
    "import sys, runpy\n"
    "sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
    "tree = sys.argv.pop(1); sys.path.insert(0, tree)\n"
    "runpy.run_module('clusterctl.cli.main', run_name='__main__', alter_sys=True)"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="source tree of the older revision")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    trees = {"before": str(Path(args.before).resolve()), "after": str(REPO)}
    work = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env.update(
        HOME=str(work),
        XDG_STATE_HOME=str(work / "state"),
        XDG_CONFIG_HOME=str(work / "config"),
        CLUSTERCTL_SSH_CONFIG="none",
    )
    if light._read_state(LAB_DIR):
        light.down(LAB_DIR)
    inv = str(light.up(LAB_DIR, args.hosts, base="127.5"))
    first = "lh0001"
    cases = {
        "help": ["--help"],
        "inventory-validate": ["inventory", "validate", "-i", inv],
        "exec-1host": ["exec", "-i", inv, first, "--json", "--", "true"],
        f"exec-{args.hosts}hosts": ["exec", "-i", inv, "all", "--fanout", "64", "--json", "--", "true"],
    }
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    loads = [os.getloadavg()[0]]
    try:
        for tree in trees.values():  # byte-compile outside the measured runs
            subprocess.run([sys.executable, "-m", "compileall", "-q", f"{tree}/clusterctl"], capture_output=True)
        for _ in range(args.rounds):
            for case, argv in cases.items():
                for name, tree in trees.items():
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t0 = time.perf_counter()
                    p = subprocess.run(
                        [sys.executable, "-c", WRAP, tree, *argv], cwd=tree, env=env, capture_output=True, timeout=120
                    )
                    wall = time.perf_counter() - t0
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    if p.returncode != 0:
                        raise SystemExit(f"{name} {case}: rc {p.returncode}: {p.stderr.decode()[-500:]}")
                    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                    runs.setdefault((case, name), []).append((wall, cpu))
            loads.append(os.getloadavg()[0])
    finally:
        light.down(LAB_DIR)
        shutil.rmtree(work, ignore_errors=True)
    summary = [
        {
            "case": c,
            "tree": t,
            "runs": len(v),
            "wall_median_ms": round(statistics.median(w for w, _ in v) * 1000),
            "wall_min_ms": round(min(w for w, _ in v) * 1000),
            "cpu_median_ms": round(statistics.median(c for _, c in v) * 1000),
        }
        for (c, t), v in runs.items()
    ]
    for row in summary:
        print(json.dumps(row))
    date = dt.datetime.now().strftime("%Y-%m-%dT%H%M")
    data = {
        "date": date,
        "trees": trees,
        "rounds": args.rounds,
        "hosts": args.hosts,
        "load_1min": {"min": min(loads), "max": max(loads)},
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "summary": summary,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"startup-{date}.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, target)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
