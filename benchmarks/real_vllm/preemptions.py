"""Preemptions when the KV cache runs out: the real vLLM CPU engine beside the simulator (docs/real-vllm.md).

    python3 benchmarks/real_vllm/preemptions.py [--bursts 3] [--engine-nice -10]

Both engines serve the tiny real model with ``--max-model-len 2048`` and a 12 MiB KV cache: 96 blocks of 128
tokens (the CPU backend's block size; the simulator is given ``--block-size 128`` and the ``cpu-1core``
profile, at time scale 1).  Each burst sends 16 streaming completions at once (prompts of exactly
``PROMPT`` tokens by the model's tokenizer, distinct per burst so the prefix cache saves nothing,
``OUTPUT`` tokens each with ``ignore_eos``): 16 x 800 tokens need 112 blocks, so some streams are preempted
and recomputed.  Per burst: ``vllm:num_preemptions_total`` before and after, every stream's status and
tokens, the wall time, the stats lines with ``Preemptions: N`` (vLLM prints one a second here:
``VLLM_LOG_STATS_INTERVAL=1``) and the load average.  Writes
``benchmarks/results/real-vllm-preemptions-<time>.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks" / "bench")]

from clusterctl.lab import realmodel  # noqa: E402
from clusterctl.lab.vllm_sim import latency as L  # noqa: E402
from clusterctl.lab.vllm_sim.profiles import PROFILES  # noqa: E402
from loadgen_accuracy import write_result  # noqa: E402
from support.engines import READY, burst, burst_prompts, preemptions_total, start_engine  # noqa: E402

STREAMS, PROMPT, OUTPUT = 16, 720, 80
KV_BYTES, BLOCK = 12 * 2**20, 128
MAX_LEN = 2048
BUDGET = {"max_num_seqs": 128, "max_num_batched_tokens": 2048}  # vLLM 0.32's CPU defaults (calibrate.py)


def measure(kind: str, model: Path, bursts: int, nice: int | None, flags: list[str], **kw: Any) -> dict[str, Any]:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    if nice is not None:
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # the engine inherits it
    try:
        t0 = time.monotonic()
        ep = start_engine(kind, model, "--served-model-name", "tiny", "--max-model-len", str(MAX_LEN), *flags, **kw)
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, own)
    try:
        if not ep.wait_for(READY, 900):
            raise SystemExit(f"{kind} did not start:\n{ep.log[-3000:]}")
        out: dict[str, Any] = {"start_s": round(time.monotonic() - t0, 1), "engine_nice": nice, "bursts": []}
        for b in range(bursts):
            prompts = burst_prompts(model, STREAMS, PROMPT, salt=f"b{b}-")
            before, mark, load0 = preemptions_total(ep), len(ep.lines), os.getloadavg()[0]
            t1 = time.monotonic()
            res = burst(ep, prompts, OUTPUT)
            wall = time.monotonic() - t1
            time.sleep(2.5)  # the next stats line covers the burst's end
            n = preemptions_total(ep) - before
            lines = [x.rstrip() for x in ep.lines[mark:] if "Preemptions: " in x]
            row = {
                "preemptions": n,
                "wall_s": round(wall, 2),
                "completed": sum(
                    1
                    for r in res
                    if r["status"] == 200
                    and r["finish_reason"] == "length"
                    and (r["usage"] or {}).get("completion_tokens") == OUTPUT
                ),
                "streams": STREAMS,
                "stats_lines": lines[-4:],
                "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
            }
            print(kind, row, file=sys.stderr)
            out["bursts"].append(row)
        return out
    finally:
        ep.kill()


def virtual() -> int:
    """The cpu-1core profile's preemptions on the virtual clock for one burst (the tier-1 test's figure)."""
    b = L.bench_point(
        PROFILES["cpu-1core"],
        L.MODEL_TINY_LLAMA,
        concurrency=STREAMS,
        requests=STREAMS,
        prompt_len=PROMPT,
        output_len=OUTPUT,
        num_blocks=KV_BYTES // (BLOCK * 1024),
        block_size=BLOCK,
        **BUDGET,
    )
    return b.preemptions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--engine-nice", type=int, default=None, help="nice value of both engines")
    a = ap.parse_args()
    model = realmodel.model_dir()
    if model is None:
        raise SystemExit("the tiny real model is not there (scripts/install-real-vllm)")
    doc: dict[str, Any] = {
        "what": "preemptions under a small KV cache: real vLLM 0.32 CPU vs the simulator",
        "workload": {
            "streams": STREAMS,
            "prompt_tokens": PROMPT,
            "output_tokens": OUTPUT,
            "kv_cache_memory_bytes": KV_BYTES,
            "block_size": BLOCK,
            "max_model_len": MAX_LEN,
            "budget": BUDGET,
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    env = {"VLLM_LOG_STATS_INTERVAL": "1"}
    doc["real"] = measure("real-0.32", model, a.bursts, a.engine_nice, [], env=env, kv_bytes=str(KV_BYTES))
    from clusterctl.lab.hardware import nvml, provision_host
    from clusterctl.lab.hardware.host import hw_dir

    with tempfile.TemporaryDirectory() as td:
        lib = nvml.build(Path(td) / "nvml", "current").parent
        provision_host(Path(td) / "h1", "h1", 0, 1, "H100-SXM5-80GB", "mlnx")
        flags = [
            "--kv-cache-memory-bytes",
            str(KV_BYTES),
            "--block-size",
            str(BLOCK),
            "--sim-profile",
            "cpu-1core",
            "--enforce-eager",
            "--max-num-seqs",
            str(BUDGET["max_num_seqs"]),
            "--max-num-batched-tokens",
            str(BUDGET["max_num_batched_tokens"]),
        ]
        doc["sim_1x"] = measure(
            "sim-0.33",
            model,
            a.bursts,
            a.engine_nice,
            flags,
            env={**env, "VLLM_SIM_TIME_SCALE": "1"},
            nvml_lib=lib,
            nvml_state=hw_dir(Path(td) / "h1") / "nvml.json",
        )
        doc["sim_1x"]["flags"] = flags
    doc["virtual_preemptions"] = virtual()
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(write_result("real-vllm-preemptions", doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
