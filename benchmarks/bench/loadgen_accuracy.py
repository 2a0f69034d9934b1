"""Load generator accuracy and cost: client TTFT vs the server's own TTFT histogram, generator CPU.

Two servers, on 127.0.0.1, in another process:

- ``--server sim`` (default): the vLLM simulator (Qwen3-8B, fake H100,
  ``--max-num-seqs 512``) at ``--scale``; its histogram starts when a request
  reaches its engine (after its thread-per-connection HTTP front end) and is
  on the simulated clock, so it is multiplied by the scale.
- ``--server stub``: ``sse_stub.py``, a one-thread asyncio SSE server whose
  TTFT runs from accepting the connection to writing the first token: the
  difference is the generator's own (connect, send, scheduling until read).
  Its chunks carry their write time, so ``read_lag_ms`` (mean, median, p90,
  p99 over every token chunk) is how late the generator reads them.

``--generator asyncio`` (default: ``clusterctl.bench.runner``, what
``clusterctl bench`` uses) or ``threads`` (``clusterctl.bench.loadgen.run``,
the first generator).  ``--pin`` puts the generator on CPU 0 and the server
on CPU 1 (``sched_setaffinity``).  The 1-minute load average before and
after each level is recorded: the machine's cores are shared with whatever
else runs.  Writes ``benchmarks/results/bench-loadgen-<time>.json``.

Usage: python3 benchmarks/bench/loadgen_accuracy.py [--server sim|stub] [--generator asyncio|threads] [--pin]
           [--scale 0.25] [--levels 1,8,64,256] [--requests-per-stream 2] [--input-len 128] [--output-len 32]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from clusterctl import vllmclient  # noqa: E402
from clusterctl.bench import http_sse, loadgen, runner, server_metrics  # noqa: E402
from clusterctl.bench.stats import aggregate, summarize  # noqa: E402
from clusterctl.errors import ClusterctlError  # noqa: E402
from clusterctl.lab.vllm_sim.serve import free_port  # noqa: E402


def _sim_cmd(tmp: Path, port: int, scale: float) -> tuple[list[str], dict[str, str]]:
    from clusterctl.lab.hardware import nvml, provision_host
    from clusterctl.lab.hardware.host import hw_dir
    from clusterctl.lab.vllm_sim import synth

    lib = nvml.build(tmp / "nvml", "current").parent
    provision_host(tmp / "lab01", "lab01", 0, 2, "H100-SXM5-80GB", "mlnx")
    synth.write_model("qwen3-8b", tmp / "model", sparse=True)
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=str(lib),
        FAKE_NVML_STATE=str(hw_dir(tmp / "lab01") / "nvml.json"),
        VLLM_SIM_TIME_SCALE=str(scale),
        CUDA_VISIBLE_DEVICES="0",
        PYTHONPATH=str(ROOT),
    )
    return (
        [
            sys.executable,
            "-m",
            "clusterctl.lab.vllm_sim",
            "serve",
            str(tmp / "model"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-num-seqs",
            "512",
        ],
        env,
    )


class ReadLag(vllmclient.SseTimer):
    """SseTimer that also records, for the stub's chunks (which carry their write time ``"t"``), how long
    after the write the generator parsed them: its read lag, free of connect and server time (s)."""

    lags: list[float] = []

    def data(self, payload: bytes, now: float) -> bool:
        if payload.startswith(b"{") and b'"t":' in payload:
            ReadLag.lags.append(time.perf_counter() - json.loads(payload)["t"])
        return super().data(payload, now)


@contextlib.contextmanager
def server(kind: str, scale: float, pin: bool) -> Iterator[vllmclient.Endpoint]:
    """Start the server, wait until /metrics answers (5 min at most), stop it afterwards."""
    with tempfile.TemporaryDirectory() as td:
        port = free_port()
        if kind == "sim":
            cmd, env = _sim_cmd(Path(td), port, scale)
        else:
            cmd, env = [sys.executable, str(Path(__file__).with_name("sse_stub.py")), str(port)], dict(os.environ)
        if pin:
            cmd = ["taskset", "-c", "1", *cmd]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ep = vllmclient.Endpoint.parse(f"http://127.0.0.1:{port}")
            deadline = time.monotonic() + 300
            while True:
                try:
                    server_metrics.scrape(ep, timeout=2)
                    break
                except (OSError, ClusterctlError):
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit(f"{kind} server did not come up") from None
                    time.sleep(0.5)
            yield ep
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", choices=("sim", "stub"), default="sim")
    ap.add_argument("--generator", choices=("asyncio", "threads"), default="asyncio")
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--levels", default="1,8,64,256")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    a = ap.parse_args()
    if a.pin:
        os.sched_setaffinity(0, {0})
    http_sse.SseTimer = ReadLag  # type: ignore[misc]
    vllmclient.SseTimer = ReadLag  # type: ignore[misc]
    wall = 1.0  # server_metrics scales the simulator's histograms (on its simulated clock) to wall time
    gen = runner.run if a.generator == "asyncio" else loadgen.run
    rows = []
    with server(a.server, a.scale, a.pin) as ep:
        rng = random.Random(0)
        for level in (int(x) for x in a.levels.split(",")):
            prompts = [vllmclient.synthetic_prompt(a.input_len, rng) for _ in range(level * a.requests_per_stream)]
            load_before = os.getloadavg()[0]
            before = server_metrics.scrape(ep)
            ReadLag.lags = []
            run = gen(ep, prompts, level, a.output_len)
            after = server_metrics.scrape(ep)
            rep = aggregate(run.results, run.duration, level)
            srv = server_metrics.histogram_mean(before, after, "vllm:time_to_first_token_seconds")
            client = rep["ttft_ms"]["mean"]  # type: ignore[index]
            srv_ms = None if srv is None else 1000 * srv * wall
            rows.append(
                {
                    "concurrency": level,
                    "requests": len(prompts),
                    "completed": rep["completed"],
                    "failed": rep["failed"],
                    "client_ttft_mean_ms": client,
                    "client_ttft_p99_ms": rep["ttft_ms"]["p99"],  # type: ignore[index]
                    "server_ttft_mean_ms_wall": srv_ms,
                    "ttft_error_ms": None if srv_ms is None else client - srv_ms,
                    "generator_cpu_s": run.cpu_s,
                    "duration_s": run.duration,
                    "generator_cpu_percent_of_one_core": 100 * run.cpu_s / run.duration,
                    "output_throughput": rep["output_throughput"],
                    "e2e_mean_ms": rep["e2e_ms"]["mean"],  # type: ignore[index]
                    "errors": rep["errors"],
                    "read_lag_ms": summarize(ReadLag.lags) if ReadLag.lags else None,
                    "loadavg_1m_before": load_before,
                    "loadavg_1m_after": os.getloadavg()[0],
                }
            )
            print(json.dumps(rows[-1]))
    doc = {
        "server": a.server,
        "generator": a.generator,
        "pinned": a.pin,
        "scale": a.scale if a.server == "sim" else None,
        "input_len": a.input_len,
        "output_len": a.output_len,
        "cpu_count": os.cpu_count(),
        "note": "generator CPU is this process's CPU time over the level's wall time (100 = one core); the "
        "server runs in another process on the same machine, whose cores other users share "
        "(see loadavg_1m_*)",
        "levels": rows,
    }
    print(write_result(f"bench-loadgen-{a.server}-{a.generator}", doc))
    return 0


def write_result(prefix: str, doc: dict[str, object]) -> Path:
    """Write ``doc`` to ``benchmarks/results/PREFIX-<time>.json`` (temp file + rename); its path."""
    out = ROOT / "benchmarks" / "results" / f"{prefix}-{time.strftime('%Y-%m-%dT%H%M')}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
    return out


if __name__ == "__main__":
    sys.exit(main())
