"""Does ``clusterctl bench`` say when its generator is starved?  Runs against the simulator, as is and starved.

    python3 benchmarks/bench/starvation.py [--scale 0.5] [--levels 1,4] [--requests 8] [--busy]

For each variant, ``clusterctl bench SIM --json`` runs as a subprocess:

- ``as is``: nothing done to it;
- ``stopped 10/30`` and ``stopped 25/30``: SIGSTOP for 10 (25) ms of every 30, SIGCONT between: the
  generator waits for a CPU as it does in a run queue, without burning one here;
- ``busy`` (with ``--busy``): two processes spinning at nice 0 and the generator at nice 19 for the run, as
  next to a busy-polling vLLM CPU engine (uses both cores for the run: only on a machine you may load).

Writes ``benchmarks/results/bench-starvation-<time>.json``: per variant, the exit status and per level the
client's and the server's mean TTFT and TPOT and the trust block (measured errors, flags).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from loadgen_accuracy import server, write_result  # noqa: E402


def _stopper(pid: int, off_ms: float, period_ms: float, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(off_ms / 1000)
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        time.sleep((period_ms - off_ms) / 1000)


def bench(url: str, levels: str, requests: int, variant: str) -> dict[str, object]:
    code = "import sys; from clusterctl.cli.main import main; sys.exit(main(sys.argv[1:]))"
    argv = [
        sys.executable,
        "-c",
        code,
        "bench",
        url,
        "-c",
        levels,
        "-n",
        str(requests),
        "--input-len",
        "64",
        "--output-len",
        "32",
        "--json",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    spinners: list[subprocess.Popen[bytes]] = []
    if variant == "busy":
        argv = ["nice", "-n", "19", *argv]
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stop = threading.Event()
    t = None
    if variant.startswith("stopped"):
        off = float(variant.split()[1].split("/")[0])
        time.sleep(1.5)  # imports and the /tokenize probe
        t = threading.Thread(target=_stopper, args=(p.pid, off, 30.0, stop), daemon=True)
        t.start()
    try:
        out, err = p.communicate(timeout=600)
    finally:
        stop.set()
        if t is not None:
            t.join()
        for s in spinners:
            s.kill()
            s.wait()
    doc = json.loads(out)
    levels_out = []
    for r in doc["results"]:
        levels_out.append(
            {
                "concurrency": r["concurrency"],
                "completed": r["completed"],
                "client_ttft_mean_ms": r["ttft_ms"]["mean"],
                "server_ttft_mean_ms": r["server_ttft_mean_ms"],
                "client_tpot_mean_ms": r["tpot_ms"]["mean"],
                "server_tpot_mean_ms": r["server_tpot_mean_ms"],
                "itl_median_ms": r["itl_ms"]["median"],
                "generator_cpu_percent": r["generator_cpu_percent"],
                "prompt_tokens_mean": r["prompt_tokens_mean"],
                "trust": r["trust"],
            }
        )
    return {"variant": variant, "exit": p.returncode, "loadavg_1m": os.getloadavg()[0], "levels": levels_out}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--levels", default="1,4")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--busy", action="store_true")
    a = ap.parse_args()
    variants = ["as is", "stopped 10/30", "stopped 25/30"] + (["busy"] if a.busy else [])
    rows = []
    with server("sim", a.scale, False) as ep:
        for v in variants:
            rows.append(bench(ep.url, a.levels, a.requests, v))
            print(json.dumps(rows[-1]))
    print(
        write_result(
            "bench-starvation",
            {
                "scale": a.scale,
                "cpu_count": os.cpu_count(),
                "variants": rows,
                "note": "simulator histograms are on its simulated clock; bench scales them by its x-sim-time-scale",
            },
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
