"""``vllm`` command line: ``vllm serve MODEL [flags]``, ``vllm --version`` and the
simulator's own ``make-model``.

Flag names, defaults and argparse behaviour follow vLLM (research vllm.md §1):
an unknown flag or a bad value prints the usage and ``vllm serve: error: ...``
on stderr and exits 2.  Simulator-only settings: ``--emulate-version 0.11|0.33``
(or ``$VLLM_SIM_VERSION``; the installed launchers fix it) and ``--time-scale F``
(or ``$VLLM_SIM_TIME_SCALE``: every simulated delay is multiplied by F; 0 = no
waiting).  Neither appears in the logged arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Sequence
from . import synth
from .kvtransfer import parse_kv_config

VERSIONS = {"0.11": "0.11.0", "0.33": "0.33.0"}
DEFAULT_VERSION = "0.11"
QUANT_011 = (
    "awq",
    "deepspeedfp",
    "tpu_int8",
    "fp8",
    "ptpc_fp8",
    "fbgemm_fp8",
    "modelopt",
    "modelopt_fp4",
    "bitblas",
    "gguf",
    "gptq_marlin_24",
    "gptq_marlin",
    "gptq_bitblas",
    "awq_marlin",
    "gptq",
    "compressed-tensors",
    "bitsandbytes",
    "hqq",
    "experts_int8",
    "ipex",
    "quark",
    "moe_wna16",
    "torchao",
    "auto-round",
    "rtn",
    "inc",
    "mxfp4",
    "petit_nvfp4",
)
KV_DTYPES = {
    "0.11": ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"),
    "0.33": ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4"),
}
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

#: Sim-only flags: accepted, never logged as vLLM arguments.
SIM_ONLY = ("emulate_version", "time_scale", "sim_profile", "sim_batch_noise", "sim_broken_quantization")


def _human_int(version: str) -> Any:
    def parse(v: str) -> int:
        """vLLM's human_readable_int: ``25.6k`` = 25600 (decimal), ``1K`` = 1024 (binary, integers only)."""
        s = v.strip()
        if version == "0.33" and s.lower() in ("-1", "auto"):
            return -1
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", s)
        if not m or ("." in m[1] and (not m[2] or m[2].isupper())):
            raise ValueError(v)
        if not m[2]:
            return int(m[1])
        power = "kmgt".index(m[2].lower()) + 1
        return int(float(m[1]) * (1000 if m[2].islower() else 1024) ** power)

    parse.__name__ = "human_readable_int"
    return parse


