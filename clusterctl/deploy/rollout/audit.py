"""Audit records of every deploy and rollback: who, what, when, result.

One JSON object per line, appended (``O_APPEND``) to ``audit.jsonl`` in the
control state directory and, through the unlock job, to
``/var/lib/clusterctl/deploy/audit.jsonl`` on each host.  A record never
holds a secret: instances are named with their digest (sha256 of unit + env),
engine and model version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from clusterctl.deploy.spec import RenderedInstance
from clusterctl.deploy.state import utc_now

AUDIT_FILE = "audit.jsonl"


def instance_entry(r: RenderedInstance, action: str) -> dict[str, Any]:
    return {
        "instance": r.instance,
        "host": r.host,
        "action": action,
        "digest": r.digest,
        "engine": r.engine,
        "engine_version": r.engine_version,
        "model": r.model,
        "model_version": r.model_version,
    }


def record(
    kind: str,
    *,
    run_id: str,
    who: str,
    started: str,
    instances: Iterable[dict[str, Any]],
    result: str,
    detail: str | None = None,
    hosts: Iterable[str] = (),
) -> dict[str, Any]:
    """One audit record; ``kind`` is ``deploy`` or ``rollback``; ``result`` ``ok``, ``failed``,
    ``rolled_back``, ``interrupted`` or ``error``.  ``finished`` is now (UTC)."""
    return {
        "kind": kind,
        "run_id": run_id,
        "who": who,
        "started": started,
        "finished": utc_now(),
        "result": result,
        "detail": detail,
        "hosts": sorted(set(hosts)),
        "instances": list(instances),
    }


def append(state_dir: str | Path, rec: dict[str, Any]) -> Path:
    """Append ``rec`` to ``<state_dir>/audit.jsonl`` (one line, atomic for lines under PIPE_BUF
    and in practice for whole small writes on a local filesystem)."""
    d = Path(state_dir)
    d.mkdir(parents=True, exist_ok=True)
    return append_line(d / AUDIT_FILE, rec)


def append_line(path: Path, rec: dict[str, Any]) -> Path:
    """Append ``rec`` as one JSON line to ``path`` (``O_APPEND``, mode 0640 when created)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    try:
        os.write(fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)
    return path


def read(state_dir: str | Path) -> list[dict[str, Any]]:
    """Every record in ``<state_dir>/audit.jsonl`` (oldest first; an unreadable line is skipped)."""
    path = Path(state_dir) / AUDIT_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
