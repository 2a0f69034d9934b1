"""Calibrate the simulator against the real vLLM CPU engine (docs/real-vllm.md, "Calibration").

    python3 benchmarks/real_vllm/calibrate.py                 # measure real, fit, measure the simulator
    python3 benchmarks/real_vllm/calibrate.py --real-from F   # reuse the real figures of an earlier result F

1. **Real.** Starts the real engine (``tests/support/engines.py``: the tiny real model, one core, one
   OpenMP thread, ``--enforce-eager``, 64 MiB of KV, ``--max-model-len 2048``) and runs clusterctl's own
   ``bench`` against it at 1, 4 and 16 concurrent streams (``LEVELS``: requests per level, prompt
   ``INPUT_LEN`` tokens by the model's tokenizer, ``OUTPUT_LEN`` output tokens, ``ignore_eos``), the
   generator pinned to the other core.  Per level: the bench's figures, the engine's preemptions (from
   ``vllm:num_preemptions_total`` before and after) and the load average before and after (the machine is
   shared: every figure is stated beside it).
2. **Fit.** The simulator's step-time model (``clusterctl/lab/vllm_sim/profiles.py``) has three free
   parameters that matter for this model on a CPU core: ``t_step`` (per step), ``t_seq`` (per scheduled
   sequence) and ``flops_eff`` (usable FLOP/s; the prompt's cost).  They are derived from the real figures:
   a first guess from the decode slope (TPOT at 1 and 16 streams) and the prefill (TTFT - TPOT at 1
   stream), then refined on the virtual clock (``latency.bench_point``: the same workload as the bench)
   to minimise the squared log error of TTFT, TPOT and throughput at every level.
3. **Simulator.** Starts the simulator (0.33) on the same model with the committed profile
   (``--sim-profile cpu-1core``, time scale 1) and runs the same bench; also the committed profile on the
   virtual clock (what the calibration test recomputes).

Writes ``benchmarks/results/real-vllm-calibration-<time>.json``: the workload, real / simulated (1x and
virtual clock) per level, the fitted parameters, load averages.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks" / "bench"))

from clusterctl.lab import realmodel  # noqa: E402
from clusterctl.lab.vllm_sim import latency as L  # noqa: E402
from clusterctl.lab.vllm_sim import profiles as P  # noqa: E402
from loadgen_accuracy import write_result  # noqa: E402
from support.engines import READY, REAL_CORE, preemptions_in, start_engine  # noqa: E402

CODE = "import sys; from clusterctl.cli.main import main; sys.exit(main(sys.argv[1:]))"
#: (concurrency, requests) per level.
LEVELS = ((1, 8), (4, 16), (16, 48))
INPUT_LEN = 128
OUTPUT_LEN = 32
MAX_LEN = 2048
PROFILE = "cpu-1core"
#: The real engine's scheduler budget: vLLM 0.32's defaults for the API server on the CPU platform
#: (``EngineArgs.get_batch_defaults`` in vllm/engine/arg_utils.py of the installed wheel: 128 sequences,
#: 2048 batched tokens); the simulator is given the same.
CPU_BUDGET = {"max_num_seqs": 128, "max_num_batched_tokens": 2048}


#: The bench client's nice value (``--client-nice``; negative: ahead of the other engineers' work on the
#: shared machine, so that a starved client does not stretch TTFT).  None: inherit.
CLIENT_NICE: int | None = None
#: The engine's nice value (``--engine-nice``), real or simulated alike; None: inherit.
ENGINE_NICE: int | None = None


def bench_level(url: str, core: str, c: int, n: int, model: Path) -> dict[str, Any]:
    """One ``clusterctl bench`` level as a child pinned to ``core``; its figures, preemptions and load."""
    before = _preemptions(url)
    load0 = os.getloadavg()
    nice = ["nice", "-n", str(CLIENT_NICE)] if CLIENT_NICE is not None else []
    argv = [
        *nice,
        "taskset",
        "-c",
        core,
        sys.executable,
        "-c",
        CODE,
        "bench",
        url,
        "-c",
        str(c),
        "-n",
        str(n),
        "--input-len",
        str(INPUT_LEN),
        "--output-len",
        str(OUTPUT_LEN),
        "--tokenizer",
        str(model),
        "--timeout",
        "600",
        "--json",
    ]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    load1 = os.getloadavg()
    try:
        r = json.loads(p.stdout)["results"][0]
    except (ValueError, KeyError, IndexError):
        raise SystemExit(f"bench failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}") from None
    return {
        "concurrency": c,
        "requests": n,
        "exit": p.returncode,
        "completed": r["completed"],
        "failed": r["failed"],
        "prompt_tokens_mean": r["prompt_tokens_mean"],
        "ttft_ms": r["ttft_ms"]["mean"],
        "ttft_median_ms": r["ttft_ms"]["median"],
        "tpot_ms": r["tpot_ms"]["mean"],
        "itl_median_ms": r["itl_ms"]["median"],
        "output_tps": r["output_throughput"],
        "server_ttft_ms": r.get("server_ttft_mean_ms"),
        "server_tpot_ms": r.get("server_tpot_mean_ms"),
        "trusted": r["trust"]["trusted"],
        "trust_reasons": r["trust"]["reasons"],
        "preemptions": _preemptions(url) - before,
        "loadavg_1m": [round(load0[0], 2), round(load1[0], 2)],
        "client_nice": CLIENT_NICE,
    }


def _preemptions(url: str) -> float:
    """The engine's vllm:num_preemptions_total (all label sets)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        return preemptions_in(r.read().decode())


