"""Reading a template's ``autoscale:`` policy (docs/autoscale.md), with ``file:line`` problems.

```yaml
templates:
  qwen-pool:
    replicas: 2            # the count before the autoscaler first acts; within min..max
    autoscale:
      min: 1
      max: 6
      signal: load         # load | queue | kv | ttft_p90
      high: 0.7            # above this for scale_out_after_s: add replicas
      low: 0.3             # below this for scale_in_after_s (every replica measured): remove one
      scale_out_after_s: 30
      scale_in_after_s: 600
      cooldown_out_s: 60
      cooldown_in_s: 300
      max_step: 2
      hosts: "@rack1"      # within the template's hosts
      gpus: [gpu[01-04]:0-7]
      prefer_gpu: H100
      worth: {H100: 1.0, L40S: 0.45}
```
"""

from __future__ import annotations

from typing import Any

from clusterctl.errors import SelectionError
from clusterctl.inventory.fields import Ctx, suggest
from clusterctl.inventory.model import AutoscalePolicy, GpuRef, Inventory, Location
from clusterctl.inventory.nodeset import NodeSetError, expand
from clusterctl.inventory.select import select_hosts
from clusterctl.inventory.yamlnodes import Y

#: signal -> (default high, default low, the largest meaningful value or None).
SIGNALS: dict[str, tuple[float, float, float | None]] = {
    "load": (0.7, 0.3, 1.0),  # the load score of docs/status.md, 0..1
    "queue": (8.0, 1.0, None),  # waiting requests per replica (worth-weighted)
    "kv": (0.8, 0.3, 1.0),  # KV-cache usage, 0..1
    "ttft_p90": (2.0, 0.5, None),  # seconds, the worst replica's p90 over the window
}

KEYS = (
    "min",
    "max",
    "signal",
    "high",
    "low",
    "window_s",
    "scale_out_after_s",
    "scale_in_after_s",
    "cooldown_out_s",
    "cooldown_in_s",
    "max_step",
    "backoff_s",
    "interval_s",
    "hosts",
    "gpus",
    "prefer_gpu",
    "worth",
    "gate_timeout_s",
    "drain_timeout_s",
)
#: keys holding seconds, with the least value allowed.
SECONDS = {
    "window_s": 0.0,
    "scale_out_after_s": 0.0,
    "scale_in_after_s": 0.0,
    "cooldown_out_s": 0.0,
    "cooldown_in_s": 0.0,
    "backoff_s": 0.0,
    "interval_s": 0.5,
    "gate_timeout_s": 1.0,
    "drain_timeout_s": 0.0,
}


def read_policy(
    ctx: Ctx, y: Y, w: str, inv: Inventory, template_hosts: str | None, replicas: int | None
) -> AutoscalePolicy | None:
    """The policy under ``w`` (``templates.NAME.autoscale``), or ``None`` after recording problems."""
    if ctx.mapping(y, w) is None:
        return None
    known = ctx.keys(y, KEYS, w)
    before = len([p for p in ctx.problems if p.severity == "error"])
    line = y.line
    vals: dict[str, Any] = {"location": Location(ctx.filename, line)}
    for key in ("min", "max"):
        if key not in known:
            ctx.error(line, f"{w}: missing '{key}' (the {'least' if key == 'min' else 'largest'} replica count)")
        else:
            vals[key] = ctx.integer(known[key], f"{w}.{key}", 1, 65535)
    signal = "load"
    if "signal" in known:
        signal = ctx.string(known["signal"], f"{w}.signal", SIGNALS) or "load"
    vals["signal"] = signal
    high, low, top = SIGNALS[signal]
    for key, default in (("high", high), ("low", low)):
        v = ctx.number(known[key], f"{w}.{key}") if key in known else default
        if v is not None and (v < 0 or (top is not None and v > top)):
            ctx.error(
                known[key].line,
                f"{w}.{key}: {v} is out of range 0-{top:g} for signal {signal}"
                if top is not None
                else f"{w}.{key}: {v} must not be negative",
            )
            v = None
        vals[key] = v
    if vals.get("high") is not None and vals.get("low") is not None and not vals["low"] < vals["high"]:
        ctx.error(
            known.get("low", y).line,
            f"{w}: low ({vals['low']:g}) must be below high ({vals['high']:g}): "
            "the band between them is what keeps a flapping signal from oscillating",
        )
    for key, lo in SECONDS.items():
        if key in known:
            v = ctx.number(known[key], f"{w}.{key}")
            if v is not None and v < lo:
                ctx.error(known[key].line, f"{w}.{key}: {v} is below {lo:g} s")
                v = None
            vals[key] = v
    out_s = vals.get("scale_out_after_s", AutoscalePolicy.scale_out_after_s)
    in_s = vals.get("scale_in_after_s", AutoscalePolicy.scale_in_after_s)
    if out_s is not None and in_s is not None and in_s < out_s:
        ctx.error(
            known.get("scale_in_after_s", y).line,
            f"{w}: scale_in_after_s ({in_s:g}) is shorter than scale_out_after_s ({out_s:g}); "
            "removing capacity must wait at least as long as adding it",
        )
    if "max_step" in known:
        vals["max_step"] = ctx.integer(known["max_step"], f"{w}.max_step", 1, 65535)
    if vals.get("min") is not None and vals.get("max") is not None:
        if vals["min"] > vals["max"]:
            ctx.error(known["min"].line, f"{w}: min ({vals['min']}) is above max ({vals['max']})")
        elif replicas is not None and not vals["min"] <= replicas <= vals["max"]:
            ctx.error(
                known["min"].line,
                f"{w}: the template's replicas ({replicas}) is outside min..max ({vals['min']}..{vals['max']})",
            )
    allowed = _allowed_hosts(ctx, inv, template_hosts)
    if "hosts" in known:
        vals["hosts"] = _hosts(ctx, known["hosts"], f"{w}.hosts", inv, allowed)
    if "gpus" in known:
        vals["gpus"] = _gpus(ctx, known["gpus"], f"{w}.gpus", inv, allowed)
    models = sorted({h.gpus.model for h in inv.hosts.values() if h.gpus.model})
    if "prefer_gpu" in known:
        pref = ctx.string(known["prefer_gpu"], f"{w}.prefer_gpu")
        usable = sorted({inv.hosts[h].gpus.model for h in allowed if inv.hosts[h].gpus.model})
        if pref is not None and pref not in usable:
            ctx.error(
                known["prefer_gpu"].line,
                f"{w}.prefer_gpu: no host the template may use has "
                f"GPU model {pref!r} (theirs: {', '.join(usable) or 'none given'})" + suggest(pref, usable),
            )
            pref = None
        vals["prefer_gpu"] = pref
    if "worth" in known:
        vals["worth"] = _worth(ctx, known["worth"], f"{w}.worth", models)
    if len([p for p in ctx.problems if p.severity == "error"]) > before or None in vals.values():
        return None
    vals["min_replicas"], vals["max_replicas"] = vals.pop("min"), vals.pop("max")
    return AutoscalePolicy(**vals)


