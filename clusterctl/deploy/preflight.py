"""Pre-flight: refuse, before anything starts, an instance vLLM would refuse or that would clash.

Per instance (``check_instances``, pure; ``run_preflight`` reads the hosts):

* **memory** — the budget vLLM will compute (``clusterctl.deploy.memory``)
  from the model's real tensor sizes read on the host, sharded by TP: CRIT when
  nothing is left for the KV cache or one ``max_model_len`` request does not
  fit (with vLLM's own estimate of the longest length, and what would fit: the
  longest ``max_model_len`` and the smallest ``gpu_memory_utilization`` that
  keep :data:`~clusterctl.deploy.memory.MARGIN_BYTES` in hand); WARN when it
  fits with less than that margin.
* **GPU sharing** — the sum of ``gpu_memory_utilization`` of instances on one
  GPU above 1.0, and vLLM's start-up check (free memory after the CUDA
  context < requested) against the memory other processes already hold
  (facts ``gpus[].processes``; the instance's own unit does not count).
* **port** — another process already listening on the port (vLLM binds with
  SO_REUSEPORT and would not fail); the instance's own unit is not a conflict.
* **TP** — heads divisible by TP, enough GPUs, one host, TP > 2 without NVLink.

Problems are CRIT (deploy refuses unless forced) or WARN.  A host that
cannot be read is a CRIT row ("could not check"), never an exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from clusterctl.deploy import flags as flagmod
from clusterctl.deploy import memory as M
from clusterctl.deploy.ports import Listener, check_port, parse_ss
from clusterctl.deploy.spec import unit_name
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.fleet import shell
from clusterctl.inventory.model import Instance, Inventory, Model
from clusterctl.probe.facts import Facts

NODE_SCRIPT = Path(__file__).with_name("preflight_node.py")
#: Seconds the node reader may take on one host (headers of every shard, ``ss``).
NODE_TIMEOUT_S = 60.0


# -- what pre-flight knows about a host ---------------------------------------------------------

@dataclass(frozen=True)
class GpuProc:
    pid: int
    used: int | None
    unit: str | None
    name: str | None


@dataclass(frozen=True)
class GpuView:
    """One GPU as pre-flight sees it: CUDA's ``total`` and ``free`` (bytes) and who holds memory."""

    index: int
    name: str
    total: int
    free: int
    processes: tuple[GpuProc, ...] = ()
    broken: str | None = None


@dataclass
class HostView:
    """A host's GPUs (from facts), model sizes and listeners (from the node reader).

    ``reason`` set: the host could not be read at all.  ``models`` maps a model
    directory to the reader's document (``config``, ``weights`` or ``error``);
    ``listeners`` is ``None`` when ``ss`` could not be run (``listeners_error``).
    """

    name: str
    reason: str | None = None
    gpus: dict[int, GpuView] = field(default_factory=dict)
    gpu_reason: str | None = None
    topology: list[dict[str, Any]] = field(default_factory=list)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    listeners: list[Listener] | None = None
    listeners_error: str | None = None
    pid_units: dict[int, str | None] = field(default_factory=dict)


def gpus_from_facts(facts: Facts) -> dict[int, GpuView]:
    """GPU views from a facts document.

    NVML's ``memory_total`` includes the driver-reserved memory that CUDA does
    not report as total; it is estimated as ``memory_used`` minus the memory of
    the listed processes (NVML's v1 ``used`` counts the reserved part).
    """
    out: dict[int, GpuView] = {}
    for g in facts.gpus.devices:
        procs = tuple(GpuProc(p.pid, p.used_memory, p.unit, p.name) for p in g.processes or [])
        broken = "lost" if g.lost else "hung" if g.hung else None
        if g.memory_total is None or g.memory_free is None:
            broken = broken or "memory not readable: " + ", ".join(
                f"{k}: {v}" for k, v in g.field_errors.items() if k.startswith("memory")) or "unknown"
            out[g.index] = GpuView(g.index, g.name or "", 0, 0, procs, broken)
            continue
        held = sum(p.used or 0 for p in procs)
        used = g.memory_used if g.memory_used is not None else g.memory_total - g.memory_free
        reserved = max(0, used - held)
        out[g.index] = GpuView(g.index, g.name or "", g.memory_total - reserved, g.memory_free, procs, broken)
    return out


