"""Snapshots for doctor: gathered live over the fleet, saved as a bundle, read back.

A :class:`Snapshot` is everything the analyzers read: facts per host, hosts
that gave none (``missing``), raw texts (kernel log, each instance's journal,
``/metrics`` samples) and the raw command records they came from.
:func:`gather` takes one over a Fleet, :func:`write_bundle` saves it as a
directory or ``.tar.gz`` (written under a temporary name, then renamed),
:func:`read_bundle` loads a bundle, including one assembled by hand from a
few files (layout in docs/bundles.md).  :func:`context` makes the
``AnalysisContext``.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import shlex
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from clusterctl import __version__
from clusterctl.diagnose import sources
from clusterctl.diagnose.registry import AnalysisContext
from clusterctl.errors import ConfigError, Problem
from clusterctl.inventory.model import Host, Inventory

FORMAT = 1
NODE_SCRIPT = Path(__file__).with_name("bundle_node.py")
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: API keys as vLLM 0.11 logs them ("non-default args: {... 'api_key': ['k'] ...}",
#: argparse Namespace(api_key='k')), on a command line, or in the environment.
_SECRETS = (re.compile(r"(['\"]api_key['\"]\s*:\s*)(\[[^\]]*\]|'[^']*'|\"[^\"]*\")"),
            re.compile(r"(\bapi_key=)(\[[^\]]*\]|'[^']*'|\"[^\"]*\"|[^,)\s]+)"),
            re.compile(r"(--api-key[= ]+)(\S+)"),
            re.compile(r"(\bVLLM_API_KEY=)(\S+)"))


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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def safe_name(text: str) -> str:
    """A file name for a host, instance or command (no slashes, no dot files)."""
    return _SAFE.sub("_", text).strip("._") or "_"


# ------------------------------------------------------------------- gather

def node_spec(inventory: Inventory | None, host: str, journal: bool, lines: int = 5000) -> dict[str, Any]:
    """The node script's argument for ``host``: its instances' units and ports."""
    insts = {}
    for inst in sources.instances(inventory):
        if inst.placement and inst.placement[0].host == host:
            bind = inst.args.get("host") if isinstance(inst.args.get("host"), str) else None
            insts[inst.name] = {"unit": sources.unit_name(inst.name), "port": inst.port,
                                "host": None if bind in (None, "0.0.0.0", "::") else bind}
    return {"instances": insts, "journal": journal, "lines": lines, "timeout_s": 5}


def node_stdin(probe_payload: bytes) -> bytes:
    """What ``python3 -`` reads on the node: the probe's payload as a constant, then the node script."""
    return b"PROBE_PAYLOAD = " + repr(probe_payload).encode("ascii") + b"\n" + NODE_SCRIPT.read_bytes()


