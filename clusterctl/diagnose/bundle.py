"""Snapshots for doctor: saved as a bundle, read back (no network I/O here).

A :class:`Snapshot` is everything the analyzers read: facts per host, hosts
that gave none (``missing``), raw texts (kernel log, each instance's journal,
``/metrics`` samples) and the raw command records they came from.
:func:`clusterctl.probe.snapshot.gather` takes one over a Fleet, :func:`write_bundle` saves it as a
directory or ``.tar.gz`` (written under a temporary name, then renamed),
:func:`read_bundle` loads a bundle, including one assembled by hand from a
few files (layout in docs/bundles.md).  :func:`context` makes the
``AnalysisContext``.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.diagnose import evidence, inputs, sources
from clusterctl.diagnose.registry import AnalysisContext
from clusterctl.errors import ConfigError, Problem
from clusterctl.inventory.model import Inventory

FORMAT = 1
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: API keys as vLLM 0.11 logs them ("non-default args: {... 'api_key': ['k'] ...}",
#: argparse Namespace(api_key='k')), on a command line, or in the environment.
_SECRETS = (
    re.compile(r"(['\"]api_key['\"]\s*:\s*)(\[[^\]]*\]|'[^']*'|\"[^\"]*\")"),
    re.compile(r"(\bapi_key=)(\[[^\]]*\]|'[^']*'|\"[^\"]*\"|[^,)\s]+)"),
    re.compile(r"(--api-key[= ]+)(\S+)"),
    re.compile(r"(\bVLLM_API_KEY=)(\S+)"),
)


def redact(text: str) -> str:
    """``text`` with API keys replaced by ``***`` (vLLM 0.11 logs its arguments in clear)."""
    for rx in _SECRETS:
        text = rx.sub(lambda m: m.group(1) + "'***'", text)
    return text


@dataclass
class Snapshot:
    """What one doctor run looked at.

    ``raw``: host -> {name: text} with the names of ``sources`` (``kernel.log``,
    ``<instance>.log``, ``<instance>.metrics``, ``<instance>.metrics.2``);
    ``commands``: host -> [{argv or url, rc, stdout, stderr, started_at}]
    (verbatim records of what ran on the node); ``meta``: timestamps etc.
    """

    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    raw: dict[str, dict[str, str]] = field(default_factory=dict)
    commands: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    interval_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    #: host -> one record per input file: path, kind (None: ignored), note (``doctor --explain-input``).
    inputs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def safe_name(text: str) -> str:
    """A file name for a host, instance or command (no slashes, no dot files)."""
    return _SAFE.sub("_", text).strip("._") or "_"


def only_hosts(snap: Snapshot, names: set[str]) -> Snapshot:
    """The part of ``snap`` about ``names``."""
    return Snapshot(
        facts={h: v for h, v in snap.facts.items() if h in names},
        missing={h: v for h, v in snap.missing.items() if h in names},
        raw={h: v for h, v in snap.raw.items() if h in names},
        commands={h: v for h, v in snap.commands.items() if h in names},
        interval_s=snap.interval_s,
        meta=snap.meta,
        inputs={h: v for h, v in snap.inputs.items() if h in names},
    )


def context(snap: Snapshot, inventory: Inventory | None, thresholds: dict[str, Any]) -> AnalysisContext:
    return AnalysisContext(
        inventory=inventory,
        facts=snap.facts,
        missing=snap.missing,
        raw=snap.raw,
        interval_s=snap.interval_s,
        thresholds=thresholds,
    )


# -------------------------------------------------------------------- write


def _command_file(rec: dict[str, Any], seen: dict[str, int]) -> str:
    base = " ".join(rec["argv"]) if rec.get("argv") else rec.get("url", "command")
    name = safe_name(base)[:120]
    seen[name] = seen.get(name, 0) + 1
    return name + (f".{seen[name]}" if seen[name] > 1 else "") + ".txt"


def _write_tree(snap: Snapshot, root: Path, inventory_text: str | None) -> None:
    (root / "hosts").mkdir(parents=True)
    meta = {"format": FORMAT, **snap.meta, "interval_s": snap.interval_s, "missing": snap.missing}
    (root / "bundle.json").write_text(json.dumps(meta, indent=2) + "\n")
    if inventory_text is not None:
        (root / "inventory.yaml").write_text(inventory_text)
    for host in sorted(set(snap.facts) | set(snap.raw) | set(snap.commands) | set(snap.missing)):
        d = root / "hosts" / safe_name(host)
        d.mkdir()
        if host in snap.facts:
            (d / "facts.json").write_text(json.dumps(snap.facts[host], indent=1) + "\n")
        for name, text in (snap.raw.get(host) or {}).items():
            if name == sources.KERNEL_LOG:
                (d / "kernel.log").write_text(text)
            elif name.endswith(".log"):
                (d / "units").mkdir(exist_ok=True)
                (d / "units" / safe_name(name)).write_text(text)
            elif ".metrics" in name:
                inst, _, n = name.partition(".metrics")
                (d / "metrics").mkdir(exist_ok=True)
                (d / "metrics" / f"{safe_name(inst)}.{n.lstrip('.') or '1'}.prom").write_text(text)
        seen: dict[str, int] = {}
        index = []
        for rec in snap.commands.get(host) or []:
            (d / "commands").mkdir(exist_ok=True)
            fname = _command_file(rec, seen)
            (d / "commands" / fname).write_text(rec.get("stdout", rec.get("text", "")) or "")
            index.append({"file": fname, **{k: v for k, v in rec.items() if k not in ("stdout", "text")}})
        if index:
            (d / "commands" / "index.json").write_text(json.dumps(index, indent=1) + "\n")


def _owner_only(top: Path) -> None:
    """Folders 0700 and files 0600 under ``top``: logs and command output may hold secrets."""
    top.chmod(0o700)
    for dirpath, dirnames, filenames in os.walk(top):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o700)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o600)


def write_bundle(snap: Snapshot, dest: str | Path, inventory_text: str | None = None) -> Path:
    """Save ``snap`` at ``dest`` (a directory, or a file ending in ``.tar.gz``/``.tgz``).

    Nothing half-written is left at ``dest``: the bundle is built under a
    temporary name beside it and renamed.  An existing ``dest`` is refused.
    Readable by its owner only: files 0600, folders 0700, the archive 0600.
    """
    dest = Path(dest)
    if dest.exists():
        raise ConfigError([Problem(str(dest), 0, "already exists; give a new name")])
    parent = dest.parent if str(dest.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    is_tar = dest.name.endswith((".tar.gz", ".tgz"))
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=parent))
    try:
        top = tmp / dest.name.removesuffix(".tar.gz").removesuffix(".tgz")
        _write_tree(snap, top, inventory_text)
        _owner_only(top)
        if is_tar:
            part = tmp / "bundle.tar.gz"
            part.touch(mode=0o600)
            with tarfile.open(part, "w:gz") as tar:
                tar.add(top, arcname=top.name)
            os.replace(part, dest)
        else:
            os.replace(top, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


# --------------------------------------------------------------------- read


def _bad(path: Path | str, message: str, line: int = 1) -> ConfigError:
    return ConfigError([Problem(str(path), line, message)])


def _meta(path: Path, doc: Any) -> dict[str, Any]:
    """``bundle.json`` checked key by key: a wrong type is a clear error, never a traceback."""
    if not isinstance(doc, dict):
        raise _bad(path, "expected a JSON object")
    fmt = doc.get("format", FORMAT)
    if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt < 1:
        raise _bad(path, f"\"format\" must be a whole number (1), not {json.dumps(fmt)[:40]}")
    if fmt > FORMAT:
        raise _bad(path, f"bundle format {fmt} is newer than this clusterctl reads ({FORMAT})")
    iv = doc.get("interval_s", 0.0)
    if iv is None:
        iv = 0.0
    if isinstance(iv, bool) or not isinstance(iv, (int, float)) or not math.isfinite(iv) or iv < 0:
        raise _bad(path, f"\"interval_s\" must be a number of seconds >= 0, not {json.dumps(iv)[:40]}")
    missing = doc.get("missing") or {}
    if not isinstance(missing, dict) or not all(isinstance(v, str) for v in missing.values()):
        raise _bad(path, "\"missing\" must be an object of host -> reason (strings)")
    hosts = doc.get("hosts") or []
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise _bad(path, "\"hosts\" must be a list of host names (strings)")
    return {**doc, "format": fmt, "interval_s": float(iv), "missing": missing, "hosts": hosts}


#: The shape of a facts document (docs/facts.md): ``{}`` an object, ``[x]`` a list of x, a type a
#: scalar.  Only the containers and the few scalars the analyzers compute with are checked; ``null``
#: is allowed everywhere ("could not be read").
_FACTS_SHAPE: dict[str, Any] = {
    "gpus": {
        "devices": [
            {
                "index": int,
                "ecc": {"volatile": {}, "aggregate": {}},
                "remapped_rows": {},
                "retired_pages": {},
                "clocks_event_reasons": {"active": [str]},
                "pcie": {},
                "utilization": {},
                "field_errors": {},
                "nvlink": [{"errors": {}}],
                "processes": [{}],
                "nearest_nics": {},
            }
        ],
        "topology": [{}],
        "timed_out_calls": [str],
    },
    "nics": [
        {
            "netdev": str,
            "rdma": {"counters": {}, "hw_counters": {}, "gids": [{}]},
            "qos": {"raw": {}, "reasons": {}, "ecn": {}, "pfc_enabled": [int], "dscp2prio": {}},
            "ethtool_stats": {},
            "samples": [{"ethtool_stats": {}, "hw_counters": {}, "counters": {}}],
        }
    ],
    "units": [{"environment": {}}],
    "kernel_log": {"lines": [{}]},
    "host": {"disks": [{}], "memory": {}, "cpu": {}, "kernel": {}, "os_release": {}},
    "rdma_prereqs": {},
    "tools": {},
    "errors": [{}],
    "dcgm_diag": {"results": [{}]},
}


def _shape_error(value: Any, shape: Any, where: str) -> str | None:
    """Where ``value`` does not have ``shape`` (see :data:`_FACTS_SHAPE`), or None."""
    if value is None:
        return None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where} must be a JSON object"
        for key, sub in shape.items():
            bad = _shape_error(value.get(key), sub, f"{where}.{key}" if where else key)
            if bad:
                return bad
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} must be a JSON list"
        for i, item in enumerate(value[:100_000]):
            bad = _shape_error(item, shape[0], f"{where}[{i}]")
            if bad:
                return bad
        return None
    if shape is int and (isinstance(value, bool) or not isinstance(value, int)):
        return f"{where} must be a whole number"
    if shape is str and not isinstance(value, str):
        return f"{where} must be a string"
    return None


def _facts(path: str, data: bytes) -> dict[str, Any]:
    doc = inputs.load_json(path, data)
    if not isinstance(doc, dict) or "gpus" not in doc:
        raise _bad(path, "not a facts document (no \"gpus\")")
    bad = _shape_error(doc, _FACTS_SHAPE, "")
    if bad:
        raise _bad(path, f"not a facts document: {bad}")
    return doc


def _json_index(path: str, data: bytes | None) -> dict[str, dict[str, Any]]:
    """``commands/index.json`` as file name -> record (a malformed index is ignored, not fatal)."""
    try:
        doc = inputs.load_json(path, data) if data else []
    except ConfigError:
        return {}
    return (
        {str(r["file"]): r for r in doc if isinstance(r, dict) and isinstance(r.get("file"), str)}
        if isinstance(doc, list)
        else {}
    )


def _read_host(snap: Snapshot, host: str, d: Path, budget: inputs.Budget) -> None:
    """One host directory: facts.json, the fixed layout, then every other file by its content."""
    files: dict[str, bytes] = {}
    for rel, path in inputs.walk(d, budget, max_depth=4):
        data = inputs.read_regular(path, budget)
        if data is not None:
            files[rel] = data
    raw: dict[str, str] = {}
    layout: list[str] = []
    if "facts.json" in files:
        snap.facts[host] = _facts(str(d / "facts.json"), files.pop("facts.json"))
    if "kernel.log" in files:
        raw[sources.KERNEL_LOG] = inputs.bounded_text(files.pop("kernel.log"))
    for rel in sorted(files):
        top, _, name = rel.partition("/")
        if top == "units" and name.endswith(".log") and "/" not in name:
            raw[name] = inputs.bounded_text(files.pop(rel))
            layout.append(rel)
        elif top == "metrics" and name.endswith(".prom") and "/" not in name:
            inst, _, n = name[: -len(".prom")].rpartition(".")
            if not inst:
                inst, n = n, "1"
            raw[f"{inst}.metrics" + ("" if n in ("", "1") else f".{n}")] = inputs.bounded_text(files.pop(rel))
            layout.append(rel)
    index = _json_index(str(d / "commands" / "index.json"), files.pop("commands/index.json", None))
    seen: list[dict[str, Any]] = [
        {"path": x, "kind": "bundle layout", "note": ""}
        for x in (["facts.json"] if host in snap.facts else [])
        + sorted(k for k in ("kernel.log",) if sources.KERNEL_LOG in raw)
        + layout
    ]
    if host in snap.facts:
        seen += [
            {"path": rel, "kind": None, "note": "a record of what the probe ran; its facts are in facts.json"}
            for rel in sorted(files)
        ]
    elif files:
        ev = evidence.host_evidence(sorted(files.items()), index)
        seen += [s.to_json() for s in ev.seen]
        if ev.facts is not None:
            snap.facts[host] = ev.facts
        for k, v in ev.raw.items():
            raw.setdefault(k, v)
    if raw:
        snap.raw[host] = raw
    snap.inputs[host] = seen
    if host not in snap.facts and host not in snap.raw and host not in snap.missing:
        snap.missing[host] = f"no usable data in {d}: " + (
            "; ".join(f"{s['path']}: {s['note']}" for s in seen)[:300] if seen else "the directory is empty"
        )


def read_bundle(path: str | Path, host: str | None = None) -> tuple[Snapshot, Path | None]:
    """Load what ``doctor --from`` was given; returns the snapshot and an ``inventory.yaml`` (or None).

    ``path``: a bundle (a directory with ``hosts/``, or a ``.tar.gz`` of one),
    a directory of one host's raw outputs, or one file (plain or gzip, an
    ``nvidia-bug-report.log.gz`` too); ``host`` names the host of loose input
    (default: the directory's name, ``local`` for a file).  Every read is
    bounded (:mod:`clusterctl.diagnose.inputs`); a damaged or truncated archive,
    a wrong type in ``bundle.json`` or a bundle without any host is a
    :class:`ConfigError`.  An archive is unpacked (bounded) into a temporary
    directory, removed when the process exits.
    """
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise ConfigError([Problem(str(p), 0, "no such bundle, directory or file")])
    budget = inputs.Budget()
    if not p.is_dir() and inputs.is_archive(p):
        tmp = Path(tempfile.mkdtemp(prefix="clusterctl-bundle-"))
        atexit.register(shutil.rmtree, tmp, True)
        inputs.read_archive(p, tmp, budget)
        tops = [d for d in tmp.iterdir() if d.is_dir()]
        root = (
            tops[0]
            if len(tops) == 1 and not (tmp / "hosts").is_dir() and not any(x.is_file() for x in tmp.iterdir())
            else tmp
        )
        skipped, truncated = budget.skipped, budget.truncated
        budget = inputs.Budget(skipped=list(skipped), truncated=dict(truncated))
        snap, inv = _read_root(root, budget, host or re.sub(r"\.(tar\.gz|tgz|tar)$", "", p.name))
    elif p.is_dir():
        snap, inv = _read_root(p, budget, host or p.resolve().name)
    else:
        snap, inv = Snapshot(), None
        data = inputs.read_regular(p, budget)
        if data is not None and data[:2] == b"\x1f\x8b":
            tmp_budget = inputs.Budget()
            data = inputs.gunzip(p, tmp_budget)
            budget.truncated.update(tmp_budget.truncated)
        name = host or "local"
        if data is not None:
            ev = evidence.host_evidence([(p.name, data)])
            snap.inputs[name] = [s.to_json() for s in ev.seen]
            if ev.facts is not None:
                snap.facts[name] = ev.facts
            if ev.raw:
                snap.raw[name] = ev.raw
            if name not in snap.facts and name not in snap.raw:
                snap.missing[name] = f"no usable data in {p}: " + "; ".join(s.note for s in ev.seen)[:300]
    snap.meta.setdefault("input", {})
    snap.meta["input"] = {
        "skipped": [{"path": s.path, "reason": s.reason} for s in budget.skipped],
        "truncated": {k: v for k, v in budget.truncated.items()},
    }
    if not (snap.facts or snap.raw or snap.missing):
        raise ConfigError(
            [
                Problem(
                    str(p),
                    0,
                    "no host data: nothing doctor can read was found (see docs/bundles.md for what it accepts)",
                )
            ]
        )
    return snap, inv


def _read_root(p: Path, budget: inputs.Budget, loose_host: str) -> tuple[Snapshot, Path | None]:
    hosts_dir = p / "hosts"
    snap = Snapshot()
    if not hosts_dir.is_dir() or hosts_dir.is_symlink():
        _read_host(snap, loose_host, p, budget)
        return snap, None
    if (p / "bundle.json").exists():
        data = inputs.read_regular(p / "bundle.json", budget)
        if data is None:
            raise _bad(p / "bundle.json", "not a regular file", 0)
        meta = _meta(p / "bundle.json", inputs.load_json(str(p / "bundle.json"), data))
        snap.meta = meta
        snap.interval_s = meta["interval_s"]
        snap.missing = {str(k): v for k, v in meta["missing"].items()}
    try:
        entries = sorted(os.scandir(hosts_dir), key=lambda e: e.name)
    except OSError as e:
        raise _bad(hosts_dir, f"cannot read: {e.strerror}", 0) from None
    for ent in entries:
        if ent.is_dir(follow_symlinks=False):
            if ent.name not in snap.missing:
                _read_host(snap, ent.name, Path(ent.path), budget)
        else:
            budget.skipped.append(inputs.Skipped(ent.path, "not read: only host directories belong in hosts/"))
    for h in snap.meta.get("hosts") or []:
        if h not in snap.facts and h not in snap.raw and h not in snap.missing:
            snap.missing[h] = "listed in bundle.json, but the bundle has no data for it (no hosts/%s)" % safe_name(h)
    inv = p / "inventory.yaml"
    if not inv.is_file() or inv.is_symlink():
        return snap, None
    if inv.stat().st_size > inputs.MAX_FILE_BYTES:
        budget.skipped.append(inputs.Skipped(str(inv), f"not read: larger than {inputs.mib(inputs.MAX_FILE_BYTES)}"))
        return snap, None
    return snap, inv
