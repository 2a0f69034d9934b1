"""Playbooks: a declarative bring-up sequence in YAML (``playbooks/*.yaml``), loaded and validated.

A playbook is a list of named steps run in order by
:mod:`clusterctl.deploy.playbooks.run` (docs/playbooks.md)::

    name: default
    steps:
      - {name: pre-flight, kind: preflight}
      - {name: canary, kind: canary}
      - name: rollout
        kind: rollout
        serial: 1,25%,100%
        max_fail_percentage: 0
        gates:
          - http: {path: /v1/models, expect_status: 200}
          - metric: {name: "vllm:num_requests_waiting", max: 0}
          - exec: {command: 'test "$PORT" -gt 0', expect_rc: 0}

Step kinds: ``preflight``, ``stage``, ``units``, ``canary``, ``rollout``,
``gates``, ``exec``.  Every step takes ``hosts:`` and ``instances:``
patterns that narrow what the command line selected.  Loading reports every
problem at once as ``file:line: message`` (unknown keys suggest the closest
known one) and raises :class:`PlaybookError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.deploy.rollout.batches import SerialError, parse_serial
from clusterctl.errors import ConfigError, Problem
from clusterctl.inventory.fields import Ctx, describe, suggest
from clusterctl.inventory.yamlnodes import Y, parse

KINDS = ("preflight", "stage", "units", "canary", "rollout", "gates", "exec")
#: Kinds that run batches of hosts (``serial``) or judge hosts (``max_fail_percentage``).
SERIAL_KINDS = ("canary", "rollout", "exec")
GATE_KINDS = ("canary", "rollout", "gates")
GATE_TYPES = ("http", "metric", "exec", "drift", "bench")
#: Gates run once (not polled): they replay prompts or a load, which takes a while.
ONE_SHOT = ("drift", "bench")
#: Seconds a custom gate is polled before it fails, unless it says ``timeout``.
DEFAULT_GATE_TIMEOUT_S = 30.0
#: Seconds an exec step's command may run, unless it says ``timeout``.
DEFAULT_EXEC_TIMEOUT_S = 120.0

_TOP_KEYS = ("name", "description", "steps")
_COMMON = ("name", "kind", "hosts", "instances")
_EXTRA = {
    "preflight": (),
    "stage": ("max_fail_percentage",),
    "units": ("max_fail_percentage",),
    "canary": ("serial", "max_fail_percentage", "gates", "gate_timeout"),
    "rollout": ("serial", "max_fail_percentage", "gates", "gate_timeout"),
    "gates": ("max_fail_percentage", "gates", "gate_timeout"),
    "exec": ("serial", "max_fail_percentage", "command", "expect_rc", "timeout"),
}
_GATE_KEYS = {
    "http": ("path", "expect_status", "contains"),
    "metric": ("name", "max", "min"),
    "exec": ("command", "expect_rc"),
    "drift": ("baseline", "thresholds", "calibration"),
    "bench": ("reference", "tolerance", "concurrency", "requests"),
}


class PlaybookError(ConfigError):
    """The playbook failed validation (every problem, each as ``file:line``)."""


@dataclass(frozen=True)
class CustomGate:
    """One custom gate, checked per instance after the standard gate passes.

    ``type`` ``http``: ``GET path`` answers ``expect_status`` (and the body
    contains ``contains``); ``metric``: the metric summed over its series
    in ``/metrics`` is within ``min``..``max``; ``exec``: ``command`` on the
    instance's host exits ``expect_rc`` (with ``INSTANCE``, ``PORT`` and
    ``ADDRESS`` in its environment).  Polled every second for up to
    ``timeout_s`` seconds.  ``drift``: :func:`clusterctl.drift.gate.drift_gate`
    against ``baseline`` (``thresholds`` file, ``calibration``); ``bench``:
    :func:`clusterctl.bench.gate.bench_gate` against the inventory instance
    ``reference`` (one still on the previous version) within ``tolerance``;
    both run once, ``timeout_s`` bounding each request.
    """

    type: str
    line: int
    timeout_s: float = DEFAULT_GATE_TIMEOUT_S
    path: str = ""
    expect_status: int = 200
    contains: str | None = None
    metric: str = ""
    min: float | None = None
    max: float | None = None
    command: str = ""
    expect_rc: int = 0
    baseline: str = "previous"
    thresholds: str | None = None
    calibration: bool = True
    reference: str = ""
    tolerance: float = 0.1
    concurrency: tuple[int, ...] = (1, 8)
    requests: int = 16

    def describe(self) -> str:
        if self.type == "http":
            return f"http GET {self.path} -> {self.expect_status}" + (
                f" containing {self.contains!r}" if self.contains else ""
            )
        if self.type == "metric":
            bounds = [f">= {self.min:g}"] if self.min is not None else []
            bounds += [f"<= {self.max:g}"] if self.max is not None else []
            return f"metric {self.metric} {' and '.join(bounds)}"
        if self.type == "drift":
            return f"drift against baseline {self.baseline!r}"
        if self.type == "bench":
            return f"bench against {self.reference} within {self.tolerance:.0%}"
        return f"exec {self.command!r} -> rc {self.expect_rc}"


@dataclass(frozen=True)
class Step:
    """One step.  ``hosts`` / ``instances``: patterns (``None``: all selected); ``serial``:
    parsed values (empty: one batch); ``gate_timeout_s`` ``None``: the command line's."""

    name: str
    kind: str
    line: int
    hosts: str | None = None
    hosts_line: int = 0
    instances: str | None = None
    serial: list[str] = field(default_factory=list)
    max_fail_percentage: float = 0.0
    gates: list[CustomGate] = field(default_factory=list)
    gate_timeout_s: float | None = None
    command: str = ""
    expect_rc: int = 0
    timeout_s: float = DEFAULT_EXEC_TIMEOUT_S


