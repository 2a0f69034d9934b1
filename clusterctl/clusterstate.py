"""State keyed per cluster: which part of the state directory a command reads and writes.

Everything clusterctl keeps between runs (deploy journal and placements,
cordons, gateway store, drain marks, doctor acks, report history, drift
baselines, ``@failed``...) lives under the user's state directory (config
``state_dir``, default ``$XDG_STATE_HOME/clusterctl``).  Two inventories must
never share it, so each cluster gets its own part::

    <state_dir>/clusters/<cluster>/        what every module calls "the state dir"
    <state_dir>/clusters/<cluster>/cluster.json   the hosts this state belongs to

The cluster is the inventory's ``cluster:`` name, else
:func:`default_cluster_name` (the inventory file's name and a hash of its
absolute path, so two inventory files never meet by chance).

:func:`bind` is called once per command, when the inventory is known:

- **Refusal.**  ``cluster.json`` records the hosts (name and address) that
  used this state last.  An inventory none of whose hosts is among them is
  another cluster under the same name: :class:`ClusterMismatch` (exit 3)
  instead of acting on its placements, drain marks and cordons.  A cluster
  that grows or shrinks keeps at least one host and goes on (the record
  follows the inventory).
- **Migration.**  State from before the keying (files directly in
  ``<state_dir>``) is adopted by the first cluster that binds: moved into
  its directory (rename, same file system), said once through ``on_event``
  and recorded in ``<state_dir>/clusters/ADOPTED.json``; nothing is lost and
  nothing is copied.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from clusterctl.errors import ClusterctlError
from clusterctl.files import write_atomic

CLUSTERS = "clusters"
RECORD = "cluster.json"
ADOPTED = "ADOPTED.json"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class ClusterMismatch(ClusterctlError):
    """The state found under a cluster's name belongs to other hosts."""


def default_cluster_name(inventory_path: str) -> str:
    """``<file stem>-<8 hex digits of the absolute path's SHA-256>``: stable for one file, distinct for two."""
    real = os.path.realpath(inventory_path)
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", Path(real).stem)[:40].strip(".-") or "inventory"
    return f"{stem}-{hashlib.sha256(real.encode()).hexdigest()[:8]}"


def cluster_name(inv: Any) -> str:
    """The inventory's ``cluster:`` name, else :func:`default_cluster_name` of its path."""
    return getattr(inv, "cluster", None) or default_cluster_name(inv.path)


def cluster_dir(root: Path, name: str) -> Path:
    return Path(root) / CLUSTERS / name


@dataclass
class Bound:
    """What :func:`bind` found: the cluster, its state directory, and what it adopted (if anything)."""

    cluster: str
    state_dir: Path
    adopted: list[str]


def _hosts(inv: Any) -> dict[str, str]:
    return {name: str(getattr(h, "address", "") or "") for name, h in inv.hosts.items()}


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _adopt(root: Path, target: Path, name: str) -> list[str]:
    """Move un-keyed state (every entry of ``root`` but ``clusters/``) into ``target``, once per ``root``."""
    clusters = root / CLUSTERS
    if clusters.exists() or not root.is_dir():
        return []
    entries = sorted(e for e in os.listdir(root) if e != CLUSTERS)
    target.mkdir(parents=True, exist_ok=True)
    moved = []
    for e in entries:
        if (target / e).exists():
            continue
        try:
            os.rename(root / e, target / e)
        except FileNotFoundError:  # another command adopting at the same moment took it
            continue
        moved.append(e)
    if moved:
        _write_json(
            clusters / ADOPTED,
            {
                "cluster": name,
                "entries": moved,
                "from": str(root),
                "at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            },
        )
    return moved


def bind(inv: Any, root: Path, on_event: Callable[[str], None] | None = None) -> Bound:
    """The state directory of ``inv``'s cluster under ``root`` (created), after the checks above.

    Raises :class:`ClusterMismatch` when the state there belongs to hosts none of which is in ``inv``."""
    root = Path(root)
    name = cluster_name(inv)
    if not NAME.match(name):  # the loader checks cluster:; a default name is built to match
        raise ClusterctlError(f"{inv.path}: cluster: {name!r} is not a valid cluster name")
    target = cluster_dir(root, name)
    adopted = _adopt(root, target, name)
    if adopted and on_event is not None:
        on_event(
            f"state: the un-keyed state of {root} ({', '.join(adopted)}) now belongs to cluster {name!r} "
            f"(moved to {target}); other clusters start with their own"
        )
    record = target / RECORD
    mine = _hosts(inv)
    try:
        doc = json.loads(record.read_text())
    except FileNotFoundError:
        doc = None
    except (OSError, ValueError) as e:
        raise ClusterctlError(f"{record}: cannot read the cluster record ({e}); fix or remove the file") from None
    if isinstance(doc, dict) and isinstance(doc.get("hosts"), dict) and doc["hosts"] and mine:
        theirs = {str(k): str(v) for k, v in doc["hosts"].items()}
        if not any(theirs.get(n) == a for n, a in mine.items()):
            shown = ", ".join(sorted(theirs)[:6]) + (", ..." if len(theirs) > 6 else "")
            raise ClusterMismatch(
                f"the state of cluster {name!r} ({target}) belongs to other hosts ({shown}, from "
                f"{doc.get('inventory') or 'another inventory'}); none of {inv.path}'s hosts is among them. "
                f"Refusing to act on another cluster's state: give this inventory its own 'cluster:' name, "
                f"or, if it is the same cluster with new hosts, remove {record}"
            )
    if doc != {"cluster": name, "inventory": os.path.realpath(inv.path), "hosts": mine}:
        target.mkdir(parents=True, exist_ok=True)
        _write_json(record, {"cluster": name, "inventory": os.path.realpath(inv.path), "hosts": mine})
    return Bound(name, target, adopted)
