"""``clusterctl bench`` against the real vLLM CPU engine (docs/real-vllm.md): token lengths and the trust check.

    python3 benchmarks/bench/real_engine.py

Starts the real engine with the tiny real model pinned to one core (``tests/support/engines.py``:
``REAL_CORE``, one OpenMP thread; up to 8 minutes to start on a loaded machine), then runs
``clusterctl bench URL -c 1,4 -n 8 --input-len 64 --output-len 32 --json`` as a child, three times:

- ``own core``: the generator pinned (``taskset``) to another core, prompts counted by ``/tokenize``;
- ``own core, local tokenizer``: the same with ``--tokenizer MODEL_DIR`` (the model's tokenizer.json);
- ``engine core``: the generator pinned to the engine's core (issue #29's starved case).

Writes ``benchmarks/results/bench-real-engine-<time>.json``: per run the exit status, the tokenizer and per
level the prompt length by our tokenizer (``tok``), in words, by the server (``server_tok``: its
``usage.prompt_tokens`` per request), client/server mean TTFT and TPOT (ms), ITL median, generator CPU % and
the trust block.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).parent))

from clusterctl.lab import realmodel  # noqa: E402
from loadgen_accuracy import write_result  # noqa: E402
from support.engines import READY, REAL_CORE, start_engine  # noqa: E402

CODE = "import sys; from clusterctl.cli.main import main; sys.exit(main(sys.argv[1:]))"


def bench(url: str, core: str, extra: list[str]) -> dict[str, object]:
    argv = [
        "taskset",
        "-c",
        core,
        sys.executable,
        "-c",
        CODE,
        "bench",
        url,
        "-c",
        "1,4",
        "-n",
        "8",
        "--input-len",
        "64",
        "--output-len",
        "32",
        "--json",
        *extra,
    ]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    doc = json.loads(p.stdout)
    return {
        "exit": p.returncode,
        "core": core,
        "tokenizer": doc["tokenizer"],
        "warnings": doc["warnings"],
        "levels": [
            {
                "c": r["concurrency"],
                "ok": r["completed"],
                "tok": r["prompt_tokens_mean"],
                "words": r["prompt_words_mean"],
                "server_tok": r["total_input_tokens"] / max(1, r["completed"]),
                "ttft": [r["ttft_ms"]["mean"], r["server_ttft_mean_ms"]],
                "tpot": [r["tpot_ms"]["mean"], r["server_tpot_mean_ms"]],
                "itl_med": r["itl_ms"]["median"],
                "cpu": r["generator_cpu_percent"],
                "trust": r["trust"],
            }
            for r in doc["results"]
        ],
    }


def main() -> int:
    model = realmodel.model_dir()
    if model is None:
        raise SystemExit("the tiny real model is not there (scripts/install-real-vllm)")
    other = "0" if REAL_CORE != "0" else "1"
    eng = start_engine("real-0.32", Path(model))
    out: dict[str, object] = {"loadavg_start": os.getloadavg()[0], "engine_core": REAL_CORE}
    try:
        if not eng.wait_for(READY, 480):
            raise SystemExit("the real engine did not start:\n" + eng.log[-1500:])
        out["own core"] = bench(eng.url, other, [])
        out["own core, local tokenizer"] = bench(eng.url, other, ["--tokenizer", str(model)])
        out["engine core"] = bench(eng.url, REAL_CORE, [])
    finally:
        try:
            eng.stop()
        except subprocess.TimeoutExpired:
            eng.kill()
    out["loadavg_end"] = os.getloadavg()[0]
    print(write_result("bench-real-engine", out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
