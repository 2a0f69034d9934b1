"""GPU memory: why an instance ran out of memory, and what will not fit.

Checks:

- ``oom.cause``: for each instance log (``<instance>.log``) that shows a
  memory failure, the cause with its numbers and the fix: not enough free
  memory at start (another process holds the GPU), weights that do not fit,
  KV cache too small for max_model_len (with the largest length that fits and
  the utilisation needed), CUDA-graph capture, activations of a large
  prefill batch, the sampler; and the host's OOM killer (kernel log
  ``Out of memory: Killed process``, unit result ``oom-kill``).
- ``oom.fit``: predictions from the inventory (and facts): co-located
  instances whose utilisations add up to more than 1, weights per GPU above
  memory x utilisation, max_model_len whose KV cache cannot fit, foreign
  memory that leaves too little for the next start.
- ``gpu.foreign``: compute processes on a GPU assigned to an instance that do
  not belong to its unit; memory in use with no process (leaked).

Memory sizes in messages are GiB.
"""

from __future__ import annotations

import math
import re
from typing import Any

from clusterctl.diagnose import sources
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.diagnose.thresholds import number, section
from clusterctl.diagnose.vllmlog import LogEvents, parse_log
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.probe.factgroups import GpuProcess, GpusFact, UnitsFact

GIB = 2**30
KERNEL_OOM = re.compile(
    r"(?:Memory cgroup out of memory|Out of memory): Killed process (?P<pid>\d+) "
    r"\((?P<comm>[^)]*)\).*?anon-rss:(?P<rss>\d+)kB"
)
OOM_MEMCG = re.compile(r"oom-kill:.*?task_memcg=(?P<memcg>[^,]*),task=(?P<task>[^,]*),pid=(?P<pid>\d+)")
VLLM_COMM = re.compile(r"python|vllm|VLLM|EngineCore|Worker_TP", re.I)


def arg(inst: Instance | None, name: str, default: Any = None) -> Any:
    """An instance's vLLM argument by flag name (dashes or underscores)."""
    if inst is None:
        return default
    for key in (name, name.replace("-", "_")):
        if key in inst.args:
            return inst.args[key]
    return default


def _util(ctx: AnalysisContext, inst: Instance | None, ev: LogEvents | None = None) -> float:
    default = number(section(ctx.thresholds, "gpu", "oom"), "default_gpu_memory_utilization", 0.9)
    if ev is not None and ev.util is not None:
        return ev.util  # what the failed process really ran with
    v = arg(inst, "gpu-memory-utilization")
    try:
        return float(v) if v is not None else default
    except (TypeError, ValueError):
        return default


def gpu_total_gib(ctx: AnalysisContext, host: str, index: int | None = None) -> float | None:
    """Memory of one GPU in GiB: facts first, then the inventory."""
    g = ctx.fact(host, GpusFact)
    for d in g.devices if g is not None else ():
        if (index is None or d.index == index) and d.memory_total:
            return float(d.memory_total) / GIB
    inv = ctx.inventory
    if inv and host in inv.hosts and inv.hosts[host].gpus.memory_gib:
        return float(inv.hosts[host].gpus.memory_gib)
    return None


def weights_per_gpu_gib(ctx: AnalysisContext, inv: Inventory | None, inst: Instance) -> float | None:
    """Model parameters x bytes per parameter / TP, from the inventory's model arch."""
    if inv is None or inst.model not in inv.models:
        return None
    arch = inv.models[inst.model].arch
    if not arch.params:
        return None
    sizes = section(ctx.thresholds, "gpu", "oom").get("dtype_bytes") or {}
    quant = (arch.quantization or "").lower()
    bytes_per = sizes.get(quant) or sizes.get(arch.dtype) or 2
    return float(arch.params) * float(bytes_per) / max(1, inst.tp_size) / GIB