@dataclass(frozen=True)
class Playbook:
    path: str
    name: str
    steps: list[Step]
    description: str = ""

    def where(self, step: Step, line: int | None = None) -> str:
        """``file:line`` of a step (or of one of its values)."""
        return f"{self.path}:{line or step.line}"


def load_playbook(path: str) -> Playbook:
    """Read and validate ``path``; raises :class:`PlaybookError` with every problem found."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PlaybookError([Problem(path, 0, f"cannot read the playbook: {e}")]) from None
    return parse_playbook(text, path)


def parse_playbook(text: str, path: str) -> Playbook:
    """Validate the YAML ``text`` of a playbook named ``path`` (used in messages)."""
    ctx = Ctx(path)
    root = parse(text, path, ctx.problems)
    book = _playbook(ctx, root, path) if root is not None else None
    errors = sorted((p for p in ctx.problems if p.severity == "error"), key=lambda p: p.line)
    if errors or book is None:
        raise PlaybookError(errors or ctx.problems)
    return book


def _playbook(ctx: Ctx, root: Y, path: str) -> Playbook | None:
    if ctx.mapping(root, "playbook") is None:
        return None
    top = ctx.keys(root, _TOP_KEYS, "playbook")
    name = ctx.string(top["name"], "name") if "name" in top else None
    desc = ctx.string(top["description"], "description") if "description" in top else None
    raw = top.get("steps")
    if raw is None:
        ctx.error(root.line, "playbook: 'steps' is required (a list of steps)")
        return None
    if raw.kind != "seq" or not raw.value:
        ctx.error(raw.line, f"steps: expected a non-empty list of steps, got {describe(raw)}")
        return None
    steps: list[Step] = []
    seen: dict[str, int] = {}
    for i, y in enumerate(raw.value, 1):
        step = _step(ctx, y, i)
        if step is None:
            continue
        if step.name in seen:
            ctx.error(step.line, f"steps[{i}]: duplicate step name {step.name!r} (first at line {seen[step.name]})")
        seen.setdefault(step.name, step.line)
        steps.append(step)
    _order(ctx, steps)
    return Playbook(path, name or Path(path).stem, steps, desc or "")


def _order(ctx: Ctx, steps: list[Step]) -> None:
    """A canary is the first batch: at most one, before every rollout."""
    canaries = [s for s in steps if s.kind == "canary"]
    for extra in canaries[1:]:
        ctx.error(extra.line, f"step {extra.name!r}: a second canary (the first is at line {canaries[0].line})")
    rollouts = [s for s in steps if s.kind == "rollout"]
    if canaries and rollouts and rollouts[0].line < canaries[0].line:
        ctx.error(
            canaries[0].line,
            f"step {canaries[0].name!r}: the canary must come before the rollout (line {rollouts[0].line})",
        )


def _step(ctx: Ctx, y: Y, i: int) -> Step | None:
    what = f"steps[{i}]"
    if ctx.mapping(y, what) is None:
        return None
    kind_y = y.value.get("kind")
    if kind_y is None:
        ctx.error(y.line, f"{what}: 'kind' is required (one of {', '.join(KINDS)})")
        return None
    kind = kind_y.value if isinstance(kind_y.value, str) else None
    if kind not in KINDS:
        ctx.error(
            kind_y.line,
            f"{what}: kind {kind_y.value!r} is not one of {', '.join(KINDS)}" + suggest(str(kind_y.value), list(KINDS)),
        )
        return None
    keys = ctx.keys(y, _COMMON + _EXTRA[kind], f"{what} ({kind})")
    name = (ctx.string(keys["name"], f"{what}.name") if "name" in keys else None) or kind
    what = f"step {name!r}"
    args: dict[str, Any] = {}
    for key in ("hosts", "instances"):
        if key in keys:
            args[key] = ctx.string(keys[key], f"{what}.{key}")
    if "hosts" in keys:
        args["hosts_line"] = keys["hosts"].line
    if "serial" in keys:
        args["serial"] = _serial(ctx, keys["serial"], f"{what}.serial")
    if "max_fail_percentage" in keys:
        mfp = ctx.number(keys["max_fail_percentage"], f"{what}.max_fail_percentage")
        if mfp is not None and not 0 <= mfp <= 100:
            ctx.error(keys["max_fail_percentage"].line, f"{what}.max_fail_percentage: {mfp:g} is not in 0..100")
        elif mfp is not None:
            args["max_fail_percentage"] = float(mfp)
    if "gate_timeout" in keys:
        args["gate_timeout_s"] = ctx.number(keys["gate_timeout"], f"{what}.gate_timeout", positive=True)
    if "gates" in keys:
        args["gates"] = _gates(ctx, keys["gates"], f"{what}.gates")
    if kind == "exec":
        _exec_args(ctx, y, keys, what, args)
        if "timeout" in keys:
            args["timeout_s"] = ctx.number(keys["timeout"], f"{what}.timeout", positive=True)
    args = {k: v for k, v in args.items() if v is not None}
    return Step(name=name, kind=kind, line=y.line, **args)


def _exec_args(ctx: Ctx, y: Y, keys: dict[str, Y], what: str, args: dict[str, Any]) -> None:
    """``command`` (required, a shell command line) and ``expect_rc`` (0-255) of an exec step or gate."""
    cmd = _required(ctx, y, keys, "command", what, "a shell command line")
    if cmd is not None and not cmd.strip():
        ctx.error(keys["command"].line, f"{what}.command: the command is empty")
        cmd = None
    args["command"] = cmd
    if "expect_rc" in keys:
        args["expect_rc"] = ctx.integer(keys["expect_rc"], f"{what}.expect_rc", 0, 255)


def _serial(ctx: Ctx, y: Y, what: str) -> list[str] | None:
    """``2``, ``"25%"``, ``"1,25%,100%"`` or a list ``[1, 25%, 100%]``."""
    if y.kind == "seq":
        text = ",".join(str(v.value) for v in y.value)
    elif y.kind == "scalar" and isinstance(y.value, (int, str)) and not isinstance(y.value, bool):
        text = str(y.value)
    else:
        ctx.error(y.line, f"{what}: expected a count, a percentage or a ramp such as 1,25%,100%, got {describe(y)}")
        return None
    try:
        return parse_serial(text)
    except SerialError as e:
        ctx.error(y.line, f"{what}: {str(e).replace('--serial: ', '')}")
        return None


def _gates(ctx: Ctx, y: Y, what: str) -> list[CustomGate] | None:
    if y.kind != "seq":
        ctx.error(y.line, f"{what}: expected a list of gates (http, metric or exec), got {describe(y)}")
        return None
    out = []
    for i, g in enumerate(y.value, 1):
        gate = _gate(ctx, g, f"{what}[{i}]")
        if gate is not None:
            out.append(gate)
    return out


def _gate(ctx: Ctx, y: Y, what: str) -> CustomGate | None:
    if ctx.mapping(y, what) is None:
        return None
    keys = ctx.keys(y, GATE_TYPES + ("timeout",), what)
    types = [t for t in GATE_TYPES if t in keys]
    if len(types) != 1:
        ctx.error(
            y.line,
            f"{what}: a gate is exactly one of {', '.join(GATE_TYPES)}"
            + (f" (got {', '.join(types)})" if types else ""),
        )
        return None
    t = types[0]
    args: dict[str, Any] = {}
    if "timeout" in keys:
        args["timeout_s"] = ctx.number(keys["timeout"], f"{what}.timeout", positive=True)
    body = keys[t]
    if ctx.mapping(body, f"{what}.{t}") is None:
        return None
    sub = ctx.keys(body, _GATE_KEYS[t], f"{what}.{t}")
    where = f"{what}.{t}"
    if t == "http":
        _http_args(ctx, body, sub, where, args)
    elif t == "metric":
        _metric_args(ctx, body, sub, where, args)
    elif t == "exec":
        _exec_args(ctx, body, sub, where, args)
    elif t == "drift":
        _drift_args(ctx, sub, where, args)
    else:
        _bench_args(ctx, body, sub, where, args)
    if any(v is None for v in args.values()):
        return None
    return CustomGate(type=t, line=y.line, **args)


def _http_args(ctx: Ctx, body: Y, sub: dict[str, Y], where: str, args: dict[str, Any]) -> None:
    p = _required(ctx, body, sub, "path", where, "e.g. /v1/models")
    if p is not None and not p.startswith("/"):
        ctx.error(sub["path"].line, f"{where}.path: {p!r} must start with /")
        p = None
    args["path"] = p
    if "expect_status" in sub:
        args["expect_status"] = ctx.integer(sub["expect_status"], f"{where}.expect_status", 100, 599)
    if "contains" in sub:
        args["contains"] = ctx.string(sub["contains"], f"{where}.contains")


def _required(ctx: Ctx, body: Y, sub: dict[str, Y], key: str, where: str, hint: str) -> str | None:
    """The string ``sub[key]``, or ``None`` with a problem when it is missing or not a string."""
    if key not in sub:
        ctx.error(body.line, f"{where}: {key!r} is required ({hint})")
        return None
    return ctx.string(sub[key], f"{where}.{key}")


def _drift_args(ctx: Ctx, sub: dict[str, Y], where: str, args: dict[str, Any]) -> None:
    for key in ("baseline", "thresholds"):
        if key in sub:
            args[key] = ctx.string(sub[key], f"{where}.{key}")
    if "calibration" in sub:
        args["calibration"] = ctx.boolean(sub["calibration"], f"{where}.calibration")


def _bench_args(ctx: Ctx, body: Y, sub: dict[str, Y], where: str, args: dict[str, Any]) -> None:
    args["reference"] = _required(ctx, body, sub, "reference", where, "an instance still on the previous version")
    if "tolerance" in sub:
        tol = ctx.number(sub["tolerance"], f"{where}.tolerance", positive=True)
        if tol is not None and tol >= 1:
            ctx.error(sub["tolerance"].line, f"{where}.tolerance: {tol:g} is a fraction (0.1 = 10 %), below 1")
            tol = None
        args["tolerance"] = tol
    if "requests" in sub:
        args["requests"] = ctx.integer(sub["requests"], f"{where}.requests", 1, 10000)
    if "concurrency" in sub:
        y = sub["concurrency"]
        items = y.value if y.kind == "seq" else [y]
        levels = [ctx.integer(v, f"{where}.concurrency", 1, 4096) for v in items]
        args["concurrency"] = tuple(v for v in levels if v is not None) if levels and None not in levels else None
        if not levels:
            ctx.error(y.line, f"{where}.concurrency: give at least one level")


def _metric_args(ctx: Ctx, body: Y, sub: dict[str, Y], where: str, args: dict[str, Any]) -> None:
    args["metric"] = _required(ctx, body, sub, "name", where, "e.g. vllm:num_requests_waiting")
    if "max" not in sub and "min" not in sub:
        ctx.error(body.line, f"{where}: give 'max', 'min' or both")
        args["max"] = None
    for bound in ("min", "max"):
        if bound in sub:
            args[bound] = ctx.number(sub[bound], f"{where}.{bound}")
    if args.get("min") is not None and args.get("max") is not None and args["min"] > args["max"]:
        ctx.error(body.line, f"{where}: min {args['min']:g} is above max {args['max']:g}")
