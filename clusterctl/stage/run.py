"""Control side: run a staging plan, ``status``, ``warm`` and ``evict`` over a Fleet.

Every host gets exactly one :class:`NodeRow`, whatever happened (unreachable,
timed out, disk full...).  Nothing here prints; the CLI renders the rows.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from clusterctl.inventory.model import Host, Model
from clusterctl.fleet import ship
from clusterctl.stage import bundle
from clusterctl.node.stage import manifest as mf
from clusterctl.stage.plan import (
    DEFAULT_PORT,
    NodePlan,
    Source,
    StageError,
    plan_chains,
    push_frames,
    rack_groups,
)

#: Where ``verify-model`` is installed on each node (the deploy unit's ExecStartPre).
VERIFY_MODEL_PATH = "/usr/local/lib/clusterctl/verify-model"
#: Where ``pin-model`` is installed on each node (``stage pin``).
PIN_MODEL_PATH = "/usr/local/lib/clusterctl/pin-model"
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, where: str = "--budget") -> int:
    """``16G`` / ``512M`` / ``1.5T`` / ``17179869184`` → bytes (binary units; ``GiB`` and ``GB`` read as G)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _SIZE_UNITS and t[-1:] else ""
    try:
        value = float(t[:-1] if unit else t)
    except ValueError:
        raise StageError(f"{where}: {text!r} is not a size (e.g. 16G, 512M, or bytes)") from None
    if value <= 0:
        raise StageError(f"{where}: {text!r} must be more than zero")
    return int(value * _SIZE_UNITS[unit])


#: Largest model pushed from a local directory over SSH stdin (held in memory here).
MAX_PUSH_BYTES = 2 * 1024**3


@dataclass
class NodeRow:
    """One host's outcome.  ``status``: ``staged``, ``present`` (already verified),
    ``ok`` (status/warm/evict), ``failed`` (the node reported an error: ``kind``
    says which) or a fleet status (``unreachable``, ``timeout``, ...)."""

    host: str
    status: str
    error: str | None = None
    kind: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("staged", "present", "ok")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"host": self.host, "status": self.status}
        if self.error:
            d["error"] = self.error
            d["kind"] = self.kind
        d.update({k: v for k, v in self.data.items() if k not in ("ok", "host", "space")})
        d["duration_s"] = round(self.duration_s, 3)
        return d


@dataclass
class StageReport:
    model: str
    version: str
    source: str
    relay: str
    bytes_total: int
    rows: list[NodeRow]
    seconds: float
    plan: list[NodePlan] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "source": self.source,
            "relay": self.relay,
            "bytes_total": self.bytes_total,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "hosts": [r.to_dict() for r in self.rows],
        }


#: Node-side progress lines on stderr (``clusterctl_stage_node.main.PROGRESS_MARK``).
PROGRESS_MARK = "clusterctl-progress "
OnProgress = Callable[[str, int, int], None]


class ProgressLines:
    """Turns each host's raw stderr chunks into ``on_progress(host, done_bytes, total_bytes)`` calls."""

    def __init__(self, on_progress: OnProgress):
        self.on_progress = on_progress
        self._partial: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def __call__(self, host: str, chunk: bytes) -> None:
        with self._lock:
            data = self._partial.get(host, b"") + chunk
            *lines, self._partial[host] = data.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if line.startswith(PROGRESS_MARK):
                try:
                    p = json.loads(line[len(PROGRESS_MARK) :])
                    self.on_progress(host, int(p["done"]), int(p["total"]))
                except (ValueError, KeyError, TypeError):
                    continue


def _row(res: Any, ok_status: str) -> NodeRow:
    status = str(getattr(res.status, "value", res.status))
    data: dict[str, Any] | None = None
    for line in reversed((res.stdout or "").strip().splitlines()):
        try:
            data = json.loads(line)
            break
        except ValueError:
            continue
    if isinstance(data, dict) and "ok" in data:
        if data["ok"]:
            st = "present" if data.get("already_present") and ok_status == "staged" else ok_status
            return NodeRow(res.host, st, data=data, duration_s=res.duration_s)
        return NodeRow(res.host, "failed", data.get("error"), data.get("kind"), data, res.duration_s)
    if status in ("ok", "failed"):
        lines = [ln for ln in (res.stderr or "").strip().splitlines() if not ln.startswith(PROGRESS_MARK)]
        tail = lines[-1:] or ["no output"]
        return NodeRow(res.host, "failed", f"the node program exited {res.rc}: {tail[0]}", "node", {}, res.duration_s)
    return NodeRow(res.host, status, res.error or status, "fleet", {}, res.duration_s)