def host_view(name: str, facts: Facts | None, node_doc: Mapping[str, Any] | None,
              reason: str | None = None) -> HostView:
    """Combine a host's facts and the node reader's document (either may be missing)."""
    hv = HostView(name=name, reason=reason)
    if facts is not None:
        if facts.gpus.available:
            hv.gpus = gpus_from_facts(facts)
            hv.topology = list(facts.gpus.topology)
        else:
            hv.gpu_reason = f"NVML unavailable: {facts.gpus.reason or 'no reason given'}"
    else:
        hv.gpu_reason = "no GPU facts"
    if node_doc is not None:
        hv.models = dict(node_doc.get("models") or {})
        li = node_doc.get("listeners")
        if li is not None:
            hv.listeners_error = li.get("error")
            if li.get("ss") or not li.get("error"):
                hv.listeners = parse_ss(li.get("ss") or "")
        hv.pid_units = {int(p): u for p, u in (node_doc.get("pid_units") or {}).items()}
    return hv


# -- the report ---------------------------------------------------------------------------------

@dataclass
class Problem:
    """One reason to refuse (CRIT) or to look (WARN); ``numbers`` are the figures behind it
    (GiB rounded to 0.01, tokens), ``fit`` what would fit instead."""

    severity: Severity
    check: str
    message: str
    numbers: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"severity": self.severity.name, "check": self.check, "message": self.message,
                "numbers": self.numbers, "fit": self.fit}


@dataclass
class InstanceRow:
    """Pre-flight's verdict on one instance.  ``budget`` is ``None`` when memory could not be
    predicted; ``predicted_kv_tokens`` is what vLLM should log as "GPU KV cache size"."""

    instance: str
    host: str | None
    gpus: tuple[int, ...]
    engine_version: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    budget: M.Budget | None = None
    weights_source: str | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.severity == Severity.CRIT for p in self.problems)

    @property
    def severity(self) -> Severity:
        return max((p.severity for p in self.problems), key=lambda s: s.rank, default=Severity.OK)

    @property
    def predicted_kv_tokens(self) -> int | None:
        return None if self.budget is None else self.budget.kv_tokens

    def add(self, severity: Severity, check: str, message: str, **kw: Any) -> None:
        self.problems.append(Problem(severity, check, message, **kw))

    def to_json(self) -> dict[str, Any]:
        b = self.budget
        mem = None if b is None else {
            "ranks": [r.to_json() for r in b.ranks], "kv_bytes_per_token": b.kv_bytes_per_token,
            "max_model_len": b.max_model_len, "needed_kv_gib": round(M.gib(b.needed_kv), 2),
            "predicted_kv_tokens": b.kv_tokens, "max_concurrency": round(b.max_concurrency(), 2),
            "estimated_max_model_len": b.max_len_for(b.worst.available_kv), "weights_source": self.weights_source}
        return {"instance": self.instance, "host": self.host, "gpus": list(self.gpus), "ok": self.ok,
                "severity": self.severity.name, "engine_version": self.engine_version,
                "settings": self.settings, "memory": mem, "problems": [p.to_json() for p in self.problems]}