def build_parser(version: str, suppress: bool = False) -> argparse.ArgumentParser:
    """The ``vllm serve`` parser; ``suppress`` drops defaults (to find what was given)."""
    kw: dict[str, Any] = {"argument_default": argparse.SUPPRESS} if suppress else {}
    p = argparse.ArgumentParser(
        prog="vllm serve",
        usage="vllm serve [model_tag] [options]",
        description="Launch a local OpenAI-compatible API server to serve "
        "LLM completions via HTTP. (clusterctl lab simulator)",
        epilog="Example: vllm serve /models/qwen3-8b --port 8000 --tensor-parallel-size 2 --max-model-len 32768",
        **kw,
    )

    def d(value: Any) -> dict[str, Any]:
        return {} if suppress else {"default": value}

    p.add_argument("model_tag", nargs="?", help="The model tag to serve (optional if specified in config)", **d(None))
    f = p.add_argument_group("Frontend")
    f.add_argument("--host", type=str, help="Host name.", **d(None))
    f.add_argument("--port", type=int, help="Port number.", **d(8000))
    f.add_argument("--uds", type=str, help="Unix domain socket path (not simulated).", **d(None))
    f.add_argument(
        "--api-key",
        nargs="+",
        help="If provided, the server will require one of these keys to be presented in the header.",
        **d(None),
    )
    f.add_argument("--enable-server-load-tracking", action=argparse.BooleanOptionalAction, **d(False))
    f.add_argument("--disable-uvicorn-access-log", action=argparse.BooleanOptionalAction, **d(False))
    f.add_argument("--enable-force-include-usage", action=argparse.BooleanOptionalAction, **d(False))
    f.add_argument(
        "--uvicorn-log-level", choices=["debug", "info", "warning", "error", "critical", "trace"], **d("info")
    )
    e = p.add_argument_group("ModelConfig")
    e.add_argument("--model", type=str, help="Name or path of the Hugging Face model to use.", **d("Qwen/Qwen3-0.6B"))
    e.add_argument("--dtype", choices=DTYPES, help="Data type for model weights and activations.", **d("auto"))
    e.add_argument("--seed", type=int, **d(None if version == "0.33" else 0))
    e.add_argument("--max-model-len", type=_human_int(version), help="Model context length.", **d(None))
    e.add_argument("--quantization", "-q", choices=QUANT_011, **d(None))
    e.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, **d(False))
    e.add_argument("--max-logprobs", type=int, **d(20))
    e.add_argument("--served-model-name", nargs="+", **d(None))
    e.add_argument("--generation-config", type=str, **d("auto"))
    e.add_argument("--trust-remote-code", action=argparse.BooleanOptionalAction, **d(False))
    e.add_argument("--show-hidden-metrics-for-version", type=str, **d(None))
    ld = p.add_argument_group("LoadConfig")
    ld.add_argument("--download-dir", type=str, **d(None))
    ld.add_argument("--load-format", type=str, **d("auto"))
    par = p.add_argument_group("ParallelConfig")
    par.add_argument("--tensor-parallel-size", "-tp", type=int, **d(1))
    par.add_argument("--pipeline-parallel-size", "-pp", type=int, **d(1))
    par.add_argument("--data-parallel-size", "-dp", type=int, **d(1))
    if version == "0.33":  # the multiprocessing executor across nodes came with 0.11.1 (vllm_sim/multinode.py)
        par.add_argument("--master-addr", type=str, **d("127.0.0.1"))
        par.add_argument("--master-port", type=int, **d(29501))
        par.add_argument("--nnodes", "-n", type=int, **d(1))
        par.add_argument("--node-rank", "-r", type=int, **d(0))
        p.add_argument("--headless", action="store_true", help="Run in headless mode (no API server).", **d(False))
    c = p.add_argument_group("CacheConfig")
    c.add_argument("--block-size", type=int, choices=[1, 8, 16, 32, 64, 128], **d(None))
    c.add_argument("--gpu-memory-utilization", type=float, **d(0.92 if version == "0.33" else 0.9))
    c.add_argument("--kv-cache-memory-bytes", type=_human_int(version), **d(None))
    if version == "0.11":
        c.add_argument("--swap-space", type=float, **d(4))
    c.add_argument("--kv-cache-dtype", choices=KV_DTYPES[version], **d("auto"))
    c.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, **d(True if version == "0.33" else None)
    )
    s = p.add_argument_group("SchedulerConfig")
    s.add_argument("--max-num-batched-tokens", type=_human_int(version), **d(None))
    s.add_argument("--max-num-seqs", type=int, **d(None))
    kv = p.add_argument_group("VllmConfig")
    kv.add_argument(
        "--kv-transfer-config",
        type=str,
        help="The configurations for distributed KV cache "
        "transfer (JSON), e.g. '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'.",
        **d(None),
    )
    o = p.add_argument_group("ObservabilityConfig")
    o.add_argument("--disable-log-stats", action="store_true", **d(False))
    o.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction, **d(False))
    sim = p.add_argument_group("Simulator (clusterctl lab; not vLLM flags)")
    sim.add_argument(
        "--emulate-version",
        choices=sorted(VERSIONS),
        help="vLLM version to emulate (default $VLLM_SIM_VERSION or 0.11).",
        **d(None),
    )
    sim.add_argument(
        "--time-scale",
        type=float,
        help="Multiply every simulated delay (default $VLLM_SIM_TIME_SCALE or 1; 0 = none).",
        **d(None),
    )
    sim.add_argument(
        "--sim-profile",
        help="latency profile (docs/latency-profiles.md; default $VLLM_SIM_PROFILE, else from the GPU model).",
        **d(None),
    )
    sim.add_argument(
        "--sim-batch-noise",
        action=argparse.BooleanOptionalAction,
        help="greedy output may "
        "depend slightly on the batch, as in vLLM (default on; $VLLM_SIM_BATCH_NOISE=0 turns "
        "it off).",
        **d(None),
    )
    sim.add_argument(
        "--sim-broken-quantization",
        action="store_true",
        help="perturb the logits as a broken quantization would (large drift).",
        **d(False),
    )
    return p