def _models_spec(models: Sequence[Model]) -> list[dict[str, str]]:
    return [{"name": m.name, "path": m.path} for m in models]


RELAY_NETWORKS = ("auto", "storage", "data", "management")


def relay_address(host: Host, network: str = "auto") -> str:
    """The address ``host``'s relay server listens on and its children connect to.

    ``storage`` / ``data``: the first NIC of that role with an ``address`` in
    the inventory; ``auto``: storage, then data, then the host's (management)
    ``address``; ``management``: always the host's ``address``.  Raises
    StageError when the asked role has no NIC with an address.
    """
    roles = {"auto": ("storage", "data"), "storage": ("storage",), "data": ("data",), "management": ()}
    if network not in roles:
        raise StageError(f"--relay-network {network!r}: expected one of {', '.join(RELAY_NETWORKS)}")
    for role in roles[network]:
        for nic in host.nics:
            if nic.role == role and nic.address:
                return nic.address
    if network in ("storage", "data"):
        raise StageError(
            f"--relay-network {network}: {host.name} has no {network} NIC with an address "
            f"in the inventory (nics: [{{netdev: ..., role: {network}, address: ...}}])"
        )
    return host.address


def stage_model(
    fleet: Any,
    hosts: Sequence[Host],
    model: Model,
    source: Source,
    man: mf.Manifest,
    *,
    relay: str = "chain",
    chains: int = 1,
    tree_fanout: int = 2,
    per_rack: bool = False,
    port: int = DEFAULT_PORT,
    workers: int = 8,
    keep: int = 2,
    warm: bool = False,
    switch: bool = True,
    timeout: float = 3600,
    warm_budget: int | None = None,
    stall_timeout: float = 15.0,
    address_of: Callable[[Host], str] | None = None,
    on_result: Callable[[Any], None] | None = None,
    on_progress: OnProgress | None = None,
    progress_interval: float = 0.5,
) -> StageReport:
    """Stage ``man`` (from ``source``) as ``model`` on ``hosts`` through ``fleet``.

    ``relay="chain"``: one source reader per chain, the others relay
    (``fleet`` must allow every host at once: its fanout is the hosts'
    count); ``relay="tree"``: the same with every node feeding up to
    ``tree_fanout`` children.  ``per_rack``: one chain or tree per ``rack``
    label (the source is read once per rack) instead of ``chains``.  ``relay="none"``: every host reads the source, at most the
    fleet's fanout at a time (the bound on concurrent source readers).
    ``timeout``: seconds per host.  ``on_progress(host, done, total)`` is
    called (from worker threads) every ``progress_interval`` seconds per host
    with the bytes verified so far.  ``warm_budget``: with ``warm``, read at
    most this many bytes of the version per host into the page cache (its
    first files, in manifest order).  Returns one row per host.
    """
    t0 = time.monotonic()
    if source.kind == "push" and man.total_bytes > MAX_PUSH_BYTES:
        raise StageError(
            f"{source.location}: {man.total_bytes} bytes is too large to push over SSH "
            f"(limit {MAX_PUSH_BYTES}); serve it over HTTP or a shared filesystem"
        )
    addr = address_of or (lambda h: h.address)
    pairs = [(h.name, addr(h)) for h in hosts]
    groups = rack_groups(pairs, [h.labels.get("rack", "") for h in hosts]) if per_rack else None
    plans = plan_chains(pairs, relay, chains, port, fanout=tree_fanout, groups=groups)
    job = {
        "op": "stage",
        "manifest": man.to_dict(),
        "model_path": model.path,
        "source": source.node_spec(),
        "workers": workers,
        "keep": keep,
        "warm": warm,
        "switch": switch,
        "install": ship.install_job(bundle.verify_model(), VERIFY_MODEL_PATH),
    }
    if warm and warm_budget is not None:
        job["warm_budget"] = warm_budget
    if on_progress is not None:
        job["progress"] = progress_interval
    stdin = json.dumps(job).encode() + b"\n"
    if source.kind == "push":
        stdin += push_frames(source, man)
    linger = stall_timeout + 5
    heads = [p.host for p in plans if not p.upstreams]
    first = 0 < len(heads) < len(plans)  # a relay: start the heads first (_heads_first)

    def args(p: NodePlan) -> dict[str, Any]:
        return dict(
            {"relay": p.relay_spec(stall_timeout, linger)}, **({"announce": True} if first and p.host in heads else {})
        )

    commands = {p.host: [json.dumps(args(p))] for p in plans}
    progress = ProgressLines(on_progress) if on_progress else None
    if first:
        res = _heads_first(fleet, commands, heads, stdin, timeout, on_result, progress)
    else:
        res = list(
            ship.run(
                fleet,
                bundle.program(),
                commands,
                stdin=stdin,
                sudo=True,
                timeout=timeout,
                on_result=on_result,
                on_stderr=progress,
            )
        )
    by_host = {r.host: r for r in res}
    rows = [_row(by_host[p.host], "staged") for p in plans]
    return StageReport(
        model.name, man.version, source.label, relay, man.total_bytes, rows, time.monotonic() - t0, plans
    )


