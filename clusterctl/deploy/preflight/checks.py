"""Pre-flight: refuse, before anything starts, an instance vLLM would refuse or that would clash.

Per instance (``check_instances``, pure; ``run_preflight`` reads the hosts):

* **memory** — the budget vLLM will compute (``clusterctl.deploy.preflight.memory``)
  from the model's real tensor sizes read on the host, sharded by TP: CRIT when
  nothing is left for the KV cache or one ``max_model_len`` request does not
  fit (with vLLM's own estimate of the longest length, and what would fit: the
  longest ``max_model_len`` and the smallest ``gpu_memory_utilization`` that
  keep :data:`~clusterctl.deploy.preflight.memory.MARGIN_BYTES` in hand); WARN when it
  fits with less than that margin.
* **GPU sharing** — the sum of ``gpu_memory_utilization`` of instances on one
  GPU above 1.0, and vLLM's start-up check (free memory after the CUDA
  context < requested) against the memory other processes already hold
  (facts ``gpus[].processes``; the instance's own unit does not count).
* **port** — another process already listening on the port (vLLM binds with
  SO_REUSEPORT and would not fail); the instance's own unit is not a conflict.
* **TP** — heads divisible by TP, enough GPUs, one host, TP > 2 without NVLink.
* **pipeline stages** — a multi-node replica (docs/multinode.md) is checked stage by stage,
  one row per member unit on its own host (``NAME``, ``NAME-nodeR``): the same checks over
  that host's GPUs, with the stage's layers, weights and KV cache (:mod:`clusterctl.deploy.preflight.stages`).

Problems are CRIT (deploy refuses unless forced) or WARN.  A host that
cannot be read is a CRIT row ("could not check"), never an exception.
Host reading lives in ``preflight_hosts``, the report types in ``preflight_report``.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping

from clusterctl.deploy.preflight import flags as flagmod
from clusterctl.deploy.preflight import memory as M
from clusterctl.deploy.units import multinode
from clusterctl.deploy.preflight import stages as pp
from clusterctl.deploy.preflight.ports import check_port
from clusterctl.deploy.preflight.hosts import (
    NODE_TIMEOUT_S,
    GpuProc,
    GpuView,
    HostView,
    gpus_from_facts,
    host_view,
    read_hosts,
)
from clusterctl.deploy.preflight.report import InstanceRow, PreflightProblem, PreflightReport
from clusterctl.deploy.spec import unit_name
from clusterctl.diagnose.findings import Severity
from clusterctl.inventory.model import Engine, Instance, Inventory, Model
from clusterctl.probe.facts import Facts
from clusterctl.fleet.fleet import Fleet

__all__ = [
    "GpuProc",
    "GpuView",
    "HostView",
    "InstanceRow",
    "PreflightProblem",
    "PreflightReport",
    "check_instances",
    "derive_shape",
    "gpus_from_facts",
    "host_view",
    "read_hosts",
    "run_preflight",
]


def _g(n: float) -> float:
    return round(M.gib(n), 2)


def derive_shape(model: Model) -> M.ModelShape | None:
    """A shape from the inventory's ``arch`` when config.json cannot be read on the host.

    The intermediate size is solved from the parameter count (untied
    embeddings, q/k/v/o, gated MLP, two norms per layer); ``max_position`` is
    unknown (0), so ``max_model_len`` must then come from the flags.
    """
    a = model.arch
    if not (a.layers and a.hidden_size and a.attention_heads and a.vocab and a.params):
        return None
    kv = a.kv_heads or a.attention_heads
    d = a.head_dim or a.hidden_size // a.attention_heads
    h, L = a.hidden_size, a.layers
    attn = 2 * h * a.attention_heads * d + 2 * h * kv * d + 2 * h
    inter = int(round((a.params - 2 * a.vocab * h - L * attn - h) / (3 * h * L)))
    if inter <= 0:
        return None
    return M.ModelShape(
        layers=L,
        hidden=h,
        heads=a.attention_heads,
        kv_heads=kv,
        head_dim=d,
        intermediate=inter,
        vocab=a.vocab,
        max_position=0,
        dtype=a.dtype,
        quantization=a.quantization,
    )


def _model_numbers(
    row: InstanceRow, model: Model, doc: Mapping[str, Any] | None
) -> tuple[M.ModelShape, M.WeightSizes] | None:
    """Shape and weight sizes from the host's reader, else the inventory (with a WARN).

    An architecture the arithmetic does not understand (a config.json without
    the fields it reads, layer kinds it does not know) is a WARN with the
    reason, never a CRIT: the deploy may well fit, pre-flight cannot tell.
    """
    why = "not read" if doc is None else str(doc.get("error") or "")
    if doc is not None and not doc.get("error"):
        try:
            shape = M.ModelShape.from_config(doc["config"])
            for note in shape.notes:
                row.add(Severity.WARN, "model.arch", f"model {model.name}: {note}")
            return shape, M.WeightSizes.from_json(doc["weights"])
        except (KeyError, TypeError, ValueError) as e:
            why = f"{model.path}/config.json: missing or invalid field {e}"
    derived = derive_shape(model)
    if derived is None:
        row.add(
            Severity.WARN,
            "model.unknown_arch",
            f"model {model.name} cannot be sized on {row.host} ({why}) and the inventory has no "
            f"complete arch for it: memory not checked",
        )
        return None
    row.add(
        Severity.WARN,
        "model.not_on_host",
        f"model {model.name} not readable on {row.host} ({why}): memory estimated from the "
        f"inventory's arch (params x dtype)",
    )
    return derived, M.weights_from_params(model.arch.params, model.arch.dtype, derived)


def _check_tp(row: InstanceRow, inv: Inventory, inst: Instance, shape: M.ModelShape | None, hv: HostView) -> None:
    tp = inst.tp_size
    host = inv.hosts.get(row.host or "")
    if shape is not None and shape.heads % tp:
        row.add(
            Severity.CRIT,
            "tp.heads",
            f"{shape.heads} attention heads are not divisible by TP {tp}",
            numbers={"heads": shape.heads, "tp": tp},
            fit={"tensor_parallel_size": [t for t in (1, 2, 4, 8) if shape.heads % t == 0 and t <= tp][-1]},
        )
    count = len(hv.gpus) if hv.gpus else (host.gpus.count if host else 0)
    if count and tp > count:
        row.add(
            Severity.CRIT,
            "tp.gpus",
            f"TP {tp} needs {tp} GPUs; {row.host} has {count}",
            numbers={"tp": tp, "gpus": count},
        )
    if host is not None and host.gpus.interconnect == "pcie" and tp > 2:
        row.add(
            Severity.WARN,
            "tp.interconnect",
            f"TP {tp} on a PCIe-only host: all-reduce over PCIe; keep TP at 2 or below without NVLink",
            numbers={"tp": tp, "interconnect": "pcie"},
            fit={"tensor_parallel_size": 2},
        )
    group = set(row.gpus)
    far = [t for t in hv.topology if t.level == "SYSTEM" and set(t.gpus) <= group]
    if far:
        pairs = ", ".join(f"{a}-{b}" for a, b in (t.gpus for t in far))
        row.add(Severity.WARN, "tp.topology", f"TP group spans CPU sockets (GPU pairs {pairs} at SYSTEM level)")


def _check_memory(
    row: InstanceRow,
    shape: M.ModelShape,
    s: M.Settings,
    budget: M.Budget,
    weights: M.WeightSizes,
    totals: list[int],
    rules: M.VersionRules,
    margin: int,
    gpu_count: int,
    adjust: M.Adjust | None = None,
) -> None:
    """``adjust``: a pipeline stage's correction of every budget predicted here (what would fit too)."""
    w = budget.worst
    base = {
        "requested_gib": _g(w.requested),
        "util": s.util,
        "total_gib": _g(w.total),
        "weights_gib": _g(w.weights),
        "activation_gib": _g(w.activation),
        "non_torch_gib": _g(w.non_torch),
        "cuda_graphs_gib": _g(w.graphs),
        "available_kv_gib": _g(w.available_kv),
    }
    util_fit = M.util_to_fit(shape, weights, s, totals, rules, margin, adjust)
    tp_fit = (
        None
        if util_fit is not None
        else M.tp_to_fit(shape, weights, s, totals[0], rules, len(totals), gpu_count, margin, adjust)
    )
    if w.weights + M.CUDA_CONTEXT_BYTES > w.total:
        row.add(
            Severity.CRIT,
            "memory.weights",
            f"the weights alone take {_g(w.weights)} GiB per GPU (TP {len(totals)}), more than the GPU's "
            f"{_g(w.total)} GiB: vLLM fails with CUDA out of memory while loading them",
            numbers=base,
            fit={"tensor_parallel_size": tp_fit},
        )
        return
    if w.available_kv <= 0:
        row.add(
            Severity.CRIT,
            "memory.no_kv",
            f"no memory left for the KV cache: util {s.util} of {_g(w.total)} GiB = {_g(w.requested)} GiB "
            f"< weights {_g(w.weights)} + activation {_g(w.activation)} + non-torch {_g(w.non_torch)}"
            + (f" + CUDA graphs {_g(w.graphs)}" if rules.graphs_in_budget else "")
            + " GiB per GPU",
            numbers=base,
            fit={"gpu_memory_utilization": util_fit, "tensor_parallel_size": tp_fit},
        )
        return
    est = budget.max_len_for(w.available_kv)
    if s.auto_max_model_len:
        if est < s.block_size:
            row.add(
                Severity.CRIT, "memory.kv", "max_model_len auto: not enough memory for a single token", numbers=base
            )
        return
    need = budget.needed_kv
    safe_len = budget.max_len_for(w.available_kv - margin)
    if shape.max_position:
        est, safe_len = min(est, shape.max_position), min(safe_len, shape.max_position)
    nums = {
        **base,
        "max_model_len": s.max_model_len,
        "needed_kv_gib": _g(need),
        "kv_bytes_per_token": budget.kv_bytes_per_token,
        "estimated_max_model_len": est,
    }
    fit: dict[str, Any] = {
        "max_model_len": safe_len or None,
        "gpu_memory_utilization": util_fit,
        "tensor_parallel_size": tp_fit,
    }
    if s.kv_dtype_bytes > 1 and s.kv_cache_memory_bytes is None:
        fp8_s = M.Settings(**{**s.__dict__, "kv_cache_dtype": "fp8"})
        fp8 = M.predict(shape, weights, fp8_s, totals, rules)
        fp8 = adjust(fp8) if adjust else fp8
        if fp8.needed_kv + margin <= fp8.worst.available_kv:
            fit["kv_cache_dtype"] = "fp8"
    if need > w.available_kv:
        row.add(
            Severity.CRIT,
            "memory.kv",
            f"max_model_len {s.max_model_len} needs {_g(need)} GiB of KV cache per GPU, "
            f"{_g(w.available_kv)} GiB available (util {s.util} x {_g(w.total)} GiB = {_g(w.requested)} GiB "
            f"- weights {_g(w.weights)} - activation {_g(w.activation)} - non-torch {_g(w.non_torch)}"
            + (f" - CUDA graphs {_g(w.graphs)}" if rules.graphs_in_budget else "")
            + f"); vLLM's estimated maximum model length is {est}",
            numbers=nums,
            fit=fit,
        )
    elif need + margin > w.available_kv:
        row.add(
            Severity.WARN,
            "memory.margin",
            f"max_model_len {s.max_model_len} needs {_g(need)} GiB of KV cache per GPU, "
            f"{_g(w.available_kv)} GiB available: less than the {_g(margin)} GiB margin left",
            numbers=nums,
            fit=fit,
        )


