"""Disaggregated (1 prefill : 1 decode) vs colocated (2 mixed) serving at equal GPU count, on the simulator.

Both arms run behind the real vllm-router (scripts/install-vllm-router): the
colocated arm in its plain mode (``--worker-urls``, round robin over two mixed
instances), the disaggregated arm with ``--vllm-pd-disaggregation`` over a
prefill and a decode instance started with the ``--kv-transfer-config`` and
environment clusterctl renders.  Each instance is one simulated H100 (TP 1,
sparse Qwen3-8B, ``h100-sxm`` latency profile) on a fake host of its own with
two 400 Gbit/s RoCE NICs (``<hw>/nic.json``), all on loopback.

Workload (the field report's mix): 80 % short prompts (``--short`` words),
20 % long ones (``--long`` words), ``--max-tokens`` out each (ignore_eos),
Poisson arrivals at ``--rate`` requests per simulated second, ``--requests``
requests, seeded; streamed, TTFT and ITL measured by the client
(clusterctl.bench.http_sse) and divided by the time scale to read as 1x.

Arms, one after the other on fresh instances: ``colocated``, ``disaggregated``,
``disaggregated+pause-storm`` (PFC pause frames pausing 90 % of each second on
the prefill host's RoCE priority, both NICs: ``lab/hardware/faults.pause_storm``).

Usage: ``python benchmarks/pd/disagg.py [--requests 120] [--rate 4] [--time-scale 0.5]``.
Writes ``benchmarks/results/pd-disagg-<date>.json`` (temp file + rename) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from clusterctl.bench.http_sse import stream_completion  # noqa: E402
from clusterctl.vllmclient import Endpoint  # noqa: E402
from clusterctl.bench.stats import percentile  # noqa: E402
from clusterctl.deploy.units import pd  # noqa: E402
from clusterctl.diagnose.serving import histogram_quantile, parse_metrics, total  # noqa: E402
from clusterctl.inventory.loader import load_inventory_text  # noqa: E402
from clusterctl.lab.hardware import faults, nvml, provision_host  # noqa: E402
from clusterctl.lab.hardware.host import hw_dir  # noqa: E402
from clusterctl.lab.vllm_sim import synth  # noqa: E402
from clusterctl.lab.vllm_sim.serve import free_port  # noqa: E402

ROUTER = os.environ.get("CLUSTERCTL_VLLM_ROUTER", pd.ROUTER_BIN)
MODEL = "qwen3-8b"


def _inventory(ports: dict[str, int], router_port: int, model_dir: Path, arm: str):
    roles = {"a": "prefill", "b": "decode"} if arm != "colocated" else {"a": "mixed", "b": "mixed"}
    # the router's Prometheus port (clusterctl sets one per router): a free one, not port + 10000
    pool = (
        f"pd_pools:\n  pool: {{model: {MODEL}, router: {{host: a, port: {router_port}, "
        f"metrics_port: {free_port()}}}}}\n"
        if arm != "colocated"
        else ""
    )
    return load_inventory_text(
        f"""\
version: 1
defaults:
  gpus: {{count: 1, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}}
hosts:
  a: {{address: 127.0.0.1}}
  b: {{address: 127.0.0.1}}
engines:
  sim: {{path: /usr/local/bin/vllm, version: "0.11.0"}}
models:
  {MODEL}: {{path: {model_dir}, served_name: {MODEL}}}