def _allowed_hosts(ctx: Ctx, inv: Inventory, pattern: str | None) -> list[str]:
    if pattern is None:
        return list(inv.hosts)
    try:
        return [h.name for h in select_hosts(inv, pattern)]
    except SelectionError:
        return []  # reported with the template's hosts


def _hosts(ctx: Ctx, y: Y, w: str, inv: Inventory, allowed: list[str]) -> str | None:
    pattern = ctx.string(y, w)
    if pattern is None:
        return None
    try:
        chosen = [h.name for h in select_hosts(inv, pattern)]
    except SelectionError as e:
        ctx.error(y.line, f"{w}: {e}")
        return None
    outside = [h for h in chosen if h not in allowed]
    if outside:
        ctx.error(
            y.line,
            f"{w}: {', '.join(outside[:5])} {'is' if len(outside) == 1 else 'are'} not among the template's hosts",
        )
        return None
    if not chosen:
        ctx.error(y.line, f"{w}: {pattern!r} matches no host")
        return None
    return pattern


def _gpus(ctx: Ctx, y: Y, w: str, inv: Inventory, allowed: list[str]) -> tuple[GpuRef, ...] | None:
    items = ctx.string_list(y, w)
    if items is None:
        return None
    out: list[GpuRef] = []
    ok = True
    for text, line in items:
        try:
            pairs = expand(text, sort=False)
        except NodeSetError as e:
            ctx.error(line, f"{w}: {e}")
            ok = False
            continue
        for pair in pairs:
            host, sep, idx = pair.rpartition(":")
            if not sep or not idx.isdigit() or host not in inv.hosts:
                ctx.error(
                    line,
                    f"{w}: {pair!r} is not host:GPU of a host in 'hosts' (e.g. gpu01:0)"
                    + (suggest(host, list(inv.hosts)) if sep else ""),
                )
                ok = False
            elif host not in allowed:
                ctx.error(line, f"{w}: {host} is not among the template's hosts")
                ok = False
            elif int(idx) >= inv.hosts[host].gpus.count:
                ctx.error(line, f"{w}: {pair} does not exist ({host} has {inv.hosts[host].gpus.count} GPU(s))")
                ok = False
            else:
                out.append(GpuRef(host, int(idx)))
    if ok and not out:
        ctx.error(y.line, f"{w}: no GPUs listed")
        return None
    return tuple(dict.fromkeys(out)) if ok else None


def _worth(ctx: Ctx, y: Y, w: str, models: list[str]) -> tuple[tuple[str, float], ...] | None:
    m = ctx.mapping(y, w)
    if m is None:
        return None
    out = []
    ok = True
    for model, v in m.items():
        line = y.key_lines.get(model, y.line)
        if model not in models:
            ctx.error(
                line,
                f"{w}: no host of the inventory has GPU model {model!r} "
                f"(known: {', '.join(models) or 'none'})" + suggest(model, models),
            )
            ok = False
            continue
        val = ctx.number(v, f"{w}.{model}", positive=True)
        if val is None:
            ok = False
            continue
        out.append((model, float(val)))
    return tuple(out) if ok else None