@dataclass
class PreflightReport:
    """Every instance's row; ``ok`` when no row has a CRIT problem."""

    rows: list[InstanceRow] = field(default_factory=list)
    margin_bytes: int = M.MARGIN_BYTES

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def refused(self) -> list[str]:
        return [r.instance for r in self.rows if not r.ok]

    def row(self, instance: str) -> InstanceRow:
        for r in self.rows:
            if r.instance == instance:
                return r
        raise KeyError(instance)

    def predictions(self) -> dict[str, tuple[str, int]]:
        """Instance → (host, predicted "GPU KV cache size" tokens), for ``kvcheck.read_kv_checks``."""
        return {r.instance: (r.host, r.budget.kv_tokens) for r in self.rows
                if r.budget is not None and r.host is not None}

    def worst(self) -> Severity:
        return max((r.severity for r in self.rows), key=lambda s: s.rank, default=Severity.OK)

    def findings(self) -> list[Finding]:
        """The problems as findings (``check`` prefixed ``preflight.``), for the shared renderers."""
        out = []
        for r in self.rows:
            for p in r.problems:
                fit = ", ".join(f"{k} {v}" for k, v in p.fit.items() if v is not None)
                out.append(Finding(check=f"preflight.{p.check}", severity=p.severity, host=r.host,
                                   subject=f"instance:{r.instance}", message=p.message,
                                   action=f"would fit: {fit}" if fit else "",
                                   evidence=tuple(f"{k}={v}" for k, v in p.numbers.items())))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "severity": self.worst().name, "refused": self.refused,
                "margin_gib": round(M.gib(self.margin_bytes), 2),
                "instances": [r.to_json() for r in self.rows]}


# -- the pure core ------------------------------------------------------------------------------

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
    return M.ModelShape(layers=L, hidden=h, heads=a.attention_heads, kv_heads=kv, head_dim=d,
                        intermediate=inter, vocab=a.vocab, max_position=0, dtype=a.dtype,
                        quantization=a.quantization)


def _model_numbers(row: InstanceRow, model: Model, doc: Mapping[str, Any] | None
                   ) -> tuple[M.ModelShape, M.WeightSizes] | None:
    """Shape and weight sizes from the host's reader, else the inventory (with a WARN)."""
    why = "not read" if doc is None else str(doc.get("error") or "")
    if doc is not None and not doc.get("error"):
        try:
            shape = M.ModelShape.from_config(doc["config"])
            return shape, M.WeightSizes.from_json(doc["weights"])
        except (KeyError, TypeError, ValueError) as e:
            why = f"{model.path}/config.json: missing or invalid field {e}"
    derived = derive_shape(model)
    if derived is None:
        row.add(Severity.CRIT, "model.unreadable",
                f"model {model.name} cannot be sized on {row.host} ({why}) and the inventory has no "
                f"complete arch for it: memory not checked")
        return None
    row.add(Severity.WARN, "model.not_on_host",
            f"model {model.name} not readable on {row.host} ({why}): memory estimated from the "
            f"inventory's arch (params x dtype)")
    return derived, M.weights_from_params(model.arch.params, model.arch.dtype, derived)


def _check_tp(row: InstanceRow, inv: Inventory, inst: Instance, shape: M.ModelShape | None,
              hv: HostView) -> None:
    tp = inst.tp_size
    host = inv.hosts.get(row.host or "")
    if shape is not None and shape.heads % tp:
        row.add(Severity.CRIT, "tp.heads", f"{shape.heads} attention heads are not divisible by TP {tp}",
                numbers={"heads": shape.heads, "tp": tp},
                fit={"tensor_parallel_size": [t for t in (1, 2, 4, 8) if shape.heads % t == 0 and t <= tp][-1]})
    count = len(hv.gpus) if hv.gpus else (host.gpus.count if host else 0)
    if count and tp > count:
        row.add(Severity.CRIT, "tp.gpus", f"TP {tp} needs {tp} GPUs; {row.host} has {count}",
                numbers={"tp": tp, "gpus": count})
    if host is not None and host.gpus.interconnect == "pcie" and tp > 2:
        row.add(Severity.WARN, "tp.interconnect",
                f"TP {tp} on a PCIe-only host: all-reduce over PCIe; keep TP at 2 or below without NVLink",
                numbers={"tp": tp, "interconnect": "pcie"}, fit={"tensor_parallel_size": 2})
    group = set(row.gpus)
    far = [t for t in hv.topology if t.get("level") == "SYSTEM" and set(t.get("gpus") or []) <= group]
    if far:
        pairs = ", ".join(f"{a}-{b}" for a, b in (t["gpus"] for t in far))
        row.add(Severity.WARN, "tp.topology", f"TP group spans CPU sockets (GPU pairs {pairs} at SYSTEM level)")