def _own_held(gpu: GpuView, own: str | Collection[str]) -> int:
    """Memory held by ``own`` (a unit, or units: the instance's own and those the plan stops first)."""
    mine = {own} if isinstance(own, str) else set(own)
    return sum(p.used or 0 for p in gpu.processes if p.unit in mine)


def _check_free(
    row: InstanceRow,
    inst: Instance,
    budget: M.Budget,
    gpus: list[GpuView],
    s: M.Settings,
    stopping: Collection[str] = (),
) -> None:
    own = {unit_name(inst.name), *stopping}
    for rank, g in zip(budget.ranks, gpus):
        foreign = [p for p in g.processes if p.unit not in own]
        free = g.free + _own_held(g, own)
        if s.kv_cache_memory_bytes is None and free - M.CUDA_CONTEXT_BYTES < rank.requested:
            who = ", ".join(
                f"pid {p.pid} {p.name or '?'}"
                + (f" ({p.unit})" if p.unit else "")
                + (f" {_g(p.used)} GiB" if p.used is not None else "")
                for p in foreign
            )
            row.add(
                Severity.CRIT,
                "gpu.free",
                f"GPU {g.index}: {_g(free)} GiB free at start (less the {_g(M.CUDA_CONTEXT_BYTES)} GiB CUDA "
                f"context) < requested {_g(rank.requested)} GiB (util {s.util})" + (f"; held by {who}" if who else ""),
                numbers={"gpu": g.index, "free_gib": _g(free), "requested_gib": _g(rank.requested)},
                fit={
                    "gpu_memory_utilization": max(0.0, int((free - M.CUDA_CONTEXT_BYTES) / g.total * 100) / 100) or None
                },
            )
        elif s.kv_cache_memory_bytes is not None and free < rank.footprint:
            # --kv-cache-memory-bytes skips vLLM's check: the whole footprint must fit what is free.
            row.add(
                Severity.CRIT,
                "gpu.free",
                f"GPU {g.index}: {_g(free)} GiB free < {_g(rank.footprint)} GiB the instance will hold with "
                f"--kv-cache-memory-bytes ({_g(rank.available_kv)} GiB of KV cache)",
                numbers={"gpu": g.index, "free_gib": _g(free), "need_gib": _g(rank.footprint)},
            )
        elif foreign:
            row.add(
                Severity.WARN,
                "gpu.shared",
                f"GPU {g.index} already has {len(foreign)} other process(es) holding "
                f"{_g(sum(p.used or 0 for p in foreign))} GiB",
                numbers={"gpu": g.index, "pids": [p.pid for p in foreign]},
            )