def run_engine(
    kind: str, model: Path, flags: list[str], env: dict[str, str] | None = None, **kw: Any
) -> dict[str, Any]:
    other = "0" if REAL_CORE != "0" else "1"
    t0 = time.monotonic()
    own = os.getpriority(os.PRIO_PROCESS, 0)
    if ENGINE_NICE is not None:  # the engine's processes inherit it; this process goes back at once
        os.setpriority(os.PRIO_PROCESS, 0, ENGINE_NICE)
    try:
        eng = start_engine(
            kind, model, "--served-model-name", "tiny", "--max-model-len", str(MAX_LEN), *flags, env=env, **kw
        )
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, own)
    try:
        if not eng.wait_for(READY, 900):
            raise SystemExit(f"{kind} did not start:\n" + eng.log[-3000:])
        if not eng.real:  # the real engine runs pinned to REAL_CORE (engines.py): give the simulator the same
            subprocess.run(["taskset", "-a", "-p", "-c", REAL_CORE, str(eng.proc.pid)], check=True, capture_output=True)
        out: dict[str, Any] = {"start_s": round(time.monotonic() - t0, 1), "engine_nice": ENGINE_NICE, "levels": []}
        bench_level(eng.url, other, 1, 2, model)  # warm-up (first requests pay one-off costs)
        for c, n in LEVELS:
            lv = bench_level(eng.url, other, c, n, model)
            print(f"{kind} c={c}: {lv}", file=sys.stderr)
            out["levels"].append(lv)
        return out
    finally:
        try:
            eng.stop()
        except subprocess.TimeoutExpired:
            eng.kill()


# ---- the fit -------------------------------------------------------------------------------------------


def virtual(prof: P.Profile, levels: list[dict[str, Any]], budget: dict[str, int]) -> list[dict[str, Any]]:
    """The profile on the virtual clock for the same workload as each measured level (ms, tok/s)."""
    out = []
    for lv in levels:
        b = L.bench_point(
            prof,
            L.MODEL_TINY_LLAMA,
            concurrency=lv["concurrency"],
            requests=lv["requests"],
            prompt_len=round(lv["prompt_tokens_mean"]),
            output_len=OUTPUT_LEN,
            num_blocks=512,
            max_num_seqs=budget["max_num_seqs"],
            max_num_batched_tokens=budget["max_num_batched_tokens"],
            block_size=128,
        )
        out.append(
            {
                "concurrency": b.concurrency,
                "ttft_ms": b.ttft_mean * 1e3,
                "tpot_ms": b.tpot_mean * 1e3,
                "output_tps": b.output_tps,
                "preemptions": b.preemptions,
            }
        )
    return out


KEYS = ("ttft_ms", "tpot_ms", "output_tps")


def loss(prof: P.Profile, real: list[dict[str, Any]], budget: dict[str, int]) -> float:
    return sum(math.log(s[k] / r[k]) ** 2 for s, r in zip(virtual(prof, real, budget), real) for k in KEYS)