def _check_memory(row: InstanceRow, shape: M.ModelShape, s: M.Settings, budget: M.Budget,
                  weights: M.WeightSizes, totals: list[int], rules: M.VersionRules, margin: int) -> None:
    w = budget.worst
    base = {"requested_gib": _g(w.requested), "util": s.util, "total_gib": _g(w.total),
            "weights_gib": _g(w.weights), "activation_gib": _g(w.activation),
            "non_torch_gib": _g(w.non_torch), "cuda_graphs_gib": _g(w.graphs),
            "available_kv_gib": _g(w.available_kv)}
    util_fit = M.util_to_fit(shape, weights, s, totals, rules, margin)
    if w.available_kv <= 0:
        row.add(Severity.CRIT, "memory.no_kv",
                f"no memory left for the KV cache: util {s.util} of {_g(w.total)} GiB = {_g(w.requested)} GiB "
                f"< weights {_g(w.weights)} + activation {_g(w.activation)} + non-torch {_g(w.non_torch)}"
                + (f" + CUDA graphs {_g(w.graphs)}" if rules.graphs_in_budget else "") + " GiB per GPU",
                numbers=base, fit={"gpu_memory_utilization": util_fit})
        return
    est = budget.max_len_for(w.available_kv)
    if s.auto_max_model_len:
        if est < s.block_size:
            row.add(Severity.CRIT, "memory.kv", "max_model_len auto: not enough memory for a single token",
                    numbers=base)
        return
    need = budget.needed_kv
    safe_len = budget.max_len_for(w.available_kv - margin)
    if shape.max_position:
        est, safe_len = min(est, shape.max_position), min(safe_len, shape.max_position)
    nums = {**base, "max_model_len": s.max_model_len, "needed_kv_gib": _g(need),
            "kv_bytes_per_token": budget.kv_bytes_per_token, "estimated_max_model_len": est}
    fit: dict[str, Any] = {"max_model_len": safe_len or None, "gpu_memory_utilization": util_fit}
    if s.kv_dtype_bytes > 1 and s.kv_cache_memory_bytes is None:
        fp8 = M.predict(shape, weights, M.Settings(**{**s.__dict__, "kv_cache_dtype": "fp8"}), totals, rules)
        if fp8.needed_kv + margin <= fp8.worst.available_kv:
            fit["kv_cache_dtype"] = "fp8"
    if need > w.available_kv:
        row.add(Severity.CRIT, "memory.kv",
                f"max_model_len {s.max_model_len} needs {_g(need)} GiB of KV cache per GPU, "
                f"{_g(w.available_kv)} GiB available (util {s.util} x {_g(w.total)} GiB = {_g(w.requested)} GiB "
                f"- weights {_g(w.weights)} - activation {_g(w.activation)} - non-torch {_g(w.non_torch)}"
                + (f" - CUDA graphs {_g(w.graphs)}" if rules.graphs_in_budget else "")
                + f"); vLLM's estimated maximum model length is {est}",
                numbers=nums, fit=fit)
    elif need + margin > w.available_kv:
        row.add(Severity.WARN, "memory.margin",
                f"max_model_len {s.max_model_len} needs {_g(need)} GiB of KV cache per GPU, "
                f"{_g(w.available_kv)} GiB available: less than the {_g(margin)} GiB margin left",
                numbers=nums, fit=fit)


def _own_held(gpu: GpuView, own: str) -> int:
    return sum(p.used or 0 for p in gpu.processes if p.unit == own)