instances:
  ia: {{model: {MODEL}, engine: sim, placement: "a:0", port: {ports['a']}, role: {roles['a']}}}
  ib: {{model: {MODEL}, engine: sim, placement: "b:0", port: {ports['b']}, role: {roles['b']}}}
{pool}""",
        "bench.yaml",
    )


def _wait_http(url: str, proc: subprocess.Popen[Any], timeout: float = 90.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not healthy after {timeout:g} s")


def _port() -> int:
    """A free loopback port that leaves room for the NIXL side-channel port (+10000)."""
    while True:
        p = free_port()
        if p + pd.SIDE_CHANNEL_OFFSET <= 65535:
            return p


class Arm:
    def __init__(self, arm: str, work: Path, model_dir: Path, lib: Path, scale: float) -> None:
        self.arm, self.work, self.procs = arm, work, []  # type: ignore[var-annotated]
        ports = {"a": _port(), "b": _port()}
        self.router_port = _port()
        self.inv = _inventory(ports, self.router_port, model_dir, arm)
        for h in ("a", "b"):
            provision_host(work / arm / h, h, 0, 1, "H100-SXM5-80GB", "mlnx")
        for h, name in (("a", "ia"), ("b", "ib")):
            inst = self.inv.instances[name]
            env = dict(
                os.environ,
                LD_LIBRARY_PATH=str(lib),
                FAKE_NVML_STATE=str(hw_dir(work / arm / h) / "nvml.json"),
                VLLM_SIM_TIME_SCALE=str(scale),
                VLLM_SIM_PROFILE="h100-sxm",
                CUDA_VISIBLE_DEVICES="0",
                **pd.kv_env(self.inv, inst, self.inv.hosts[h]),
            )
            env.pop("VLLM_API_KEY", None)
            argv = [
                sys.executable,
                "-m",
                "clusterctl.lab.vllm_sim",
                "serve",
                str(model_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(inst.port),
                "--served-model-name",
                MODEL,
                "--disable-log-stats",
                "--disable-uvicorn-access-log",
                *pd.kv_args(self.inv, inst),
            ]
            self.procs.append(
                subprocess.Popen(
                    argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
                )
            )
        for inst, proc in zip(self.inv.instances.values(), self.procs):
            _wait_http(f"http://127.0.0.1:{inst.port}/health", proc)
        if arm == "colocated":
            argv = [
                ROUTER,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.router_port),
                "--policy",
                "round_robin",
                "--worker-urls",
                *(pd.instance_url(self.inv, i) for i in self.inv.instances.values()),
            ]
        else:
            argv = pd.router_argv(self.inv, self.inv.pd_pools["pool"], self.inv.instances.values(), binary=ROUTER)
        argv += ["--log-level", "warning", "--disable-retries"]
        self.procs.append(
            subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        )
        _wait_http(f"http://127.0.0.1:{self.router_port}/health", self.procs[-1])
        if arm.endswith("pause-storm"):
            for nic in ("eth2", "eth3"):
                faults.pause_storm(work / arm / "a", nic=nic, priority=3, per_s=20000, paused=0.9)

    def engine_stats(self) -> dict[str, float]:
        """From the decoding instances' own /metrics (simulated clock: what the engines did, whatever the
        load on this machine did to the client's view): ITL p50/p99 (ms), and the KV pulls' mean time (ms)
        and count."""
        buckets: dict[float, float] = {}
        xfer_s = xfer_n = 0.0
        for inst in self.inv.instances.values():
            if inst.role == "prefill":
                continue
            with urllib.request.urlopen(f"http://127.0.0.1:{inst.port}/metrics", timeout=10) as r:
                m = parse_metrics(r.read().decode())
            for labels, v in m.get("vllm:inter_token_latency_seconds_bucket", []):
                le = float(labels["le"].replace("+Inf", "inf"))
                buckets[le] = buckets.get(le, 0.0) + v
            xfer_s += total(m, "vllm:nixl_xfer_time_seconds_sum") or 0.0
            xfer_n += total(m, "vllm:nixl_xfer_time_seconds_count") or 0.0
        out = {
            f"engine_itl_ms_p{p}": 1000 * (histogram_quantile(list(buckets.items()), p / 100) or 0.0) for p in (50, 99)
        }
        out["kv_pulls"] = xfer_n
        out["kv_pull_ms_mean"] = 1000 * xfer_s / xfer_n if xfer_n else 0.0
        return out

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def _count_tokens(arm: Arm, prompt: str) -> int:
    """How many tokens the simulated model makes of ``prompt`` (its /tokenize)."""
    port = next(iter(arm.inv.instances.values())).port
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/tokenize",
        data=json.dumps({"prompt": prompt}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return int(json.loads(r.read())["count"])


async def _drive(port: int, reqs: list[tuple[float, str, bool]], max_tokens: int, scale: float) -> list[dict[str, Any]]:
    ep = Endpoint.parse(f"http://127.0.0.1:{port}")
    t0 = time.perf_counter()

    async def one(at: float, prompt: str, long: bool) -> dict[str, Any]:
        await asyncio.sleep(max(0.0, t0 + at * scale - time.perf_counter()))
        r = await stream_completion(
            ep,
            {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True},
            timeout=120,
        )
        return {"long": long, "ok": r.ok, "ttft": r.ttft / scale, "itl": [x / scale for x in r.itl], "error": r.error}

    return list(await asyncio.gather(*(one(*x) for x in reqs)))


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["ok"]]
    out: dict[str, Any] = {"requests": len(rows), "failed": len(rows) - len(ok)}
    for label, sel in (
        ("all", ok),
        ("long", [r for r in ok if r["long"]]),
        ("short", [r for r in ok if not r["long"]]),
    ):
        ttft = [r["ttft"] for r in sel]
        itl = [x for r in sel for x in r["itl"]]
        out[label] = {
            "ttft_ms_p50": 1000 * percentile(ttft, 50),
            "ttft_ms_p99": 1000 * percentile(ttft, 99),
            "itl_ms_p50": 1000 * percentile(itl, 50),
            "itl_ms_p99": 1000 * percentile(itl, 99),
            "n": len(sel),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--rate", type=float, default=4.0, help="requests per simulated second")
    ap.add_argument("--short", type=int, default=50, help="words in a short prompt (~4.5 tokens each)")
    ap.add_argument("--long", type=int, default=800, help="words in a long prompt")
    ap.add_argument("--long-share", type=float, default=0.2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--arms", default="colocated,disaggregated,disaggregated+pause-storm")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    a = ap.parse_args()
    if not Path(ROUTER).exists():
        print(f"{ROUTER} missing: run scripts/install-vllm-router", file=sys.stderr)
        return 3
    rng = random.Random(a.seed)
    t, reqs = 0.0, []
    for i in range(a.requests):
        t += rng.expovariate(a.rate)
        long = rng.random() < a.long_share
        n = a.long if long else a.short
        reqs.append((t, " ".join(f"r{i}w{j}" for j in range(n)), long))
    results: dict[str, Any] = {
        "workload": {
            k: getattr(a, k)
            for k in ("requests", "rate", "short", "long", "long_share", "max_tokens", "time_scale", "seed")
        },
        "load_avg_before": os.getloadavg()[0],
        "arms": {},
    }
    with tempfile.TemporaryDirectory(prefix="pd-bench-") as tmp:
        work = Path(tmp)
        lib = nvml.build(work / "nvml", "current").parent
        model_dir = work / "model"
        synth.write_model("qwen3-8b", model_dir, sparse=True)
        for arm in a.arms.split(","):
            inst = Arm(arm, work, model_dir, lib, a.time_scale)
            try:
                if "prompt_tokens" not in results["workload"]:
                    results["workload"]["prompt_tokens"] = {
                        kind: _count_tokens(inst, next(p for _t, p, lg in reqs if lg == (kind == "long")))
                        for kind in ("short", "long")
                    }
                rows = asyncio.run(_drive(inst.router_port, reqs, a.max_tokens, a.time_scale))
                engine = inst.engine_stats()
            finally:
                inst.close()
            results["arms"][arm] = {**_stats(rows), **engine}
            errs = sorted({r["error"] for r in rows if not r["ok"]})[:3]
            if errs:
                results["arms"][arm]["errors"] = errs
    results["load_avg_after"] = os.getloadavg()[0]
    a.out.mkdir(parents=True, exist_ok=True)
    dest = a.out / f"pd-disagg-{time.strftime('%Y-%m-%dT%H%M')}.json"
    tmpf = dest.with_suffix(".json.tmp")
    tmpf.write_text(json.dumps(results, indent=1) + "\n")
    os.replace(tmpf, dest)
    print(
        f"{'arm':28} {'TTFT p50/p99 ms (all)':>22} {'long TTFT p50/p99':>18} {'short TTFT p50/p99':>19} "
        f"{'ITL p50/p99 ms':>15} {'engine ITL p50/p99':>18} {'KV pull mean ms':>15} failed"
    )
    for arm, s in results["arms"].items():
        al, lg, sh = s["all"], s["long"], s["short"]
        print(
            f"{arm:28} {al['ttft_ms_p50']:10.0f}/{al['ttft_ms_p99']:<10.0f} {lg['ttft_ms_p50']:8.0f}/"
            f"{lg['ttft_ms_p99']:<9.0f} {sh['ttft_ms_p50']:8.0f}/{sh['ttft_ms_p99']:<9.0f} "
            f"{al['itl_ms_p50']:6.1f}/{al['itl_ms_p99']:<8.1f} {s['engine_itl_ms_p50']:8.1f}/"
            f"{s['engine_itl_ms_p99']:<9.1f} {s['kv_pull_ms_mean']:15.1f} {s['failed']}"
        )
    print(f"prompt tokens: {results['workload'].get('prompt_tokens')}")
    print(f"load average {results['load_avg_before']:.1f} -> {results['load_avg_after']:.1f}; wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
