"""An instance's ``args`` (vLLM flags) resolved into the numbers the memory budget uses.

Flags the instance does not set take the engine version's defaults (see
:class:`clusterctl.deploy.preflight.memory.VersionRules`): ``gpu-memory-utilization``
0.9 (0.92 from 0.33), ``max-num-seqs``/``max-num-batched-tokens`` by GPU
size, ``max-model-len`` the model's ``max_position_embeddings``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from clusterctl.deploy.preflight.memory import KV_DTYPE_BYTES, ModelShape, Settings, VersionRules


class FlagError(ValueError):
    """A flag value vLLM would refuse; the message names the flag."""


def _norm(args: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k).lstrip("-").replace("_", "-"): v for k, v in args.items()}


def human_int(value: Any, flag: str, allow_auto: bool = False) -> int:
    """vLLM's human_readable_int: ``32768``, ``32k`` (x1000), ``32K`` (x1024), ``25.6k``;
    ``-1``/``auto`` give -1 when ``allow_auto``."""
    if isinstance(value, bool):
        raise FlagError(f"--{flag}: expected a number, got {value!r}")
    if isinstance(value, int):
        if value == -1 and allow_auto:
            return -1
        if value < 1:
            raise FlagError(f"--{flag}: must be positive, got {value}")
        return value
    s = str(value).strip()
    if allow_auto and s.lower() in ("-1", "auto"):
        return -1
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", s)
    if not m or ("." in m[1] and (not m[2] or m[2].isupper())):
        raise FlagError(f"--{flag}: not a number: {value!r}")
    if not m[2]:
        return int(m[1])
    power = "kmgt".index(m[2].lower()) + 1
    return int(float(m[1]) * (1000 if m[2].islower() else 1024) ** power)


def _flag_on(v: Any) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "yes", "1", ""))


def resolve(
    args: Mapping[str, Any], rules: VersionRules, shape: ModelShape, gpu_name: str, total_bytes: int
) -> Settings:
    """The budget's settings for ``args``; raises :class:`FlagError` for a value vLLM refuses."""
    a = _norm(args)
    util = a.get("gpu-memory-utilization", rules.default_util)
    try:
        util = float(util)
    except (TypeError, ValueError):
        raise FlagError(f"--gpu-memory-utilization: not a number: {util!r}") from None
    if not 0 < util <= 1.0:
        raise FlagError(f"--gpu-memory-utilization: must be in (0, 1], got {util}")
    d_seqs, d_tokens = rules.scheduler_defaults(gpu_name, total_bytes)
    seqs = human_int(a["max-num-seqs"], "max-num-seqs") if a.get("max-num-seqs") is not None else d_seqs
    tokens = (
        human_int(a["max-num-batched-tokens"], "max-num-batched-tokens")
        if a.get("max-num-batched-tokens") is not None
        else d_tokens
    )
    auto = False
    mml = shape.max_position
    if a.get("max-model-len") is not None:
        given = human_int(a["max-model-len"], "max-model-len", allow_auto=rules.version >= (0, 33))
        if given == -1:
            auto = True
        else:
            mml = given
    kv_dtype = str(a.get("kv-cache-dtype") or "auto")
    if kv_dtype != "auto" and kv_dtype not in KV_DTYPE_BYTES:
        raise FlagError(f"--kv-cache-dtype: unknown value {kv_dtype!r}")
    dtype = str(a.get("dtype") or "auto")
    if dtype == "auto":
        dtype = "bfloat16" if shape.dtype == "float32" else shape.dtype
    dtype = {"half": "float16", "float": "float32"}.get(dtype, dtype)
    quant = a.get("quantization") or a.get("q")
    kvmem = a.get("kv-cache-memory-bytes")
    block = a.get("block-size")
    return Settings(
        util=util,
        max_model_len=mml,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        enforce_eager=_flag_on(a.get("enforce-eager", False)),
        kv_cache_dtype=kv_dtype,
        dtype=dtype,
        online_fp8=quant == "fp8" and not shape.quantization,
        kv_cache_memory_bytes=None if kvmem is None else human_int(kvmem, "kv-cache-memory-bytes"),
        block_size=16 if block is None else human_int(block, "block-size"),
        auto_max_model_len=auto,
    )