def non_default_args(version: str, argv: Sequence[str]) -> dict[str, Any]:
    """The explicitly given arguments, in parser order (vLLM's "non-default args" line)."""
    given = vars(build_parser(version, suppress=True).parse_args(list(argv)))
    out: dict[str, Any] = {}
    if "model_tag" in given:
        out["model_tag"] = given["model_tag"]
    for a in build_parser(version)._actions:
        if a.dest in given and a.dest not in ("model_tag", *SIM_ONLY, "help"):
            out[a.dest] = given[a.dest]
    if "model_tag" in given:
        # vLLM copies the positional into --model, logged after the frontend args.
        items = list(out.items())
        front = [
            k
            for k, _v in items
            if k
            in (
                "model_tag",
                "host",
                "port",
                "uds",
                "api_key",
                "enable_server_load_tracking",
                "disable_uvicorn_access_log",
                "enable_force_include_usage",
                "uvicorn_log_level",
            )
        ]
        rest = [k for k, _v in items if k not in front and k != "model"]
        ordered = {k: out[k] for k in front}
        ordered["model"] = given["model_tag"]
        ordered.update({k: out[k] for k in rest})
        out = ordered
    return out


def pick_version(argv: Sequence[str], env: dict[str, str], fixed: str | None) -> str:
    if fixed:
        return fixed
    for i, a in enumerate(argv):
        if a.startswith("--emulate-version="):
            return a.split("=", 1)[1] if a.split("=", 1)[1] in VERSIONS else DEFAULT_VERSION
        if a == "--emulate-version" and i + 1 < len(argv) and argv[i + 1] in VERSIONS:
            return argv[i + 1]
    v = env.get("VLLM_SIM_VERSION", DEFAULT_VERSION)
    return v if v in VERSIONS else DEFAULT_VERSION


def _make_model(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="vllm_sim make-model",
        description="Write a synthetic model directory (config.json + safetensors).",
        epilog="Example: python3 -m clusterctl.lab.vllm_sim make-model Qwen3-8B /models/qwen3-8b --sparse",
    )
    p.add_argument("name", help=f"one of: {', '.join(sorted(synth.ARCHS))}")
    p.add_argument("out_dir")
    p.add_argument("--sparse", action="store_true", help="sizes and headers only (no data blocks)")
    p.add_argument("--quantization", choices=synth.QUANTIZATIONS)
    p.add_argument("--shard-bytes", type=int, default=synth.DEFAULT_SHARD_BYTES)
    a = p.parse_args(list(argv))
    try:
        summary = synth.write_model(
            a.name, a.out_dir, sparse=a.sparse, quantization=a.quantization, shard_bytes=a.shard_bytes
        )
    except (KeyError, ValueError, OSError) as e:
        print(f"vllm_sim make-model: error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


def main(argv: Sequence[str] | None = None, version: str | None = None) -> int:
    """Entry point of the ``vllm`` launchers and ``python3 -m ...vllm_sim``; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    ver = pick_version(args, env, version)
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...\n\n"
            "vLLM CLI (clusterctl lab simulator: serve only)\n\n"
            "Example: vllm serve /models/qwen3-8b --port 8000"
        )
        return 0
    if args[0] in ("-v", "--version"):
        print(VERSIONS[ver])
        return 0
    if args[0] == "make-model":
        return _make_model(args[1:])
    if args[0] != "serve":
        print("usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...", file=sys.stderr)
        print(
            f"vllm: error: argument subparser: invalid choice: '{args[0]}' (choose from 'chat', "
            "'complete', 'serve', 'bench', 'collect-env', 'run-batch')",
            file=sys.stderr,
        )
        return 2
    parser = build_parser(ver)
    ns = parser.parse_args(args[1:])  # exits 2 with vLLM's argparse message on bad input
    ns.model = ns.model_tag or ns.model
    if ns.kv_transfer_config is not None:
        try:
            parse_kv_config(ns.kv_transfer_config)
        except ValueError as e:
            parser.error(f"argument --kv-transfer-config: {e}")
    from .serve import serve

    return serve(ns, non_default_args(ver, args[1:]), ver, env)