def _check_free(row: InstanceRow, inst: Instance, budget: M.Budget, gpus: list[GpuView],
                s: M.Settings) -> None:
    own = unit_name(inst.name)
    for rank, g in zip(budget.ranks, gpus):
        foreign = [p for p in g.processes if p.unit != own]
        free = g.free + _own_held(g, own)
        if s.kv_cache_memory_bytes is None and free - M.CUDA_CONTEXT_BYTES < rank.requested:
            who = ", ".join(f"pid {p.pid} {p.name or '?'}" + (f" ({p.unit})" if p.unit else "")
                            + (f" {_g(p.used)} GiB" if p.used is not None else "") for p in foreign)
            row.add(Severity.CRIT, "gpu.free",
                    f"GPU {g.index}: {_g(free)} GiB free at start (less the {_g(M.CUDA_CONTEXT_BYTES)} GiB CUDA "
                    f"context) < requested {_g(rank.requested)} GiB (util {s.util})"
                    + (f"; held by {who}" if who else ""),
                    numbers={"gpu": g.index, "free_gib": _g(free), "requested_gib": _g(rank.requested)},
                    fit={"gpu_memory_utilization": max(0.0, int((free - M.CUDA_CONTEXT_BYTES) / g.total * 100)
                                                       / 100) or None})
        elif s.kv_cache_memory_bytes is not None and free < rank.footprint:
            # --kv-cache-memory-bytes skips vLLM's check: the whole footprint must fit what is free.
            row.add(Severity.CRIT, "gpu.free",
                    f"GPU {g.index}: {_g(free)} GiB free < {_g(rank.footprint)} GiB the instance will hold with "
                    f"--kv-cache-memory-bytes ({_g(rank.available_kv)} GiB of KV cache)",
                    numbers={"gpu": g.index, "free_gib": _g(free), "need_gib": _g(rank.footprint)})
        elif foreign:
            row.add(Severity.WARN, "gpu.shared",
                    f"GPU {g.index} already has {len(foreign)} other process(es) holding "
                    f"{_g(sum(p.used or 0 for p in foreign))} GiB",
                    numbers={"gpu": g.index, "pids": [p.pid for p in foreign]})


def _check_port(row: InstanceRow, inst: Instance, hv: HostView) -> None:
    if hv.listeners is None:
        row.add(Severity.WARN, "port.unknown",
                f"port {inst.port}: listeners not readable on {row.host} ({hv.listeners_error or 'not read'})")
        return
    bind = inst.args.get("host")
    pc = check_port(hv.listeners, inst.port, unit_name(inst.name), hv.pid_units,
                    None if bind is None else str(bind))
    if not pc.free:
        row.add(Severity.CRIT, "port.taken",
                f"port {inst.port} on {row.host} is already listened on by {', '.join(pc.owners)} "
                "(vLLM binds with SO_REUSEPORT and would share it silently)",
                numbers={"port": inst.port, "listeners": [li.line for li in pc.conflicts]})