def gather(fleet: Any, inventory: Inventory | None, hosts: list[Host], *, interval_s: float = 0.0,
           timeout: float = 60.0, sudo: bool = False, on_event: Callable[[str], None] | None = None,
           on_facts: Callable[[Any], None] | None = None, raw_outputs: bool = False) -> Snapshot:
    """One snapshot of ``hosts`` in one SSH round trip per host.

    On each host the node script (``bundle_node.py``) runs, at once: the probe
    (facts; it samples the NIC counters ``interval_s`` apart on the node) and,
    for every instance whose first GPU is there, a first ``/metrics`` sample
    and the unit's journal, then a second sample ``interval_s`` after the
    first (``interval_s`` 0: no second sample).  So a run takes about
    ``interval_s`` plus one round trip, the interval overlapping the probe's
    work.  ``raw_outputs``: the probe also returns every command it ran,
    verbatim; they go to ``commands`` (not to the facts document).
    ``snap.interval_s`` is the measured time between the ``/metrics``
    samples (the longest over the hosts; ``interval_s`` when no host runs an
    instance).  ``timeout``: seconds for one host's probe.  A host that fails
    is recorded, never raised: facts failures go to ``missing``,
    journal/metrics failures to the host's ``commands`` records.
    """
    from clusterctl.probe.payload import payload, probe_command
    from clusterctl.probe.run import interpret

    snap = Snapshot(interval_s=interval_s, meta={"started_at": _now(), "clusterctl_version": __version__,
                                                 "hosts": [h.name for h in hosts]})
    probe_argv = shlex.split(probe_command(nvml_budget=max(1.0, timeout * 0.6), raw_outputs=raw_outputs,
                                           counter_interval=interval_s or None))  # NIC counters for rate checks
    commands = {}
    for h in getattr(fleet, "hosts", hosts):
        spec = {**node_spec(inventory, h.name, True), "interval_s": interval_s,
                "probe": {"argv": probe_argv, "timeout_s": timeout}}
        commands[h.name] = "python3 -I -B - " + shlex.quote(json.dumps(spec))
    busy = sum(1 for h in hosts if node_spec(inventory, h.name, False)["instances"])
    if on_event and busy:
        on_event(f"probe on {len(hosts)} host(s); journals and /metrics of the instances on {busy}")
    intervals: list[float] = []

    def each(row: Any) -> None:
        doc = _node_document(row)
        probe_row = row
        if doc is not None:
            p = doc.get("probe") or {}
            rc = p.get("rc")
            probe_row = dataclasses.replace(row, rc=rc, stdout=p.get("stdout", ""), stderr=p.get("stderr", ""),
                                            status=type(row.status)("ok" if rc == 0 else "failed"))
            _absorb(snap, row.host, doc)
            if doc.get("metrics_interval_s") is not None:
                intervals.append(float(doc["metrics_interval_s"]))
        r = interpret(probe_row)
        if r.ok and r.facts is not None:
            snap.commands.setdefault(row.host, []).extend(r.facts.raw.pop("raw_outputs", None) or [])
            snap.facts[row.host] = r.facts.raw
            kl = r.facts.raw.get("kernel_log") or {}
            if kl.get("source"):
                snap.raw.setdefault(row.host, {})[sources.KERNEL_LOG] = "".join(
                    str(x.get("text", "")) + "\n" for x in kl.get("lines") or [])
        else:
            snap.missing[row.host] = r.reason or r.status
        if on_facts:
            on_facts(r)

    t0 = time.monotonic()
    wanted = {h.name for h in hosts}
    fleet.run({k: v for k, v in commands.items() if k in wanted}, stdin=node_stdin(payload().data), sudo=sudo,
              timeout=timeout + interval_s + 10, on_result=each, require_python=True)
    snap.meta["facts_at"] = snap.meta["finished_at"] = _now()
    snap.meta["phases_s"] = {"round_trip": round(time.monotonic() - t0, 3)}
    if intervals:
        snap.interval_s = max(intervals)
    return snap


def _node_document(row: Any) -> dict[str, Any] | None:
    """The node script's JSON document from a fleet row (its last stdout line), or None."""
    if str(getattr(row.status, "value", row.status)) != "ok":
        return None
    lines = [x for x in (row.stdout or "").splitlines() if x.strip()]
    try:
        doc = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) and "instances" in doc else None


def _absorb(snap: Snapshot, host: str, doc: dict[str, Any]) -> None:
    raw = snap.raw.setdefault(host, {})
    for name, rec in (doc.get("instances") or {}).items():
        j = rec.get("journal")
        if j is not None:
            j["stdout"] = text = redact(j.get("stdout", ""))
            snap.commands.setdefault(host, []).append(j)
            if j.get("rc") == 0 and text.strip() not in ("", "-- No entries --"):
                raw[f"{name}.log"] = text  # an instance never started has no log to analyse
        for key, suffix in (("metrics", ""), ("metrics_2", ".2")):
            m = rec.get(key)
            if m is None:
                continue
            snap.commands.setdefault(host, []).append(m)
            if "text" in m:
                raw[f"{name}.metrics{suffix}"] = m["text"]
    if not raw:
        del snap.raw[host]
    snap.meta.setdefault("instances_at", {})[host] = doc.get("collected_at")