def _check_port(row: InstanceRow, inst: Instance, hv: HostView, stopping: Collection[str] = ()) -> None:
    if hv.listeners is None:
        row.add(
            Severity.WARN,
            "port.unknown",
            f"port {inst.port}: listeners not readable on {row.host} ({hv.listeners_error or 'not read'})",
        )
        return
    bind = inst.args.get("host")
    # Listeners of units the plan stops before this one starts are gone by then.
    gone = set(stopping)
    listeners = [
        li for li in hv.listeners if not (gone and li.pids and all(hv.pid_units.get(p) in gone for p in li.pids))
    ]
    pc = check_port(listeners, inst.port, unit_name(inst.name), hv.pid_units, None if bind is None else str(bind))
    if not pc.free:
        row.add(
            Severity.CRIT,
            "port.taken",
            f"port {inst.port} on {row.host} is already listened on by {', '.join(pc.owners)} "
            "(vLLM binds with SO_REUSEPORT and would share it silently)",
            numbers={"port": inst.port, "listeners": [li.line for li in pc.conflicts]},
        )


#: Resident memory of a CPU engine besides weights and KV cache (Python, torch, tokenizer, API server and
#: engine core processes): about 2 GiB measured on vLLM 0.32's CPU build with the tiny model (docs/real-vllm.md).
CPU_ENGINE_OVERHEAD = 2 * M.GiB
#: The CPU backend's KV block size (vLLM 0.32 logs block_size="128" in cache_config_info).
CPU_BLOCK_SIZE = 128


