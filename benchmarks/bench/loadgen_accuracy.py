"""Load generator accuracy and cost: client TTFT vs the simulator's server-side histogram, generator CPU.

Starts a simulator (Qwen3-8B, fake H100, 127.0.0.1) at --time-scale SCALE,
runs `clusterctl.bench.loadgen` at each concurrency and writes
benchmarks/results/bench-loadgen-<time>.json: per level the client mean TTFT,
the server's mean TTFT (its histogram is on the simulated clock, so x SCALE),
the difference, the generator's CPU seconds / wall seconds, throughput.

Usage: python3 benchmarks/bench/loadgen_accuracy.py [--scale 0.25] [--levels 1,8,64,256] [--requests-per-stream 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clusterctl.bench import loadgen, server_metrics
from clusterctl.bench.stats import aggregate
from clusterctl.lab.hardware import nvml, provision_host
from clusterctl.lab.hardware.host import hw_dir
from clusterctl.lab.vllm_sim import synth
from clusterctl.lab.vllm_sim.serve import free_port

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--levels", default="1,8,64,256")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        lib = nvml.build(tmp / "nvml", "current").parent
        provision_host(tmp / "lab01", "lab01", 0, 2, "H100-SXM5-80GB", "mlnx")
        synth.write_model("qwen3-8b", tmp / "model", sparse=True)
        port = free_port()
        env = dict(os.environ, LD_LIBRARY_PATH=str(lib), FAKE_NVML_STATE=str(hw_dir(tmp / "lab01") / "nvml.json"),
                   VLLM_SIM_TIME_SCALE=str(a.scale), CUDA_VISIBLE_DEVICES="0")
        proc = subprocess.Popen([sys.executable, "-m", "clusterctl.lab.vllm_sim", "serve", str(tmp / "model"),
                                 "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "512"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ep = loadgen.Endpoint.parse(f"http://127.0.0.1:{port}")
            deadline = time.monotonic() + 300
            while True:
                try:
                    server_metrics.scrape(ep, timeout=2)
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        print("simulator did not come up", file=sys.stderr)
                        return 1
                    time.sleep(0.5)
            rng = random.Random(0)
            rows = []
            for level in (int(x) for x in a.levels.split(",")):
                prompts = [loadgen.synthetic_prompt(a.input_len, rng) for _ in range(level * a.requests_per_stream)]
                before = server_metrics.scrape(ep)
                run = loadgen.run(ep, prompts, level, a.output_len)
                after = server_metrics.scrape(ep)
                rep = aggregate(run.results, run.duration, level)
                server = server_metrics.histogram_mean(before, after, "vllm:time_to_first_token_seconds")
                client = rep["ttft_ms"]["mean"]  # type: ignore[index]
                srv_ms = None if server is None else 1000 * server * a.scale
                rows.append({"concurrency": level, "requests": len(prompts), "completed": rep["completed"],
                             "failed": rep["failed"], "client_ttft_mean_ms": client,
                             "server_ttft_mean_ms_wall": srv_ms,
                             "ttft_error_ms": None if srv_ms is None else client - srv_ms,
                             "generator_cpu_s": run.cpu_s, "duration_s": run.duration,
                             "generator_cpu_percent_of_one_core": 100 * run.cpu_s / run.duration,
                             "output_throughput": rep["output_throughput"]})
                print(json.dumps(rows[-1]))
        finally:
            proc.terminate()
            proc.wait(30)
    out = ROOT / "benchmarks" / "results" / f"bench-loadgen-{time.strftime('%Y-%m-%dT%H%M')}.json"
    doc = {"scale": a.scale, "input_len": a.input_len, "output_len": a.output_len, "cpu_count": os.cpu_count(),
           "note": "generator CPU includes its threads only (time.process_time of this process); the simulator "
                   "runs in another process on the same 2 shared cores", "levels": rows}
    tmp_out = out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps(doc, indent=1) + "\n")
    tmp_out.replace(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