def _check_instance(inv: Inventory, inst: Instance, hosts: Mapping[str, HostView],
                    margin: int) -> tuple[InstanceRow, list[tuple[int, float, int, int]]]:
    """One instance's row, and per GPU (index, util, predicted NVML use, free) for the sharing check."""
    host = inst.hosts[0] if inst.hosts else None
    row = InstanceRow(instance=inst.name, host=host, gpus=tuple(g.index for g in inst.placement))
    usage: list[tuple[int, float, int, int]] = []
    if len(inst.hosts) != 1:
        row.add(Severity.CRIT, "tp.hosts", f"TP group spans {len(inst.hosts)} hosts ({', '.join(inst.hosts)}): "
                "one instance must sit on one host")
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
        row.add(Severity.CRIT, "host.unreadable",
                f"{host}: could not check ({hv.reason if hv else 'not read'})")
        return row, usage
    nums = _model_numbers(row, model, hv.models.get(model.path))
    shape = nums[0] if nums else None
    _check_tp(row, inv, inst, shape, hv)
    _check_port(row, inst, hv)
    if nums is None:
        return row, usage
    shape, weights = nums
    row.weights_source = weights.source
    inv_host = inv.hosts.get(host or "")
    gpus: list[GpuView] = []
    for ref in inst.placement:
        g = hv.gpus.get(ref.index)
        if g is None and not hv.gpus and inv_host is not None and inv_host.gpus.memory_gib:
            g = GpuView(ref.index, inv_host.gpus.model, int(inv_host.gpus.memory_gib * M.GiB),
                        int(inv_host.gpus.memory_gib * M.GiB))
            if not any(p.check == "gpu.facts" for p in row.problems):
                row.add(Severity.WARN, "gpu.facts", f"{hv.gpu_reason or 'no GPU facts'}: sizes from the "
                        "inventory's gpus.memory_gib, free memory not checked")
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
        row.add(Severity.WARN, "memory.unknown_len", "max_model_len unknown (model not on the host and not "
                "in args): KV cache not checked")
        s = M.Settings(**{**s.__dict__, "max_model_len": 1})
    if shape.max_position and s.max_model_len > shape.max_position \
            and inst.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        row.add(Severity.CRIT, "flags.max_model_len",
                f"max_model_len {s.max_model_len} exceeds the model's max_position_embeddings "
                f"{shape.max_position} (vLLM refuses unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)",
                fit={"max_model_len": shape.max_position})
    row.settings = {"gpu_memory_utilization": s.util, "max_model_len": s.max_model_len,
                    "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
                    "kv_cache_dtype": s.kv_cache_dtype, "dtype": s.dtype, "enforce_eager": s.enforce_eager,
                    "online_fp8": s.online_fp8}
    totals = [g.total for g in gpus]
    budget = M.predict(shape, weights, s, totals, rules)
    row.budget = budget
    _check_memory(row, shape, s, budget, weights, totals, rules, margin)
    _check_free(row, inst, budget, gpus, s)
    own = unit_name(inst.name)
    for rank, g in zip(budget.ranks, gpus):
        # From 0.21 the CUDA graphs are inside the requested budget; before, they come on top.
        in_use = M.CUDA_CONTEXT_BYTES + rank.requested + (0 if rules.graphs_in_budget else rank.graphs)
        usage.append((g.index, s.util, in_use, g.free + _own_held(g, own)))
    return row, usage


def check_instances(inv: Inventory, instances: Mapping[str, Instance], hosts: Mapping[str, HostView],
                    *, margin: int = M.MARGIN_BYTES) -> PreflightReport:
    """Pre-flight verdicts for ``instances`` given what is known of their ``hosts`` (no I/O)."""
    report = PreflightReport(margin_bytes=margin)
    shared: dict[tuple[str, int], list[tuple[InstanceRow, float, int, int]]] = {}
    ports: dict[tuple[str, int], list[str]] = {}
    for name in sorted(instances):
        inst = instances[name]
        row, usage = _check_instance(inv, inst, hosts, margin)
        report.rows.append(row)
        for idx, util, in_use, free in usage:
            shared.setdefault((row.host or "", idx), []).append((row, util, in_use, free))
        if row.host:
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
                r.add(Severity.CRIT, "gpu.util_sum",
                      f"{host} GPU {idx} is shared by {', '.join(names)} whose gpu_memory_utilization sums "
                      f"to {total_util} > 1.0", numbers={"gpu": idx, "util_sum": total_util, "instances": names})
            elif in_use > free:
                r.add(Severity.CRIT, "gpu.shared_fit",
                      f"{host} GPU {idx} is shared by {', '.join(names)}: together they will hold "
                      f"{_g(in_use)} GiB (budgets + CUDA contexts + graphs), {_g(free)} GiB free: the last "
                      "to start fails vLLM's free-memory check",
                      numbers={"gpu": idx, "in_use_gib": _g(in_use), "free_gib": _g(free), "instances": names})
    for (host, port), names in ports.items():
        if len(names) > 1:
            for n in names:
                report.row(n).add(Severity.CRIT, "port.duplicate",
                                  f"port {port} on {host} is given to {', '.join(names)}")
    return report


# -- reading the hosts --------------------------------------------------------------------------

