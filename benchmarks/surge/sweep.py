"""The surge term of the release model, refitted over several replica counts.

Runs the surge benchmark (``benchmarks/release/surge.py``: in place against
``deploy --surge-strict``, ``--serial 1``, one replica per lab host behind real nginx)
once per ``--replicas`` value, one after the other, on the lab of ``CLUSTERCTL_LAB_*``
(brought up at each count's size by the benchmark itself), and samples the 1-minute
load average every 5 s while each runs.

With ``--serial 1`` every replica is one batch, so a release of n replicas takes
``T(n) = a + b * n``: ``b`` is one batch (drain, restart, load, gates and, with
``--surge``, the surge copy's start, gates and the gateway's syncs).  Fitted by least
squares per release kind; the surge factor of the release model is then
``f = b_surge / b_in_place - 1`` (each batch paid ``1 + f`` times).  Also per count:
``T_surge / T_in_place - 1`` (what one run at that count alone would give).

Writes ``benchmarks/results/surge-sweep-<date>.json`` (temp + rename): each run's
result file as the benchmark wrote it, the loads, the fit.  Needs root.

Example: nice -n 10 python3 benchmarks/surge/sweep.py --replicas 2,4,8 --startup-scale 0.2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "release" / "surge.py"


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x`` over at least two distinct ``xs``: ``(a, b)``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a fit needs at least two distinct replica counts")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def fit(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-count ratios and, over two or more counts, the per-batch slopes and ``f``."""
    per: dict[int, dict[str, float]] = {}
    for r in runs:
        secs = {x["release"]: float(x["seconds"]) for x in r["result"]["runs"]}
        per[r["replicas"]] = secs
    out: dict[str, Any] = {
        "per_count": {
            str(n): {
                "in_place_s": s["in place"],
                "surge_s": s["surge"],
                "f": round(s["surge"] / s["in place"] - 1, 3),
            }
            for n, s in sorted(per.items())
        }
    }
    if len(per) >= 2:
        ns = sorted(per)
        a_in, b_in = linear_fit([float(n) for n in ns], [per[n]["in place"] for n in ns])
        a_s, b_s = linear_fit([float(n) for n in ns], [per[n]["surge"] for n in ns])
        out["in_place"] = {"a_s": round(a_in, 2), "per_batch_s": round(b_in, 2)}
        out["surge"] = {"a_s": round(a_s, 2), "per_batch_s": round(b_s, 2)}
        out["f"] = round(b_s / b_in - 1, 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="2,4,8", help="comma-separated replica counts (one lab host each)")
    ap.add_argument("--startup-scale", type=float, default=0.2)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--out")
    args = ap.parse_args()
    counts = [int(v) for v in args.replicas.split(",")]
    started = dt.datetime.now(dt.timezone.utc)
    out = Path(args.out or REPO / "benchmarks" / "results" / f"surge-sweep-{started:%Y-%m-%dT%H%M}.json")
    runs: list[dict[str, Any]] = []
    for n in counts:
        loads: list[float] = []
        stop = threading.Event()

        def sample() -> None:
            while True:
                loads.append(round(os.getloadavg()[0], 2))
                if stop.wait(5):
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        one = out.with_name(f"{out.stem}-r{n}.json")
        t0 = dt.datetime.now(dt.timezone.utc)
        p = subprocess.run(
            [
                sys.executable,
                str(BENCH),
                "--replicas",
                str(n),
                "--startup-scale",
                str(args.startup_scale),
                "--clients",
                str(args.clients),
                "--out",
                str(one),
            ],
            text=True,
            capture_output=True,
        )
        stop.set()
        sampler.join()
        print(p.stdout + p.stderr[-3000:], file=sys.stderr)
        if p.returncode != 0:
            raise SystemExit(f"the surge benchmark at {n} replicas exited {p.returncode}")
        runs.append(
            {
                "replicas": n,
                "started": t0.isoformat(timespec="seconds"),
                "load_1min": {"min": min(loads), "max": max(loads), "samples": loads},
                "result": json.loads(one.read_text()),
            }
        )
        one.unlink()
        doc = {
            "benchmark": "surge-sweep",
            "started": started.isoformat(timespec="seconds"),
            "startup_scale": args.startup_scale,
            "clients": args.clients,
            "machine": {"cpus": os.cpu_count()},
            "runs": runs,
            "fit": fit(runs),
        }
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.rename(out)  # written after every count: a later count's failure keeps the earlier ones
        print(json.dumps(doc["fit"]), file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