def _check_cpu_engine(
    row: InstanceRow, inst: Instance, hv: HostView, shape: M.ModelShape, weights: M.WeightSizes
) -> None:
    """A CPU engine: host RAM, not GPU memory.  The KV cache is the explicit --kv-cache-memory-bytes;
    it must hold max_model_len, and weights + KV + the engine's own memory must fit in the host's
    available RAM."""
    args = {str(k).lstrip("-").replace("_", "-"): v for k, v in inst.args.items()}
    try:
        kv = (
            flagmod.human_int(args["kv-cache-memory-bytes"], "kv-cache-memory-bytes")
            if args.get("kv-cache-memory-bytes") is not None
            else None
        )
        mml = (
            flagmod.human_int(args["max-model-len"], "max-model-len")
            if args.get("max-model-len") is not None
            else shape.max_position
        )
    except flagmod.FlagError as e:
        row.add(Severity.CRIT, "flags", str(e))
        return
    if kv is None:
        row.add(
            Severity.CRIT,
            "flags.kv_cache_memory_bytes",
            "a CPU engine needs kv-cache-memory-bytes: without it vLLM reserves 0.92 of the host's RAM "
            "and refuses to start",
        )
        return
    per_token = M.kv_bytes_per_token(shape, 1, M.DTYPE_BYTES.get(shape.dtype, 2))
    block = per_token * CPU_BLOCK_SIZE
    tokens = kv // block * CPU_BLOCK_SIZE  # what vLLM logs as "CPU KV cache size"
    # One block is vLLM's null block: a request can use the others (1 MiB of the tiny model: 8 blocks,
    # "the estimated maximum model length is 896", measured).
    usable = max(0, kv // block - 1) * CPU_BLOCK_SIZE
    row.settings = {"device": "cpu", "kv_cache_memory_bytes": kv, "max_model_len": mml, "predicted_kv_tokens": tokens}
    if mml > usable:
        need = (-(-mml // CPU_BLOCK_SIZE) + 1) * block
        row.add(
            Severity.CRIT,
            "memory.kv",
            f"kv-cache-memory-bytes {kv} holds {usable} tokens for a request, less than max_model_len {mml}: "
            f"set kv-cache-memory-bytes to at least {need} or max-model-len to at most {usable}",
            numbers={"kv_tokens": usable, "max_model_len": mml},
            fit={"kv_cache_memory_bytes": need},
        )
    want = weights.total + kv + CPU_ENGINE_OVERHEAD
    if hv.mem_available is None:
        row.add(
            Severity.WARN,
            "memory.host",
            f"host RAM available on {row.host} unknown (no facts): the instance needs about {M.gib(want):.2f} GiB",
        )
    elif want > hv.mem_available:
        row.add(
            Severity.CRIT,
            "memory.host",
            f"host RAM: the CPU engine needs about {M.gib(want):.2f} GiB (weights {M.gib(weights.total):.2f} + "
            f"KV {M.gib(kv):.2f} + engine {M.gib(CPU_ENGINE_OVERHEAD):.0f}) but {row.host} has "
            f"{M.gib(hv.mem_available):.2f} GiB available",
            numbers={"needed": want, "available": hv.mem_available},
        )


def _check_engine(row: InstanceRow, engine: Engine, hv: HostView) -> None:
    """The engine's executable on the host (the node reader's ``engines``; not read: no claim)."""
    st = None if hv.engines is None else hv.engines.get(engine.path)
    if st is None or st.get("executable"):
        return
    why = f"{engine.path} is not an executable file" if st.get("exists") else f"no {engine.path}"
    row.add(
        Severity.CRIT,
        "engine.missing",
        f"engine {engine.name} (vLLM {engine.version}) is not installed on {hv.name}: {why}; "
        f"`clusterctl engine install {engine.name} --hosts '{hv.name}' --wheels DIR` (or --index-url URL) "
        "installs it (--plan first shows the hosts; docs/bring-up.md)",
        numbers={"host": hv.name, "engine": engine.name, "path": engine.path},
    )


def _check_instance(
    inv: Inventory,
    inst: Instance,
    hosts: Mapping[str, HostView],
    margin: int,
    stopping: Mapping[str, Collection[str]] | None = None,
    stage: tuple[str, int, int] | None = None,
) -> tuple[InstanceRow, list[tuple[int, float, int, int]]]:
    """One instance's row, and per GPU (index, util, predicted NVML use, free) for the sharing check.
    ``stage``: ``(replica, rank, count)`` when ``inst`` is pipeline stage ``rank`` of a multi-node
    replica (one host's unit, :func:`clusterctl.deploy.units.multinode.units`)."""
    host = inst.hosts[0] if inst.hosts else None
    gone = (stopping or {}).get(host or "", ())
    row = InstanceRow(
        instance=inst.name,
        host=host,
        gpus=tuple(g.index for g in inst.placement if not g.is_cpu),
        replica=stage[0] if stage else None,
    )
    usage: list[tuple[int, float, int, int]] = []
    if len(inst.hosts) != 1:
        row.add(
            Severity.CRIT,
            "tp.hosts",
            f"TP group spans {len(inst.hosts)} hosts ({', '.join(inst.hosts)}): one instance must sit on one host",
        )
        return row, usage
    engine = inv.engines.get(inst.engine)
    model = inv.models.get(inst.model)
    if engine is None or model is None:
        row.add(Severity.CRIT, "inventory", f"unknown engine {inst.engine!r} or model {inst.model!r}")
        return row, usage
    row.engine_version = engine.version
    try:
        rules = M.rules_for(engine.version)
    except ValueError as e:
        row.add(Severity.CRIT, "engine.version", f"engine {engine.name}: {e}")
        return row, usage
    hv = hosts.get(host or "")
    if hv is None or hv.reason:
        row.add(Severity.CRIT, "host.unreadable", f"{host}: could not check ({hv.reason if hv else 'not read'})")
        return row, usage
    _check_engine(row, engine, hv)
    nums = _model_numbers(row, model, hv.models.get(model.path))
    shape = nums[0] if nums else None
    if engine.device == "cpu":
        _check_port(row, inst, hv)
        if nums is not None:
            _check_cpu_engine(row, inst, hv, *nums)
        return row, usage
    _check_tp(row, inv, inst, shape, hv)
    if stage is None or stage[1] == 0:  # the workers run headless: no API port
        _check_port(row, inst, hv, gone)
    if nums is None:
        return row, usage
    shape, weights = nums
    full_shape, where = shape, None
    if stage is not None:
        try:
            where = pp.stages(shape.layers, stage[2], inst.tp_size, inst.env.get(pp.PARTITION_ENV))[stage[1]]
        except ValueError as e:
            row.add(Severity.CRIT, "flags", f"{e} (vLLM refuses it)")
            return row, usage
        row.stage = where.describe()
        shape, weights = pp.stage_shape(shape, where), pp.stage_weights(weights, where)
        if shape.sliding_layers or shape.linear_layers:
            row.add(
                Severity.WARN,
                "model.arch",
                f"model {model.name}: the stage's sliding/linear layers are "
                "counted in proportion to its layers (their order across stages is not modelled)",
            )
    row.weights_source = weights.source
    inv_host = inv.hosts.get(host or "")
    gpus: list[GpuView] = []
    for ref in inst.placement:
        g = hv.gpus.get(ref.index)
        if g is None and not hv.gpus and inv_host is not None and inv_host.gpus.memory_gib:
            g = GpuView(
                ref.index,
                inv_host.gpus.model,
                int(inv_host.gpus.memory_gib * M.GiB),
                int(inv_host.gpus.memory_gib * M.GiB),
            )
            if not any(p.check == "gpu.facts" for p in row.problems):
                row.add(
                    Severity.WARN,
                    "gpu.facts",
                    f"{hv.gpu_reason or 'no GPU facts'}: sizes from the "
                    "inventory's gpus.memory_gib, free memory not checked",
                )
        if g is None:
            row.add(Severity.CRIT, "gpu.missing", f"GPU {ref.index} not found on {host}")
        elif g.broken:
            row.add(Severity.CRIT, "gpu.broken", f"GPU {ref.index} on {host}: {g.broken}")
        else:
            gpus.append(g)
    if len(gpus) != inst.tp_size:
        return row, usage
    try:
        s = flagmod.resolve(inst.args, rules, shape, gpus[0].name, gpus[0].total)
    except flagmod.FlagError as e:
        row.add(Severity.CRIT, "flags", str(e))
        return row, usage
    if s.max_model_len <= 0 and not s.auto_max_model_len:  # no config.json and not in args
        row.add(
            Severity.WARN,
            "memory.unknown_len",
            "max_model_len unknown (model not on the host and not in args): KV cache not checked",
        )
        s = M.Settings(**{**s.__dict__, "max_model_len": 1})
    if (
        shape.max_position
        and s.max_model_len > shape.max_position
        and inst.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1"
    ):
        row.add(
            Severity.CRIT,
            "flags.max_model_len",
            f"max_model_len {s.max_model_len} exceeds the model's max_position_embeddings "
            f"{shape.max_position} (vLLM refuses unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)",
            fit={"max_model_len": shape.max_position},
        )
    row.settings = {
        "gpu_memory_utilization": s.util,
        "max_model_len": s.max_model_len,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "kv_cache_dtype": s.kv_cache_dtype,
        "dtype": s.dtype,
        "enforce_eager": s.enforce_eager,
        "online_fp8": s.online_fp8,
    }
    totals = [g.total for g in gpus]
    budget = M.predict(shape, weights, s, totals, rules)
    adjust = None
    if where is not None:
        stage_at = where

        def adjust(b: M.Budget) -> M.Budget:
            return pp.adjust(b, full_shape, s, stage_at)

        budget = adjust(budget)
    row.budget = budget
    _check_memory(
        row,
        shape,
        s,
        budget,
        weights,
        totals,
        rules,
        margin,
        len(hv.gpus) or (inv_host.gpus.count if inv_host else len(gpus)),
        adjust,
    )
    _check_free(row, inst, budget, gpus, s, gone)
    own = {unit_name(inst.name), *gone}
    for rank, g in zip(budget.ranks, gpus):
        # From 0.21 the CUDA graphs are inside the requested budget; before, they come on top.
        in_use = M.CUDA_CONTEXT_BYTES + rank.requested + (0 if rules.graphs_in_budget else rank.graphs)
        usage.append((g.index, s.util, in_use, g.free + _own_held(g, own)))
    return row, usage


def check_instances(
    inv: Inventory,
    instances: Mapping[str, Instance],
    hosts: Mapping[str, HostView],
    *,
    margin: int = M.MARGIN_BYTES,
    stopping: Mapping[str, Collection[str]] | None = None,
) -> PreflightReport:
    """Pre-flight verdicts for ``instances`` given what is known of their ``hosts`` (no I/O).

    ``stopping``: host -> units the plan stops there before any instance starts (removed, and
    restarted ones): the GPU memory and ports they hold count as free (the state after removals).
    """
    report = PreflightReport(margin_bytes=margin)
    shared: dict[tuple[str, int], list[tuple[InstanceRow, float, int, int]]] = {}
    ports: dict[tuple[str, int], list[str]] = {}
    for name in sorted(instances):
        inst = instances[name]
        # a runnable multi-node replica: one row per pipeline stage, on its own host
        members = (
            multinode.units(inst)
            if multinode.is_multinode(inst) and not multinode.problems(inv, inst)
            else [(inst, "")]
        )
        for rank, (unit, _) in enumerate(members):
            row, usage = _check_instance(
                inv, unit, hosts, margin, stopping, (name, rank, len(members)) if len(members) > 1 else None
            )
            report.rows.append(row)
            for idx, util, in_use, free in usage:
                shared.setdefault((row.host or "", idx), []).append((row, util, in_use, free))
            if row.host and rank == 0:
                ports.setdefault((row.host, inst.port), []).append(name)
    for (host, idx), entries in shared.items():
        if len(entries) < 2:
            continue
        names = [r.instance for r, *_ in entries]
        total_util = round(sum(u for _, u, _, _ in entries), 4)
        in_use = sum(n for *_, n, _ in entries)
        free = entries[0][3]
        for r, *_ in entries:
            if total_util > 1.0:
                r.add(
                    Severity.CRIT,
                    "gpu.util_sum",
                    f"{host} GPU {idx} is shared by {', '.join(names)} whose gpu_memory_utilization sums "
                    f"to {total_util} > 1.0",
                    numbers={"gpu": idx, "util_sum": total_util, "instances": names},
                )
            elif in_use > free:
                r.add(
                    Severity.CRIT,
                    "gpu.shared_fit",
                    f"{host} GPU {idx} is shared by {', '.join(names)}: together they will hold "
                    f"{_g(in_use)} GiB (budgets + CUDA contexts + graphs), {_g(free)} GiB free: the last "
                    "to start fails vLLM's free-memory check",
                    numbers={"gpu": idx, "in_use_gib": _g(in_use), "free_gib": _g(free), "instances": names},
                )
    for (host, port), names in ports.items():
        if len(names) > 1:
            for n in names:
                report.row(n).add(
                    Severity.CRIT, "port.duplicate", f"port {port} on {host} is given to {', '.join(names)}"
                )
    return report


def run_preflight(
    inv: Inventory,
    instances: Mapping[str, Instance],
    fleet: Fleet,
    *,
    facts: Mapping[str, Facts] | None = None,
    on_event: Callable[[str], None] | None = None,
    margin: int = M.MARGIN_BYTES,
    timeout: float = NODE_TIMEOUT_S,
    stopping: Mapping[str, Collection[str]] | None = None,
) -> PreflightReport:
    """Read the instances' hosts through ``fleet`` (a :class:`~clusterctl.fleet.fleet.Fleet` over
    at least those hosts) and check every instance; see the module docstring.

    ``facts``: probe facts already gathered (host → :class:`Facts`); hosts
    without are probed.  ``on_event`` receives progress lines.  ``timeout``:
    seconds for the node reader on one host.  Never raises for a host problem:
    an unreadable host is a CRIT row.
    """
    views = read_hosts(fleet, inv, instances, facts, timeout=timeout, on_event=on_event)
    report = check_instances(inv, instances, views, margin=margin, stopping=stopping)
    if on_event:
        on_event(f"pre-flight: {len(report.rows)} instance(s), {len(report.refused)} refused")
    return report