def fit(real: list[dict[str, Any]], budget: dict[str, int]) -> tuple[P.Profile, float]:
    lv = {x["concurrency"]: x for x in real}
    cost = L.MODEL_TINY_LLAMA
    f1 = 2 * cost.active_params  # FLOPs per token
    tp1, tp16 = lv[1]["tpot_ms"] / 1e3, lv[16]["tpot_ms"] / 1e3
    prompt = lv[1]["prompt_tokens_mean"]
    fe = max(1e6, f1 * (prompt - 1) / max(1e-4, lv[1]["ttft_ms"] / 1e3 - tp1))
    slope = max(0.0, (tp16 - tp1) / 15)
    t_seq = max(0.0, slope - f1 / fe)
    t_step = max(1e-4, tp1 - t_seq - f1 / fe)
    prof = replace(P.PROFILES[PROFILE] if PROFILE in P.PROFILES else _blank(), t_step=t_step, t_seq=t_seq, flops_eff=fe)
    best = loss(prof, real, budget)
    step = 0.5
    while step > 0.01:
        improved = False
        for field in ("t_step", "t_seq", "flops_eff"):
            for f in (1 + step, 1 / (1 + step)):
                cand = replace(prof, **{field: max(1e-6, getattr(prof, field) * f)})
                c = loss(cand, real, budget)
                if c < best:
                    prof, best, improved = cand, c, True
        if not improved:
            step /= 2
    return prof, best


def _blank() -> P.Profile:
    return P.Profile(name=PROFILE, description="", source="", mem_bw=10e9, flops_eff=1e9, t_step=0.01, t_seq=0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--real-from", type=Path, help="reuse the real figures of an earlier result file")
    ap.add_argument("--no-sim", action="store_true", help="skip the simulator at 1x")
    ap.add_argument(
        "--client-nice",
        type=int,
        default=None,
        help="run the bench client at this nice value (e.g. -10: ahead of other work)",
    )
    ap.add_argument(
        "--engine-nice", type=int, default=None, help="run the engine (real or simulated) at this nice value"
    )
    a = ap.parse_args()
    global CLIENT_NICE, ENGINE_NICE
    CLIENT_NICE, ENGINE_NICE = a.client_nice, a.engine_nice
    model = realmodel.model_dir()
    if model is None:
        raise SystemExit("the tiny real model is not there (scripts/install-real-vllm)")
    doc: dict[str, Any] = {
        "what": "real vLLM 0.32 CPU vs the simulator, clusterctl bench",
        "workload": {
            "levels": [list(x) for x in LEVELS],
            "input_len": INPUT_LEN,
            "output_len": OUTPUT_LEN,
            "max_model_len": MAX_LEN,
            "kv_cache_memory_bytes": 64 * 2**20,
            "engine_core": REAL_CORE,
            "generator_core": "0" if REAL_CORE != "0" else "1",
            "client_nice": CLIENT_NICE,
            "sim_pinned_to_engine_core": True,
            "cpus": os.cpu_count(),
            "budget": CPU_BUDGET,
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if a.real_from:
        doc["real"] = json.loads(a.real_from.read_text())["real"]
        doc["real_from"] = str(a.real_from.relative_to(ROOT) if a.real_from.is_absolute() else a.real_from)
    else:
        doc["real"] = run_engine("real-0.32", model, [])
    real = doc["real"]["levels"]
    budget = CPU_BUDGET
    prof, err = fit(real, budget)
    doc["fit"] = {
        "t_step": prof.t_step,
        "t_seq": prof.t_seq,
        "flops_eff": prof.flops_eff,
        "mem_bw": prof.mem_bw,
        "loss": err,
        "virtual": virtual(prof, real, budget),
    }
    if PROFILE in P.PROFILES:
        committed = P.PROFILES[PROFILE]
        doc["profile"] = {
            "name": PROFILE,
            "t_step": committed.t_step,
            "t_seq": committed.t_seq,
            "flops_eff": committed.flops_eff,
            "mem_bw": committed.mem_bw,
            "virtual": virtual(committed, real, budget),
        }
        if not a.no_sim:
            from clusterctl.lab.hardware import nvml, provision_host
            from clusterctl.lab.hardware.host import hw_dir

            with tempfile.TemporaryDirectory() as td:
                lib = nvml.build(Path(td) / "nvml", "current").parent
                provision_host(Path(td) / "h1", "h1", 0, 1, "H100-SXM5-80GB", "mlnx")
                flags = [
                    "--sim-profile",
                    PROFILE,
                    "--kv-cache-memory-bytes",
                    str(64 * 2**20),
                    "--block-size",
                    "128",
                ]  # the CPU backend's default block size (vLLM platforms/cpu.py)
                for k, v in budget.items():
                    flags += [f"--{k.replace('_', '-')}", str(v)]
                doc["sim_1x"] = run_engine(
                    "sim-0.33",
                    model,
                    flags,
                    env={"VLLM_SIM_TIME_SCALE": "1"},
                    nvml_lib=lib,
                    nvml_state=hw_dir(Path(td) / "h1") / "nvml.json",
                )
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(write_result("real-vllm-calibration", doc))
    print(json.dumps({k: doc[k] for k in ("fit", "profile") if k in doc}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