#: Node-side line of a job with ``announce`` (``clusterctl_stage_node.main.STARTED_MARK``).
STARTED_MARK = b"clusterctl-started"
#: Seconds to wait for the heads to start before starting the other hosts anyway.
HEADS_START_WAIT_S = 10.0


def _heads_first(
    fleet: Any,
    commands: dict[str, list[str]],
    heads: list[str],
    stdin: bytes,
    timeout: float,
    on_result: Callable[[Any], None] | None,
    progress: ProgressLines | None,
) -> list[Any]:
    """Start the chains' heads, then the other hosts once every head's node program runs.

    The source is read only by the heads, so the transfer starts as soon as they
    run; the other hosts' SSH sessions and program starts (which on a small control
    machine take a while per host) overlap it, and each joins its parent when it is
    up (its parent serves it every chunk it has).  When a head has not started within
    :data:`HEADS_START_WAIT_S` (or ended), the others start anyway.
    """
    started: set[str] = set()
    ready = threading.Event()
    lock = threading.Lock()
    saw: dict[str, bytes] = {}

    def mark(host: str) -> None:
        with lock:
            started.add(host)
            if started >= set(heads):
                ready.set()

    def on_stderr(host: str, chunk: bytes) -> None:
        if host in heads and host not in started:
            with lock:
                seen = saw[host] = (saw.get(host, b"") + chunk)[-256:]
            if STARTED_MARK in seen:
                mark(host)
        if progress is not None:
            progress(host, chunk)

    def done(r: Any) -> None:
        mark(r.host)  # a head that ended (or failed to start) holds nobody back
        if on_result is not None:
            with lock:
                on_result(r)

    out: dict[str, Any] = {}

    def run_heads() -> None:
        try:
            out["heads"] = list(
                ship.run(
                    fleet,
                    bundle.program(),
                    {h: commands[h] for h in heads},
                    stdin=stdin,
                    sudo=True,
                    timeout=timeout,
                    on_result=done,
                    on_stderr=on_stderr,
                )
            )
        except BaseException as e:  # handed to the caller's thread below
            out["error"] = e
            ready.set()

    t = threading.Thread(target=run_heads, name="stage-heads", daemon=True)
    t.start()
    ready.wait(HEADS_START_WAIT_S)
    rest = {h: c for h, c in commands.items() if h not in heads}
    others = list(
        ship.run(
            fleet,
            bundle.program(),
            rest,
            stdin=stdin,
            sudo=True,
            timeout=timeout,
            on_result=done,
            on_stderr=on_stderr,
        )
    )
    t.join()
    if "error" in out:
        raise out["error"]
    return list(out["heads"]) + others


def pin_models(
    fleet: Any, models: Sequence[Model], budget: int | None, *, wait: float = 60, timeout: float = 600
) -> list[NodeRow]:
    """Keep up to ``budget`` bytes of each model resident on every host (``None``: unpin)."""
    job: dict[str, Any] = {"op": "unpin" if budget is None else "pin", "models": _models_spec(models), "wait": wait}
    if budget is not None:
        job.update(budget=budget, pin=ship.install_job(bundle.pin_model(), PIN_MODEL_PATH))
    res = ship.run(fleet, bundle.program(), stdin=json.dumps(job).encode() + b"\n", sudo=True, timeout=timeout)
    return [_row(r, "ok") for r in res]


def node_op(fleet: Any, op: str, models: Sequence[Model], *, workers: int = 8, timeout: float = 600) -> list[NodeRow]:
    """``status``, ``warm`` or ``evict`` of ``models`` on every host of ``fleet``."""
    job = {"op": op, "models": _models_spec(models), "workers": workers, "verify_model": VERIFY_MODEL_PATH}
    res = ship.run(fleet, bundle.program(), stdin=json.dumps(job).encode() + b"\n", sudo=True, timeout=timeout)
    return [_row(r, "ok") for r in res]
