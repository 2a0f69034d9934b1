"""Parse vLLM's log (the unit's journal text) into memory and engine events.

Knows the message texts of vLLM 0.6 (V0), 0.8, 0.11 and 0.33 (see the
research notes): startup free-memory check, CUDA OOM from PyTorch and vLLM's
wrappers, KV cache too small for max_model_len, the weights and KV sizes it
logs, CUDA-graph capture, engine death and NCCL watchdog lines.  Lines may
carry any prefix (journal ``short``/``short-iso`` stamps, ``(EngineCore_DP0
pid=N)``); matching is by message text.  Sizes are GiB (floats).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypedDict

_SIZE = r"([\d.]+)\s*([KMGT]i?B)"
#: Two wordings in vLLM 0.32's source (v1/worker/utils.py): the usual one, and the one when weights are
#: held by another process ("the engine's budget after excluding external process's weights").
FREE_MEM = re.compile(
    r"Free memory on device(?: \S+)? \((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on startup "
    r"is less than (?:desired GPU memory utilization|the engine's budget after excluding "
    r"external process's weights) \((?P<util>[\d.]+), (?P<req>[\d.]+) GiB\)"
)
#: The CPU backend (host RAM of a NUMA node; vLLM 0.32 v1/worker/cpu_worker.py): at start with a
#: utilisation fraction of host RAM, or at KV allocation with an explicit (or auto) KV size.
CPU_FREE_MEM = re.compile(
    r"Available memory on node (?P<node>\d+) \((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on "
    r"(?:startup is less than desired CPU memory utilization \((?P<util>[\d.]+), "
    r"(?P<req>[\d.]+) GiB\)|kv cache allocation is less than requested memory for kv "
    r"\((?P<kv>[\d.]+)(?:/[\d.]+)? GiB\))"
)
#: CPU backend: the KV size it took ("Explicitly set (X/TOTAL) GiB for KV cache on node N." or "Auto set ...").
CPU_KV_SET = re.compile(r"(?P<how>Explicitly|Auto) set \((?P<gib>[\d.]+)/(?P<total>[\d.]+)\) GiB for KV cache on node")
#: "GPU KV cache size: N tokens" (the device word is CPU on the CPU backend, XPU/TPU/... elsewhere).
KV_SIZE = re.compile(r"(?P<dev>[A-Z]{3}) KV cache size: (?P<n>[\d,]+) tokens")
KV_BYTES_ARG = re.compile(r"'kv_cache_memory_bytes': (?P<n>\d+)")
KV_V1 = re.compile(
    r"max seq len \((?P<len>\d+)\), \((?P<need>[\d.]+) GiB KV cache is needed, which is larger "
    r"than the available KV cache memory \((?P<avail>[\d.]+) GiB\)"
    r"(?:\. Based on the available memory, the estimated maximum model length is (?P<est>\d+))?"
)
KV_V0 = re.compile(
    r"The model's max seq len \((?P<len>\d+)\) is larger than the maximum number of tokens that "
    r"can be stored in KV cache \((?P<tokens>\d+)\)"
)
NO_KV = re.compile(r"No available memory for the cache blocks")
AUTOFIT = re.compile(r"Cannot auto-fit max_model_len: not enough GPU memory")
CUDA_OOM = re.compile(
    r"CUDA out of memory\. Tried to allocate "
    + _SIZE
    + r"\. GPU (?P<gpu>\d+) has a total capac(?:i)?ty of "
    + _SIZE
    + r" of which "
    + _SIZE
    + r" is free\."
)
OTHER_PROC = re.compile(r"Process (?P<pid>\d+) has " + _SIZE + r" memory in use")
THIS_PROC = re.compile(r"this process has " + _SIZE + r" memory in use")
WEIGHTS_FAIL = re.compile(r"Failed to create unquantized linear weights|Failed to load model - not enough GPU memory")
WEIGHTS = re.compile(r"(?:Model loading took|Loading model weights took) (?P<gib>[\d.]+) ?(?P<unit>GiB|GB)")
KV_AVAIL = re.compile(
    r"Available KV cache memory: (?P<gib>[\d.]+) ?GiB|the rest of the memory reserved for KV "
    r"Cache is (?P<gib0>[\d.]+) ?GiB"
)
UTIL_ARG = re.compile(r"'gpu_memory_utilization': (?P<u>[\d.]+)|gpu_memory_utilization[ =]\(?(?P<u2>[\d.]+)")
MAXLEN_ARG = re.compile(r"'max_model_len': (?P<n>\d+)|Using max model len (?P<n2>\d+)|max_model_len=(?P<n3>\d+)")
GRAPH = re.compile(r"Capturing CUDA graph|capture_model|cuda_graph|CUDAGraph|cudagraph")
PROFILE = re.compile(r"profile_run|_dummy_run|determine_available_memory|Memory profiling")
SAMPLER = re.compile(r"_dummy_sampler_run|sampler")
READY = re.compile(r"Application startup complete")
ENGINE_DEAD = re.compile(
    r"EngineDeadError|Engine core proc \S+ died unexpectedly|Worker proc \S+ died unexpectedly|"
    r"MPClient: engine core exited unexpectedly|Engine core process \S+ died unexpectedly|"
    r"EngineCore encountered an issue|RPC call to \S+ timed out|EngineCore failed to start|"
    r"Engine core initialization failed"
)
#: One worker of a multi-GPU engine died: the TP rank from its process name.  vLLM's multiproc executor logs
#: "Worker proc %s died unexpectedly, shutting down executor." with the process name: ``VllmWorker-1``
#: (0.8-0.10), ``Worker_TP1`` / ``Worker_TP1_EP1`` / ``Worker_PP0_TP1`` (0.11+); the Ray executor
#: "RayWorkerProc rank=[3] died unexpectedly".
WORKER_DEAD = re.compile(
    r"Worker proc (?:VllmWorker-(?P<v>\d+)|(?P<name>Worker(?:_PP(?P<pp>\d+))?_TP(?P<tp>\d+)"
    r"(?:_EP\d+)?)) died unexpectedly|RayWorkerProc rank=\[?(?P<ray>\d+)\]? died unexpectedly"
)
NCCL = re.compile(r"Watchdog caught collective operation timeout|NCCL WARN|NCCL error")
PREEMPT_V0 = re.compile(
    r"is preempted by PreemptionMode\.\w+ mode because there is not enough KV cache space.*?"
    r"total_(?:num_)?cumulative_preemption(?:_cnt)?=(?P<n>\d+)"
)
#: The periodic stats line: 0.11 "Running: R reqs, Waiting: W reqs, GPU KV cache usage: K%"; 0.32/0.33 put
#: optional fields between ("Deferred: D reqs", "KV fetch: ...", "Preemptions: P" -- printed only when
#: non-zero in 0.32) and name the device ("CPU KV cache usage"); V0 "Swapped:"/"Pending:".
STATS = re.compile(
    r"Running: (?P<run>\d+) reqs,(?: Swapped: \d+ reqs,)? (?:Waiting|Pending): (?P<wait>\d+) reqs,"
    r"(?P<mid>[^%]*?) (?:[A-Z]{3} )?KV cache usage: (?P<kv>[\d.]+)%"
)
STATS_PREEMPT = re.compile(r"Preemptions: (?P<pre>\d+)")
STATS_DEFERRED = re.compile(r"Deferred: (?P<n>\d+) reqs")


def gib(value: str, unit: str) -> float:
    """``("512.00", "MiB")`` -> 0.5; decimal units (``GB``) are converted to GiB too."""
    power = "KMGT".index(unit[0].upper()) + 1
    factor = (1024**power if "i" in unit else 1000**power) / 2**30
    return float(value) * factor


class CudaOom(TypedDict):
    """A ``torch.OutOfMemoryError`` line: GiB ``tried`` to allocate, ``total`` and ``free`` on
    ``gpu``, held by ``this`` process (None: not said) and by ``others`` ((pid, GiB) pairs), and
    the ``phase`` it fell in (weights, cuda_graph, sampler, activations, runtime)."""

    tried: float
    gpu: int
    total: float
    free: float
    this: float | None
    others: list[tuple[int, float]]
    phase: str


class DeadWorker(TypedDict):
    """The first dead worker (WORKER_DEAD): its TP ``rank``, pipeline stage ``pp`` (None: not
    said), ``process`` name and the log ``line``."""

    rank: int
    pp: int | None
    process: str
    line: str


@dataclass
class LogEvents:
    """What one vLLM log says about memory and the engine."""

    free_mem: dict[str, float] | None = None  # free, total, util, req (GiB)
    host_mem: dict[str, float] | None = None  # CPU backend: node, free, total, and util+req or kv (GiB)
    kv_short: dict[str, float] | None = None  # len, need, avail, est (GiB / tokens)
    no_kv: bool = False
    autofit_failed: bool = False
    cuda_oom: CudaOom | None = None
    weights_gib: float | None = None
    kv_avail_gib: float | None = None
    kv_bytes_arg: int | None = None  # --kv-cache-memory-bytes as logged in non-default args
    kv_explicit: bool | None = None  # CPU backend: the KV size was set explicitly (not auto)
    device: str | None = None  # "gpu", "cpu", ... from the KV cache size line
    util: float | None = None
    max_model_len: int | None = None
    ready: bool = False
    engine_dead: list[str] = field(default_factory=list)
    dead_worker: DeadWorker | None = None
    nccl: list[str] = field(default_factory=list)
    preemptions_v0: int | None = None
    stats: list[dict[str, float]] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)


def parse_log(text: str) -> LogEvents:
    """Scan one log; the first occurrence of each error wins, sizes the last."""
    ev = LogEvents()
    phase = "startup"
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if READY.search(line):
            ev.ready, phase = True, "runtime"
        if GRAPH.search(line) and phase == "startup" and "Capturing" in line:
            phase = "cuda_graph"
        m = WEIGHTS.search(line)
        if m:
            ev.weights_gib = float(m["gib"]) * (1e9 / 2**30 if m["unit"] == "GB" else 1.0)
            if phase == "startup":
                phase = "profile"
        m = KV_AVAIL.search(line)
        if m:
            ev.kv_avail_gib = float(m["gib"] or m["gib0"])
        m = CPU_KV_SET.search(line)
        if m:
            ev.kv_avail_gib, ev.kv_explicit, ev.device = float(m["gib"]), m["how"] == "Explicitly", "cpu"
        m = KV_SIZE.search(line)
        if m:
            ev.device = m["dev"].lower()
        m = KV_BYTES_ARG.search(line)
        if m and ev.kv_bytes_arg is None:
            ev.kv_bytes_arg = int(m["n"])
        m = UTIL_ARG.search(line)
        if m and ev.util is None:
            ev.util = float(m["u"] or m["u2"])
        m = MAXLEN_ARG.search(line)
        if m and ev.max_model_len is None:
            ev.max_model_len = int(m["n"] or m["n2"] or m["n3"])
        m = FREE_MEM.search(line)
        if m and ev.free_mem is None:
            ev.free_mem = {k: float(v) for k, v in m.groupdict().items()}
            ev.evidence.append(line.strip())
        m = CPU_FREE_MEM.search(line)
        if m and ev.host_mem is None:
            ev.host_mem = {k: float(v) for k, v in m.groupdict().items() if v is not None}
            ev.device = "cpu"
            ev.evidence.append(line.strip())
        m = KV_V1.search(line)
        if m and ev.kv_short is None:
            ev.kv_short = {k: float(v) for k, v in m.groupdict().items() if v is not None}
            ev.evidence.append(line.strip())
        m = KV_V0.search(line)
        if m and ev.kv_short is None:
            ev.kv_short = {"len": float(m["len"]), "est": float(m["tokens"])}
            ev.evidence.append(line.strip())
        if NO_KV.search(line) and not ev.no_kv:
            ev.no_kv = True
            ev.evidence.append(line.strip())
        if AUTOFIT.search(line) and not ev.autofit_failed:
            ev.autofit_failed = True
            ev.evidence.append(line.strip())
        m = CUDA_OOM.search(line)
        if m and ev.cuda_oom is None:
            ev.cuda_oom = _cuda_oom(m, line, lines[max(0, i - 40) : i + 5], phase)
            ev.evidence.append(line.strip())
        if ENGINE_DEAD.search(line):
            ev.engine_dead.append(line.strip())
        m = WORKER_DEAD.search(line)
        if m and ev.dead_worker is None:
            rank = m["v"] or m["tp"] or m["ray"]
            ev.dead_worker = {
                "rank": int(rank),
                "pp": int(m["pp"]) if m["pp"] else None,
                "process": m["name"] or (f"VllmWorker-{m['v']}" if m["v"] else f"RayWorkerProc {rank}"),
                "line": line.strip(),
            }
        if NCCL.search(line):
            ev.nccl.append(line.strip())
        m = PREEMPT_V0.search(line)
        if m:
            ev.preemptions_v0 = int(m["n"])
        m = STATS.search(line)
        if m:
            pre = STATS_PREEMPT.search(m["mid"] or "") or STATS_PREEMPT.search(line[m.end() :])
            deferred = STATS_DEFERRED.search(m["mid"] or "")
            ev.stats.append(
                {
                    "running": float(m["run"]),
                    "waiting": float(m["wait"]),
                    "kv": float(m["kv"]) / 100,
                    **({"preemptions": float(pre["pre"])} if pre else {}),
                    **({"deferred": float(deferred["n"])} if deferred else {}),
                }
            )
    return ev


def _cuda_oom(m: re.Match[str], line: str, around: list[str], phase: str) -> CudaOom:
    g = m.groups()
    this = THIS_PROC.search(line)
    context = "\n".join(around)
    if WEIGHTS_FAIL.search(context) or (phase == "startup"):
        where = "weights"
    elif phase == "cuda_graph" or GRAPH.search(context):
        where = "cuda_graph"
    elif SAMPLER.search(context) and PROFILE.search(context):
        where = "sampler"
    elif phase == "profile" or PROFILE.search(context):
        where = "activations"
    else:
        where = "runtime"
    return {
        "tried": gib(g[0], g[1]),
        "gpu": int(m["gpu"]),
        "total": gib(g[3], g[4]),
        "free": gib(g[5], g[6]),
        "this": gib(*this.groups()) if this else None,
        "others": [(int(p["pid"]), gib(p.group(2), p.group(3))) for p in OTHER_PROC.finditer(line)],
        "phase": where,
    }