def _node_requests(instances: Mapping[str, Instance], inv: Inventory) -> dict[str, list[str]]:
    """Host → model directories its instances need sized."""
    out: dict[str, list[str]] = {}
    for inst in instances.values():
        model = inv.models.get(inst.model)
        for h in inst.hosts:
            paths = out.setdefault(h, [])
            if model is not None and model.path not in paths:
                paths.append(model.path)
    return out


def read_hosts(fleet: Any, inv: Inventory, instances: Mapping[str, Instance],
               facts: Mapping[str, Facts] | None = None, *, timeout: float = NODE_TIMEOUT_S,
               on_event: Callable[[str], None] | None = None) -> dict[str, HostView]:
    """Read what pre-flight needs from each instance's host through ``fleet``.

    ``facts`` given for a host are used as they are; the others are probed
    (``clusterctl.probe.run.collect_facts``).  The node reader
    (``preflight_node.py``, stdlib python3, as root through the fleet's sudo)
    reads each model's config.json and safetensors headers, ``ss -Htlnp`` and
    the systemd unit of every listening pid.  Hosts not in the fleet or not
    reachable become views with a ``reason``.
    """
    emit = on_event or (lambda _m: None)
    wanted = _node_requests(instances, inv)
    in_fleet = {h.name for h in fleet.hosts}
    facts = dict(facts or {})
    reasons: dict[str, str] = {}        # why the node reader gave nothing
    fact_reasons: dict[str, str] = {}   # why there are no facts
    missing = [h for h in wanted if h in in_fleet and h not in facts]
    if missing:
        from clusterctl.probe.run import collect_facts
        emit(f"pre-flight: reading GPU facts on {len(missing)} host(s)")
        for name, fr in collect_facts(fleet, sudo=True).items():
            if name not in wanted or name in facts:
                continue
            if fr.facts is not None:
                facts[name] = fr.facts
            else:
                fact_reasons[name] = f"GPU facts: {fr.reason or fr.status}"
    emit(f"pre-flight: reading model sizes and listening ports on {len(wanted)} host(s)")
    commands = {h: shell.python_script([json.dumps({"models": paths, "ports": True})])
                for h, paths in wanted.items() if h in in_fleet}
    docs: dict[str, dict[str, Any]] = {}
    if commands:
        results = fleet.run(commands, stdin=NODE_SCRIPT.read_bytes(), sudo=True, timeout=timeout,
                            require_python=True)
        for r in results:
            if str(r.status) == "ok":
                try:
                    docs[r.host] = json.loads(r.stdout)
                except ValueError as e:
                    reasons.setdefault(r.host, f"pre-flight reader: bad output ({e})")
            else:
                reasons[r.host] = f"{r.status}: {r.error or r.stderr.strip()[-300:] or 'rc ' + str(r.rc)}"
    views = {}
    for h in wanted:
        if h not in in_fleet:
            views[h] = host_view(h, None, None, "not in this fleet")
            continue
        hv = host_view(h, facts.get(h), docs.get(h), None if h in docs else reasons.get(h, "not read"))
        if h in fact_reasons:
            hv.gpu_reason = fact_reasons[h]
        views[h] = hv
    return views


def run_preflight(inv: Inventory, instances: Mapping[str, Instance], fleet: Any, *,
                  facts: Mapping[str, Facts] | None = None, on_event: Callable[[str], None] | None = None,
                  margin: int = M.MARGIN_BYTES, timeout: float = NODE_TIMEOUT_S) -> PreflightReport:
    """Read the instances' hosts through ``fleet`` (a :class:`~clusterctl.fleet.fleet.Fleet` over
    at least those hosts) and check every instance; see the module docstring.

    ``facts``: probe facts already gathered (host → :class:`Facts`); hosts
    without are probed.  ``on_event`` receives progress lines.  ``timeout``:
    seconds for the node reader on one host.  Never raises for a host problem:
    an unreadable host is a CRIT row.
    """
    views = read_hosts(fleet, inv, instances, facts, timeout=timeout, on_event=on_event)
    report = check_instances(inv, instances, views, margin=margin)
    if on_event:
        on_event(f"pre-flight: {len(report.rows)} instance(s), {len(report.refused)} refused")
    return report