def only_hosts(snap: Snapshot, names: set[str]) -> Snapshot:
    """The part of ``snap`` about ``names``."""
    return Snapshot(facts={h: v for h, v in snap.facts.items() if h in names},
                    missing={h: v for h, v in snap.missing.items() if h in names},
                    raw={h: v for h, v in snap.raw.items() if h in names},
                    commands={h: v for h, v in snap.commands.items() if h in names},
                    interval_s=snap.interval_s, meta=snap.meta)


def context(snap: Snapshot, inventory: Inventory | None, thresholds: dict[str, Any]) -> AnalysisContext:
    return AnalysisContext(inventory=inventory, facts=snap.facts, missing=snap.missing, raw=snap.raw,
                           interval_s=snap.interval_s, thresholds=thresholds)


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

def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError([Problem(str(path), e.lineno, f"not valid JSON: {e.msg}")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([Problem(str(path), 0, f"cannot read: {e}")]) from None


def _text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError as e:
        raise ConfigError([Problem(str(path), 0, f"cannot read: {e.strerror}")]) from None


def read_bundle(path: str | Path) -> tuple[Snapshot, Path | None]:
    """Load a bundle directory or ``.tar.gz``; returns the snapshot and its ``inventory.yaml`` (or None).

    Every file is optional except at least one host directory under ``hosts/``.
    A tarball is unpacked into a temporary directory, removed when the process
    exits (the returned inventory path points there until then).
    """
    p = Path(path)
    if not p.exists():
        raise ConfigError([Problem(str(p), 0, "no such bundle")])
    if p.is_file():
        try:
            tmp = Path(tempfile.mkdtemp(prefix="clusterctl-bundle-"))
            atexit.register(shutil.rmtree, tmp, True)
            with tarfile.open(p, "r:*") as tar:
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError) as e:
            raise ConfigError([Problem(str(p), 0, f"not a readable bundle archive: {e}")]) from None
        tops = [d for d in tmp.iterdir() if d.is_dir()]
        p = tops[0] if len(tops) == 1 and not (tmp / "hosts").is_dir() else tmp
    hosts_dir = p / "hosts"
    if not hosts_dir.is_dir():
        raise ConfigError([Problem(str(p), 0, "not a bundle: no hosts/ directory (see docs/bundles.md)")])
    snap = Snapshot()
    if (p / "bundle.json").is_file():
        meta = _load_json(p / "bundle.json")
        if not isinstance(meta, dict):
            raise ConfigError([Problem(str(p / "bundle.json"), 1, "expected a JSON object")])
        if int(meta.get("format", FORMAT)) > FORMAT:
            raise ConfigError([Problem(str(p / "bundle.json"), 1,
                                       f"bundle format {meta['format']} is newer than this clusterctl reads ({FORMAT})")])
        snap.meta = meta
        snap.interval_s = float(meta.get("interval_s") or 0.0)
        snap.missing = {str(k): str(v) for k, v in (meta.get("missing") or {}).items()}
    for d in sorted(x for x in hosts_dir.iterdir() if x.is_dir()):
        host = d.name
        if (d / "facts.json").is_file():
            doc = _load_json(d / "facts.json")
            if not isinstance(doc, dict) or "gpus" not in doc:
                raise ConfigError([Problem(str(d / "facts.json"), 1, "not a facts document (no \"gpus\")")])
            snap.facts[host] = doc
        raw: dict[str, str] = {}
        if (d / "kernel.log").is_file():
            raw[sources.KERNEL_LOG] = _text(d / "kernel.log")
        for f in sorted((d / "units").glob("*.log")) if (d / "units").is_dir() else []:
            raw[f.name] = _text(f)
        for f in sorted((d / "metrics").glob("*.prom")) if (d / "metrics").is_dir() else []:
            inst, _, n = f.name[: -len(".prom")].rpartition(".")
            if not inst:
                inst, n = n, "1"
            raw[f"{inst}.metrics" + ("" if n in ("", "1") else f".{n}")] = _text(f)
        if raw:
            snap.raw[host] = raw
    return snap, (p / "inventory.yaml") if (p / "inventory.yaml").is_file() else None
