"""Reading engines, models, instances and templates.

References (model, engine, placement hosts, template host patterns) are
checked against what was read before them; cross-instance checks (shared
GPUs and ports, TP rules) live in :mod:`clusterctl.inventory.checks`.
"""

from __future__ import annotations

import re
from typing import Any

from clusterctl.errors import SelectionError
from clusterctl.inventory.multinode import problems as multinode_problems
from clusterctl.inventory.fields import NAME, Ctx, suggest
from clusterctl.inventory.model import (
    CPU_SLOT,
    Engine,
    GpuRef,
    Instance,
    InstanceTemplate,
    Inventory,
    Location,
    Model,
    ModelArch,
    SecretRef,
)
from clusterctl.inventory.nodeset import NodeSetError, expand
from clusterctl.inventory.yamlnodes import Y
from clusterctl.inventory.autoscale import read_policy
from clusterctl.inventory.select import select_hosts

ARCH_KEYS = (
    "layers",
    "hidden_size",
    "attention_heads",
    "kv_heads",
    "head_dim",
    "vocab",
    "params",
    "dtype",
    "quantization",
)
DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class WorkloadReader:
    """Reads the sections that describe what runs where."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def engines(self, y: Y | None) -> dict[str, Engine]:
        ctx = self.ctx
        out: dict[str, Engine] = {}
        for name, ey, line in self._named(y, "engines"):
            known = ctx.keys(ey, ("path", "version", "device"), f"engines.{name}")
            vals = {}
            for key in ("path", "version"):
                if key not in known:
                    ctx.error(ey.line if ey.kind == "map" else line, f"engines.{name}: missing '{key}'")
                else:
                    vals[key] = ctx.string(known[key], f"engines.{name}.{key}")
            device = (
                ctx.string(known["device"], f"engines.{name}.device", ("gpu", "cpu")) if "device" in known else None
            )
            # Registered even when invalid, so references to it do not cascade.
            out[name] = Engine(
                name, vals.get("path") or "", vals.get("version") or "", Location(ctx.filename, line), device or "gpu"
            )
        return out

    def models(self, y: Y | None) -> dict[str, Model]:
        ctx = self.ctx
        out: dict[str, Model] = {}
        for name, my, line in self._named(y, "models"):
            w = f"models.{name}"
            known = ctx.keys(my, ("path", "source", "version", "served_name", "arch"), w)
            model = Model(name=name, path="", location=Location(ctx.filename, line))
            if "path" not in known:
                ctx.error(line, f"{w}: missing 'path' (where vLLM reads the model on the node)")
            for key in ("path", "source", "version", "served_name"):
                if key in known:
                    setattr(model, key, ctx.string(known[key], f"{w}.{key}") or "")
            if "arch" in known:
                model.arch = self._arch(known["arch"], f"{w}.arch")
            out[name] = model
        return out

    def _arch(self, y: Y, what: str) -> ModelArch:
        ctx = self.ctx
        arch = ModelArch()
        if ctx.mapping(y, what) is None:
            return arch
        for key, v in ctx.keys(y, ARCH_KEYS, what).items():
            w = f"{what}.{key}"
            if key == "params":
                val: Any = ctx.number(v, w, positive=True)
            elif key == "dtype":
                val = ctx.string(v, w, DTYPES)
            elif key == "quantization":
                val = None if v.value is None else ctx.string(v, w)
            else:
                val = ctx.integer(v, w, 1)
            if val is not None:
                setattr(arch, key, val)
        if arch.attention_heads and arch.kv_heads and arch.attention_heads % arch.kv_heads:
            ctx.error(
                y.line,
                f"{what}: attention_heads ({arch.attention_heads}) must be a multiple of kv_heads ({arch.kv_heads})",
            )
        return arch

    def _named(self, y: Y | None, what: str) -> list[tuple[str, Y, int]]:
        """The entries of a name -> mapping section, with valid names only."""
        ctx = self.ctx
        m = ctx.mapping(y, what)
        out = []
        for name, v in (m or {}).items():
            assert y is not None
            line = y.key_lines[name]
            if not NAME.match(name):
                ctx.error(line, f"{what}: {name!r} may hold only letters, digits, '_', '.', '-'")
                continue
            if ctx.mapping(v, f"{what}.{name}") is None:
                continue
            if v.kind != "map":
                v = Y({}, line, "map")
            out.append((name, v, line))
        return out

    def instances(self, y: Y | None, inv: Inventory) -> dict[str, Instance]:
        ctx = self.ctx
        out: dict[str, Instance] = {}
        keys = ("model", "engine", "placement", "port", "tp", "args", "env", "role", "secrets")
        for name, iy, line in self._named(y, "instances"):
            w = f"instances.{name}"
            known = ctx.keys(iy, keys, w)
            common = self._run_settings(known, w, line, inv)
            if "placement" not in known:
                ctx.error(line, f"{w}: missing 'placement' (the TP group, e.g. [gpu01:0, gpu01:1])")
                continue
            eng = inv.engines.get(str(common.get("engine") or ""))
            placement = self._placement(known["placement"], w, inv, cpu=eng is not None and eng.device == "cpu")
            if "port" not in known:
                ctx.error(line, f"{w}: missing 'port'")
                continue
            port = ctx.integer(known["port"], f"{w}.port", 1, 65535)
            if placement is None or port is None:
                continue
            if "tp" in known:
                tp = ctx.integer(known["tp"], f"{w}.tp", 1)
                if tp is not None and tp != len(placement):
                    ctx.error(known["tp"].line, f"{w}: tp is {tp} but placement lists {len(placement)} GPU(s)")
            out[name] = Instance(
                name=name, placement=placement, port=port, location=Location(ctx.filename, line), **common
            )
            if len(out[name].hosts) > 1:  # a multi-node replica (inventory/multinode.py)
                for why in multinode_problems(inv, out[name]):
                    ctx.error(known["placement"].line, f"{w}.placement: across {len(out[name].hosts)} hosts: {why}")
        return out

    def _run_settings(self, known: dict[str, Y], w: str, line: int, inv: Inventory) -> dict[str, Any]:
        """model, engine, args, env and role, shared by instances and templates."""
        ctx = self.ctx
        out: dict[str, Any] = {}
        for key, table in (("model", inv.models), ("engine", inv.engines)):
            out[key] = ""
            if key not in known:
                ctx.error(line, f"{w}: missing '{key}'")
                continue
            ref = ctx.string(known[key], f"{w}.{key}")
            if ref is not None and ref not in table:
                ctx.error(known[key].line, f"{w}: {key} {ref!r} is not defined in '{key}s'" + suggest(ref, list(table)))
            out[key] = ref or ""
        out["args"] = {}
        if "args" in known:
            am = ctx.mapping(known["args"], f"{w}.args")
            for k, v in (am or {}).items():
                flag = k[2:] if k.startswith("--") else k
                if flag in ("port", "tensor-parallel-size", "tp", "model"):
                    ctx.error(
                        known["args"].key_lines[k],
                        f"{w}.args: {k!r} is set by clusterctl from port/placement/model; remove it",
                    )
                    continue
                if v.kind == "map":
                    ctx.error(v.line, f"{w}.args.{k}: expected a value or a list, not a mapping")
                    continue
                out["args"][flag] = v.plain()
        out["env"] = {}
        if "env" in known:
            em = ctx.mapping(known["env"], f"{w}.env")
            for k, v in (em or {}).items():
                if v.kind != "scalar" or not isinstance(v.value, str):
                    # the value is not echoed: env often carries secrets
                    hint = "; quote the value" if v.kind == "scalar" and v.value is not None else ""
                    ctx.error(v.line, f"{w}.env.{k}: environment values must be strings{hint}")
                    continue
                out["env"][k] = v.value
        if "role" in known:
            role = ctx.string(known["role"], f"{w}.role", ("mixed", "prefill", "decode"))
            if role is not None:
                out["role"] = role
        out["secrets"] = self._secrets(known["secrets"], f"{w}.secrets", out["env"]) if "secrets" in known else {}
        return out

    def _secrets(self, y: Y, w: str, env: dict[str, str]) -> dict[str, SecretRef]:
        """``NAME: {env: VAR}`` or ``NAME: {file: PATH}``: references, read at deploy time."""
        ctx = self.ctx
        out: dict[str, SecretRef] = {}
        for name, v in (ctx.mapping(y, w) or {}).items():
            line = y.key_lines.get(name, y.line)
            if not ENV_NAME.match(name):
                ctx.error(line, f"{w}: {name!r} is not an environment variable name")
                continue
            if name in env:
                ctx.error(line, f"{w}.{name}: also set under env; keep it in one place")
                continue
            ref = ctx.mapping(v, f"{w}.{name}")
            if ref is None:
                continue
            known = ctx.keys(v, ("env", "file"), f"{w}.{name}")
            if len(known) != 1:
                if len(known) > 1 or not ref:  # else: the unknown key was reported
                    ctx.error(
                        v.line,
                        f"{w}.{name}: give exactly one of env (a variable on the control machine) or file (a path)",
                    )
                continue
            kind, ry = next(iter(known.items()))
            text = ctx.string(ry, f"{w}.{name}.{kind}")
            if text is None:
                continue
            if kind == "env" and not ENV_NAME.match(text):
                ctx.error(ry.line, f"{w}.{name}.env: {text!r} is not an environment variable name")
                continue
            if not text:
                ctx.error(ry.line, f"{w}.{name}.file: empty path")
                continue
            out[name] = SecretRef("env" if kind == "env" else "file", text, Location(ctx.filename, line))
        return out

    def _placement(self, y: Y, w: str, inv: Inventory, cpu: bool = False) -> tuple[GpuRef, ...] | None:
        """The TP group's GPUs; for an engine with ``device: cpu`` also a host name (or ``host:cpu``):
        the instance then takes the host's CPU slot and no GPU."""
        ctx = self.ctx
        items = ctx.string_list(y, f"{w}.placement")
        if items is None:
            return None
        text, line = items[0] if items else ("", y.line)
        host = text[: -len(":cpu")] if text.endswith(":cpu") else text if ":" not in text else None
        if cpu and len(items) == 1 and host is not None:
            if host not in inv.hosts:
                ctx.error(
                    line, f"{w}.placement: host {host!r} is not defined in 'hosts'" + suggest(host, list(inv.hosts))
                )
                return None
            return (GpuRef(host, CPU_SLOT),)
        refs: list[GpuRef] = []
        seen: set[GpuRef] = set()
        ok = True
        for text, line in items:
            try:
                pairs = expand(text, sort=False)
            except NodeSetError as e:
                ctx.error(line, f"{w}.placement: {e}")
                ok = False
                continue
            for pair in pairs:
                host, sep, idx = pair.rpartition(":")
                if not sep or not idx.isdigit():
                    ctx.error(
                        line,
                        f"{w}.placement: {pair!r} is not host:GPU (e.g. gpu01:0)"
                        + (" (an engine with device: cpu takes one host: e.g. cpu01)" if cpu else ""),
                    )
                    ok = False
                    continue
                if host not in inv.hosts:
                    ctx.error(
                        line, f"{w}.placement: host {host!r} is not defined in 'hosts'" + suggest(host, list(inv.hosts))
                    )
                    ok = False
                    continue
                ref = GpuRef(host, int(idx))
                count = inv.hosts[host].gpus.count
                if ref.index >= count:
                    have = f"GPUs 0-{count - 1}" if count else "no GPUs"
                    ctx.error(line, f"{w}.placement: {ref} does not exist ({host} has {have})")
                    ok = False
                    continue
                if ref in seen:
                    ctx.error(line, f"{w}.placement: {ref} is listed twice")
                    ok = False
                    continue
                seen.add(ref)
                refs.append(ref)
        if ok and not refs:
            ctx.error(y.line, f"{w}.placement: no GPUs listed")
            return None
        return tuple(refs) if ok else None

    def templates(self, y: Y | None, inv: Inventory) -> dict[str, InstanceTemplate]:
        ctx = self.ctx
        out: dict[str, InstanceTemplate] = {}
        keys = (
            "model",
            "engine",
            "replicas",
            "tp",
            "hosts",
            "port_base",
            "nodes",
            "args",
            "env",
            "role",
            "secrets",
            "autoscale",
        )
        for name, ty, line in self._named(y, "templates"):
            w = f"templates.{name}"
            known = ctx.keys(ty, keys, w)
            common = self._run_settings(known, w, line, inv)
            vals: dict[str, Any] = {}
            for key, lo in (("replicas", 1), ("tp", 1), ("port_base", 1), ("nodes", 1)):
                if key in known:
                    vals[key] = ctx.integer(known[key], f"{w}.{key}", lo, 65535)
                elif key not in ("port_base", "nodes"):
                    ctx.error(line, f"{w}: missing '{key}'")
            if "hosts" not in known:
                ctx.error(line, f"{w}: missing 'hosts' (a host pattern, e.g. @rack1)")
                continue
            pattern = ctx.string(known["hosts"], f"{w}.hosts")
            if pattern is None:
                continue
            try:
                if not select_hosts(inv, pattern):
                    ctx.error(known["hosts"].line, f"{w}.hosts: {pattern!r} matches no host")
                    continue
            except SelectionError as e:
                ctx.error(known["hosts"].line, f"{w}.hosts: {e}")
                continue
            if None in vals.values() or "replicas" not in vals or "tp" not in vals:
                continue
            eng = inv.engines.get(str(common.get("engine") or ""))
            if eng is not None and eng.device == "cpu" and vals["tp"] != 1:
                ctx.error(
                    known["tp"].line,
                    f"{w}.tp: engine {eng.name} runs on CPU: tp must be 1 (a replica takes a host's CPU slot, no GPUs)",
                )
                continue
            policy = None
            if "autoscale" in known:
                policy = read_policy(ctx, known["autoscale"], f"{w}.autoscale", inv, pattern, vals["replicas"])
            out[name] = InstanceTemplate(
                name=name, hosts=pattern, location=Location(ctx.filename, line), autoscale=policy, **vals, **common
            )
        return out