def kv_bytes_per_token_per_gpu(inv: Inventory | None, inst: Instance) -> float | None:
    """2 (K and V) x layers x kv heads per GPU x head_dim x 2 bytes (bf16 KV)."""
    if inv is None or inst.model not in inv.models:
        return None
    a = inv.models[inst.model].arch
    if not (a.layers and a.kv_heads and a.head_dim):
        return None
    kv_bytes = 1 if "fp8" in str(arg(inst, "kv-cache-dtype", "")) else 2
    return 2.0 * a.layers * max(1, a.kv_heads // max(1, inst.tp_size)) * a.head_dim * kv_bytes


def _instance(ctx: AnalysisContext, name: str) -> Instance | None:
    inv = ctx.inventory
    return inv.instances.get(name) if inv else None


# ------------------------------------------------------------------ oom.cause


@analyzer("oom.cause")
def check_oom_cause(ctx: AnalysisContext) -> list[Finding]:
    out: list[Finding] = []
    for host, name, text in sources.raw_instances(ctx, ".log"):
        ev = parse_log(text)
        out.extend(_log_causes(ctx, host, name, ev))
    out.extend(_kernel_oom(ctx))
    return out


def _subject(name: str) -> str:
    return f"instance:{name}"


def _foreign_on(ctx: AnalysisContext, inst: Instance | None, host: str) -> list[tuple[int | None, GpuProcess]]:
    """Processes on the instance's GPUs that are not its unit's (from facts)."""
    if inst is None:
        return []
    mine = sources.unit_name(inst.name)
    indexes = {g.index for g in inst.placement if g.host == host}
    out: list[tuple[int | None, GpuProcess]] = []
    section = ctx.fact(host, GpusFact)
    for d in section.devices if section is not None else ():
        if d.index in indexes:
            for p in d.processes:
                if p.unit != mine:
                    out.append((d.index, p))
    return out


def _describe(gpu: int | None, p: GpuProcess) -> str:
    mem = f"{p.used_memory / GIB:.1f} GiB" if p.used_memory else "memory unknown"
    who = p.name or "a process this user cannot see"
    unit = f", unit {p.unit}" if p.unit else ""
    return f"pid {p.pid} ({who}{unit}) holds {mem} on GPU {gpu}"


def _log_causes(ctx: AnalysisContext, host: str, name: str, ev: LogEvents) -> list[Finding]:
    inst = _instance(ctx, name)
    subj = _subject(name)
    out: list[Finding] = []
    evidence = tuple(ev.evidence[:3])
    if ev.free_mem:
        f = ev.free_mem
        foreign = _foreign_on(ctx, inst, host)
        colocated = _colocated_sum(ctx.inventory, inst)
        if foreign:
            action = (
                "stop or kill "
                + "; ".join(_describe(g, p) for g, p in foreign)
                + f", or lower --gpu-memory-utilization to {math.floor(f['free'] / f['total'] * 100) / 100:.2f}"
            )
        elif colocated and colocated[0] > 1.0:
            action = (
                f"instances {', '.join(colocated[1])} on the same GPUs ask for {colocated[0]:.2f} of its memory "
                "together; lower their --gpu-memory-utilization so the sum stays below 1"
            )
        else:
            action = (
                "find what holds the GPU (nvidia-smi --query-compute-apps); memory held with no process "
                "left is a leak: reset the GPU; or lower --gpu-memory-utilization to "
                f"{math.floor(f['free'] / f['total'] * 100) / 100:.2f}"
            )
        out.append(
            Finding(
                "oom.cause",
                Severity.CRIT,
                host,
                subj,
                f"not enough free GPU memory at start: {f['free']:.2f} GiB free of {f['total']:.2f}, "
                f"the instance wants {f['util']:.2f} x = {f['req']:.2f} GiB",
                action,
                evidence + tuple(_describe(g, p) for g, p in foreign),
            )
        )
    if ev.host_mem:
        out.append(_host_mem_finding(host, subj, ev, evidence))
    if ev.kv_short:
        k = ev.kv_short
        total = gpu_total_gib(ctx, inst.placement[0].host, inst.placement[0].index) if inst and inst.placement else None
        if total is None and ev.free_mem:
            total = ev.free_mem["total"]
        util = _util(ctx, inst, ev)
        fixes = []
        if k.get("est"):
            fixes.append(f"set --max-model-len to at most {int(k['est'])}")
        knob = _explicit_kv_knob(inst, ev)
        if knob:
            # An explicit KV size is what sized the cache: the utilisation fraction is not the knob.
            explicit = ev.kv_bytes_arg or _int_arg(inst, "kv-cache-memory-bytes")
            if explicit and k.get("est"):  # KV bytes scale with tokens; vLLM rounds GiB to 2 places
                need_bytes = math.ceil(explicit * k["len"] / k["est"] / 2**20) * 2**20
            else:
                need_bytes = math.ceil(k.get("need", 0) * GIB / 2**20) * 2**20
            fixes.append(
                f"or raise {knob} from {explicit} to at least {need_bytes} bytes "
                "(an explicit KV size: --gpu-memory-utilization does not set it)"
                if knob.startswith("--") and explicit and need_bytes > explicit
                else f"or raise {knob} (GiB; it overrides --kv-cache-memory-bytes on the CPU backend)"
                if not knob.startswith("--")
                else f"or raise {knob} (an explicit KV size: --gpu-memory-utilization does not set it)"
            )
        elif k.get("need") is not None and k.get("avail") is not None and total:
            needed = util + (k["need"] - k["avail"]) / total
            fixes.append(
                f"or raise --gpu-memory-utilization from {util:.2f} to at least {math.ceil(needed * 100) / 100:.2f}"
                if needed <= 0.98
                else f"or use a larger GPU / more tensor parallelism (the KV cache needs {needed:.2f} of the GPU)"
            )
        fixes.append("or quantize the KV cache (--kv-cache-dtype fp8)")
        need = (
            f" ({k['need']:.2f} GiB KV needed, {k['avail']:.2f} GiB available)"
            if "need" in k
            else f" (the KV cache holds {int(k['est'])} tokens)"
        )
        out.append(
            Finding(
                "oom.cause",
                Severity.CRIT,
                host,
                subj,
                f"KV cache too small for max_model_len {int(k['len'])}{need}",
                ", ".join(fixes),
                evidence,
            )
        )
    if ev.no_kv or ev.autofit_failed:
        w = f"weights take {ev.weights_gib:.2f} GiB per GPU; " if ev.weights_gib else ""
        out.append(
            Finding(
                "oom.cause",
                Severity.CRIT,
                host,
                subj,
                f"no memory left for the KV cache: {w}weights and activations use the whole budget",
                "raise --gpu-memory-utilization, quantize the weights, increase --tensor-parallel-size, "
                "or use a larger GPU",
                evidence,
            )
        )
    if ev.cuda_oom:
        out.append(_cuda_oom_finding(ctx, host, name, inst, ev))
    return out


def _int_arg(inst: Instance | None, name: str) -> int | None:
    try:
        v = arg(inst, name)
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _explicit_kv_knob(inst: Instance | None, ev: LogEvents) -> str | None:
    """What set the KV size explicitly: ``VLLM_CPU_KVCACHE_SPACE`` (CPU backend, wins), else
    ``--kv-cache-memory-bytes`` (as logged, else the inventory's argument); None: the utilisation did."""
    if ev.device == "cpu" and inst is not None and str(inst.env.get("VLLM_CPU_KVCACHE_SPACE", "")).strip():
        return "VLLM_CPU_KVCACHE_SPACE"
    if ev.kv_bytes_arg is not None or arg(inst, "kv-cache-memory-bytes") is not None or ev.kv_explicit:
        return "--kv-cache-memory-bytes"
    return None


def kv_capacity_advice(inst: Instance | None, inventory: Inventory | None) -> str:
    """How to give an instance more KV cache, by what sizes it (for preemptions and full caches):
    ``VLLM_CPU_KVCACHE_SPACE`` on a CPU instance that sets it, else ``--kv-cache-memory-bytes`` when
    given (an explicit size: the utilisation fraction does not change it), else the GPU fraction."""
    cpu = inst is not None and (
        bool(inst.placement)
        and all(p.is_cpu for p in inst.placement)
        or (inventory is not None and getattr(inventory.engines.get(inst.engine), "device", "gpu") == "cpu")
    )
    if cpu and inst is not None and str(inst.env.get("VLLM_CPU_KVCACHE_SPACE", "")).strip():
        return "raise VLLM_CPU_KVCACHE_SPACE (GiB of host RAM for the KV cache; it overrides --kv-cache-memory-bytes)"
    if arg(inst, "kv-cache-memory-bytes") is not None:
        return "raise --kv-cache-memory-bytes (an explicit KV size: --gpu-memory-utilization does not set it)" + (
            " within the host's free RAM" if cpu else ""
        )
    if cpu:
        return "pass a larger --kv-cache-memory-bytes (the CPU engine's KV cache is host RAM)"
    return "raise --gpu-memory-utilization or TP for more KV cache"


def _host_mem_finding(host: str, subj: str, ev: LogEvents, evidence: tuple[str, ...]) -> Finding:
    """The CPU backend could not get its host memory (vLLM 0.32 cpu_worker.py wordings)."""
    h = ev.host_mem or {}
    where = f"{h.get('free', 0):.2f} GiB available of {h.get('total', 0):.2f} on NUMA node {int(h.get('node', 0))}"
    if "kv" in h:
        return Finding(
            "oom.cause",
            Severity.CRIT,
            host,
            subj,
            f"not enough free host memory for the CPU KV cache: {where}, the instance asks {h['kv']:.2f} GiB",
            "lower --kv-cache-memory-bytes (or VLLM_CPU_KVCACHE_SPACE), or "
            "free host memory (other instances, page cache pins)",
            evidence,
        )
    return Finding(
        "oom.cause",
        Severity.CRIT,
        host,
        subj,
        f"not enough free host memory at start (CPU backend): {where}, the instance wants "
        f"{h.get('util', 0):.2f} x = {h.get('req', 0):.2f} GiB of host RAM",
        "pass --kv-cache-memory-bytes (without it the CPU engine reserves --gpu-memory-utilization "
        "x host RAM), or lower --gpu-memory-utilization",
        evidence,
    )


def _cuda_oom_finding(ctx: AnalysisContext, host: str, name: str, inst: Instance | None, ev: LogEvents) -> Finding:
    c = ev.cuda_oom
    if c is None:
        raise ValueError("no CUDA out-of-memory line in the log")  # called only where the log has one
    numbers = f"tried to allocate {c['tried']:.2f} GiB with {c['free']:.2f} GiB free of {c['total']:.2f} GiB" + (
        f"; this process held {c['this']:.2f} GiB" if c.get("this") is not None else ""
    )
    others = [(pid, g) for pid, g in c.get("others") or [] if g > 0.1]
    evidence = tuple(ev.evidence[:2])
    if others and c.get("this") is not None and sum(g for _, g in others) > 0.05 * c["total"]:
        held = ", ".join(f"pid {p} {g:.1f} GiB" for p, g in others)
        return Finding(
            "oom.cause",
            Severity.CRIT,
            host,
            _subject(name),
            f"CUDA out of memory: other processes hold the GPU ({held}); {numbers}",
            "stop the other processes on this GPU (or move the instance), then restart it",
            evidence,
        )
    phase = c.get("phase")
    if phase == "weights":
        w = weights_per_gpu_gib(ctx, ctx.inventory, inst) if inst else None
        util = _util(ctx, inst, ev)
        budget = util * c["total"]
        tp = inst.tp_size if inst else 1
        fit = ""
        if w:
            need_tp = tp * 2 ** max(0, math.ceil(math.log2(w * 1.15 / budget))) if budget else tp
            fit = (
                f"; weights need {w:.1f} GiB per GPU at TP {tp} against {budget:.1f} GiB "
                f"({util:.2f} x {c['total']:.0f} GiB)"
            )
            fit += (
                f": TP {need_tp} would fit"
                if need_tp > tp
                else ": they fit alone, so something else held the memory (see gpu.foreign)"
            )
        return Finding(
            "oom.cause",
            Severity.CRIT,
            host,
            _subject(name),
            f"the model weights do not fit: {numbers}{fit}",
            "increase --tensor-parallel-size, quantize (--quantization fp8 halves bf16 weights), "
            "raise --gpu-memory-utilization, or use a larger GPU",
            evidence,
        )
    if phase == "cuda_graph":
        return Finding(
            "oom.cause",
            Severity.CRIT,
            host,
            _subject(name),
            f"out of memory while capturing CUDA graphs: {numbers}",
            "add --enforce-eager, or lower --gpu-memory-utilization to leave room for the graphs "
            "(vLLM 0.11 does not count them in its budget)",
            evidence,
        )
    if phase == "sampler":
        return Finding(
            "oom.cause",
            Severity.CRIT,
            host,
            _subject(name),
            f"out of memory in the sampler warm-up (max-num-seqs x vocabulary): {numbers}",
            "lower --max-num-seqs",
            evidence,
        )
    return Finding(
        "oom.cause",
        Severity.CRIT,
        host,
        _subject(name),
        f"out of memory in activations of a large batch ({'profiling' if phase == 'activations' else 'serving'}): "
        f"{numbers}",
        "lower --max-num-batched-tokens (and --max-num-seqs), or lower --gpu-memory-utilization to leave headroom",
        evidence,
    )


def _kernel_oom(ctx: AnalysisContext) -> list[Finding]:
    out: list[Finding] = []
    inv = ctx.inventory
    units = {sources.unit_name(n): n for n in (inv.instances if inv else {})}
    for host in sources.all_hosts(ctx):
        lines, _ = sources.kernel_lines(ctx, host)
        memcg: dict[str, str] = {}
        for line in lines or []:
            m = OOM_MEMCG.search(line)
            if m:
                memcg[m["pid"]] = m["memcg"]
                continue
            m = KERNEL_OOM.search(line)
            if not m:
                continue
            cg = memcg.get(m["pid"], "")
            inst = next((n for u, n in units.items() if cg.endswith("/" + u)), None)
            rss = int(m["rss"]) / 2**20
            if inst is None and not VLLM_COMM.search(m["comm"]):
                sev, subj = Severity.WARN, "host"
            else:
                sev, subj = Severity.CRIT, _subject(inst) if inst else "host"
            out.append(
                Finding(
                    "oom.cause",
                    sev,
                    host,
                    subj,
                    f"the host's OOM killer killed pid {m['pid']} ({m['comm']}) holding {rss:.1f} GiB RAM",
                    "host RAM is exhausted: lower the instances' host memory (--swap-space, "
                    "--safetensors-load-strategy lazy), stop other memory users, or add RAM",
                    (line.strip(),),
                )
            )
        read = ctx.fact(host, UnitsFact)
        for u in read.units if read is not None else ():
            if u.result == "oom-kill":
                name = units.get(u.unit)
                out.append(
                    Finding(
                        "oom.cause",
                        Severity.CRIT,
                        host,
                        _subject(name) if name else f"unit:{u.unit}",
                        f"unit {u.unit} was killed by the OOM killer",
                        "host RAM is exhausted: see the kernel log; lower host memory use or add RAM",
                        (f"Result={u.result}",),
                    )
                )
    return out


# -------------------------------------------------------------------- oom.fit


def _colocated_sum(inv: Inventory | None, inst: Instance | None) -> tuple[float, list[str]] | None:
    """The largest sum of utilisations over the instance's GPUs, and the instances sharing it."""
    if inv is None or inst is None:
        return None
    best: tuple[float, list[str]] | None = None
    for g in inst.placement:
        sharing = sources.instances_on_gpu(inv, g.host, g.index)
        total = sum(float(arg(i, "gpu-memory-utilization", 0.9)) for i in sharing)
        if best is None or total > best[0]:
            best = (total, sorted(i.name for i in sharing))
    return best


@analyzer("oom.fit")
def check_fit(ctx: AnalysisContext) -> list[Finding]:
    out: list[Finding] = []
    inv = ctx.inventory
    for inst in sources.instances(inv):
        engine = inv.engines.get(inst.engine) if inv is not None else None
        if engine is not None and engine.device == "cpu":
            continue  # GPU memory: a CPU engine has none (pre-flight checks its host RAM)
        host, index = inst.placement[0].host, inst.placement[0].index
        total = gpu_total_gib(ctx, host, index)
        subj = _subject(inst.name)
        found: list[Finding] = []
        util = _util(ctx, inst)
        co = _colocated_sum(inv, inst)
        if co and co[0] > 1.0 and len(co[1]) > 1:
            found.append(
                Finding(
                    "oom.fit",
                    Severity.CRIT,
                    host,
                    subj,
                    f"instances {', '.join(co[1])} share GPUs and ask for {co[0]:.2f} of their memory",
                    "lower their --gpu-memory-utilization so the sum stays below 1, or move one",
                )
            )
        w = weights_per_gpu_gib(ctx, inv, inst)
        if total and w is not None and w > util * total:
            need_tp = inst.tp_size * 2 ** math.ceil(math.log2(w * 1.15 / (util * total)))
            found.append(
                Finding(
                    "oom.fit",
                    Severity.CRIT,
                    host,
                    subj,
                    f"weights need {w:.1f} GiB per GPU, more than {util:.2f} x {total:.0f} GiB = "
                    f"{util * total:.1f} GiB",
                    f"use TP {need_tp}, quantize the weights (fp8), or a larger GPU",
                )
            )
        per_tok = kv_bytes_per_token_per_gpu(inv, inst)
        mml = arg(inst, "max-model-len")
        if total and w is not None and per_tok and isinstance(mml, int) and w <= util * total:
            room = util * total - w
            need = mml * per_tok / GIB
            if need > room:
                fits = int(room * GIB / per_tok) // 16 * 16
                found.append(
                    Finding(
                        "oom.fit",
                        Severity.CRIT,
                        host,
                        subj,
                        f"max_model_len {mml} needs {need:.2f} GiB of KV cache per GPU; at most "
                        f"{room:.2f} GiB is left after {w:.1f} GiB of weights",
                        f"set --max-model-len to at most {fits} (less activations), or raise "
                        "--gpu-memory-utilization / the TP size",
                    )
                )
        if total:
            foreign = [(g, p) for g, p in _foreign_all(ctx, inst) if p.used_memory]
            for g in {g for g, _ in foreign}:
                held = sum(p.used_memory or 0 for on, p in foreign if on == g) / GIB
                if held > (1 - util) * total:
                    found.append(
                        Finding(
                            "oom.fit",
                            Severity.CRIT,
                            host,
                            subj,
                            f"other processes hold {held:.1f} GiB on GPU {g}: the next start needs "
                            f"{util:.2f} x {total:.0f} GiB free and will fail",
                            "stop " + "; ".join(_describe(on, p) for on, p in foreign if on == g),
                        )
                    )
        if not found:
            found.append(
                Finding(
                    "oom.fit",
                    Severity.OK,
                    host,
                    subj,
                    "fits on its GPUs" if w is not None else "no model numbers in the inventory to check the fit",
                )
            )
        out.extend(found)
    return out


def _foreign_all(ctx: AnalysisContext, inst: Instance) -> list[tuple[int | None, GpuProcess]]:
    out: list[tuple[int | None, GpuProcess]] = []
    for host in inst.hosts:
        out.extend(_foreign_on(ctx, inst, host))
    # A process of another clusterctl instance sharing the GPU is planned, not foreign.
    others = {sources.unit_name(n) for n in (ctx.inventory.instances if ctx.inventory else {})}
    return [(g, p) for g, p in out if p.unit not in others]


# ---------------------------------------------------------------- gpu.foreign


@analyzer("gpu.foreign")
def check_foreign(ctx: AnalysisContext) -> list[Finding]:
    out: list[Finding] = []
    inv = ctx.inventory
    ghost = number(section(ctx.thresholds, "gpu", "oom"), "ghost_memory_mib", 1024) * 2**20
    known_units = {sources.unit_name(n) for n in (inv.instances if inv else {})}
    for host in list(ctx.facts):
        g = ctx.fact(host, GpusFact)
        if g is None or not g.available:
            continue
        found: list[Finding] = []
        for d in g.devices:
            if d.lost or d.hung or d.index is None:
                continue
            owners = sources.instances_on_gpu(inv, host, d.index)
            procs = d.processes
            if owners:
                mine = {sources.unit_name(i.name) for i in owners}
                strangers = [p for p in procs if p.unit not in mine]
                if strangers:
                    found.append(
                        Finding(
                            "gpu.foreign",
                            Severity.CRIT,
                            host,
                            f"gpu:{d.index}",
                            f"{len(strangers)} process(es) not of instance {', '.join(i.name for i in owners)} use this GPU",
                            "stop them: " + "; ".join(_describe(d.index, p) for p in strangers),
                            tuple(_describe(d.index, p) for p in strangers),
                        )
                    )
            else:
                strangers = [p for p in procs if p.unit in known_units]
                if strangers:
                    found.append(
                        Finding(
                            "gpu.foreign",
                            Severity.WARN,
                            host,
                            f"gpu:{d.index}",
                            "a clusterctl instance runs on a GPU the inventory does not give it",
                            "redeploy so placement and reality agree",
                            tuple(_describe(d.index, p) for p in strangers),
                        )
                    )
            used_by_procs = sum(p.used_memory or 0 for p in procs)
            used = d.memory_used or 0
            if not procs and used > ghost + used_by_procs and owners:
                found.append(
                    Finding(
                        "gpu.foreign",
                        Severity.WARN,
                        host,
                        f"gpu:{d.index}",
                        f"{used / GIB:.1f} GiB in use with no process on the GPU",
                        "memory held by a process that no longer exists: reset the GPU "
                        "(nvidia-smi -r) before the instance starts",
                        (f"memory_used={used}",),
                    )
                )
        out.extend(
            found or [Finding("gpu.foreign", Severity.OK, host, "host", "no foreign processes on instance GPUs")]
        )
    return out
