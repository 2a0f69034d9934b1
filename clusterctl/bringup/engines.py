"""``clusterctl engine list``: which of the inventory's engines each host has, and who uses them.

Per host and engine (the inventory's ``engines.NAME.path``, the executable the
instance units run), one read (:func:`read_command`):

* ``installed`` (an executable file), ``not executable`` or ``missing``;
* the vLLM version the engine's virtualenv records (``vllm-VERSION.dist-info``
  under ``lib/python3*/site-packages`` beside ``bin/``), ``None`` when there
  is none to read (a build not installed by pip, or the lab's simulator): never
  guessed, and compared with the inventory's ``version`` only when read;
* the instance units whose ``ExecStart=`` runs it
  (``/etc/systemd/system/clusterctl-*.service``) and whether each is active.

Nothing here prints.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from clusterctl.errors import ClusterctlError
from clusterctl.fleet.factory import FleetFactory
from clusterctl.fleet.shell import quote
from clusterctl.inventory.model import Engine, Host, Inventory

UNITS_DIR = "/etc/systemd/system"


def venv_root(path: str) -> str:
    """``/opt/vllm-0.11/bin/vllm`` -> ``/opt/vllm-0.11``."""
    return posixpath.dirname(posixpath.dirname(path))


def read_command(engines: Sequence[Engine], units_dir: str = UNITS_DIR) -> str:
    """Shell printing, per engine path: ``engine PATH STATE``, ``dist PATH DIR`` lines and ``unit PATH UNIT ACTIVE``."""
    parts = []
    for e in engines:
        p, root = quote(e.path), quote(venv_root(e.path))
        parts.append(
            f"if [ -f {p} ] && [ -x {p} ]; then s=installed; elif [ -e {p} ] || [ -L {p} ]; then s=not-executable; "
            f"else s=missing; fi; echo \"engine {e.path} $s\"; "
            f"for d in {root}/lib/python3*/site-packages/vllm-*.dist-info; do [ -d \"$d\" ] && "
            f"echo \"dist {e.path} $(basename \"$d\")\"; done; "
            f"for u in {quote(units_dir)}/clusterctl-*.service; do [ -f \"$u\" ] || continue; "
            f"if grep -q \"^ExecStart=\"{p}\" \" \"$u\"; then n=$(basename \"$u\"); "
            f"echo \"unit {e.path} $n $(systemctl is-active \"$n\" 2>/dev/null || true)\"; fi; done"
        )
    return "; ".join(parts) if parts else "true"


_DIST = re.compile(r"^vllm-([0-9][A-Za-z0-9.+_-]*)\.dist-info$")


@dataclass
class EngineRow:
    host: str
    engine: str
    path: str
    wanted_version: str
    state: str  # installed, not-executable, missing, unread
    version: str | None = None
    units: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None

    @property
    def version_matches(self) -> bool | None:
        """Whether the recorded version is the inventory's (``None``: nothing recorded to compare)."""
        if self.version is None:
            return None
        return self.version == self.wanted_version or self.version.startswith(self.wanted_version + "+")

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "engine": self.engine,
            "path": self.path,
            "state": self.state,
            "version": self.version,
            "inventory_version": self.wanted_version,
            "version_matches": self.version_matches,
            "error": self.error,
            "units": [{"unit": u, "active": a} for u, a in self.units],
        }


def parse_read(host: str, engines: Sequence[Engine], text: str) -> list[EngineRow]:
    rows = {
        e.path: EngineRow(host, e.name, e.path, e.version, "unread", error="no answer for this path") for e in engines
    }
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        path, _, tail = rest.partition(" ")
        row = rows.get(path)
        if row is None:
            continue
        if kind == "engine" and tail in ("installed", "not-executable", "missing"):
            row.state, row.error = tail, None
        elif kind == "dist":
            m = _DIST.match(tail.strip())
            if m:
                row.version = m.group(1)
        elif kind == "unit":
            unit, _, active = tail.partition(" ")
            row.units.append((unit, active.strip() or "unknown"))
    return [rows[e.path] for e in engines]


def engines_for(inv: Inventory, names: Sequence[str] | None = None) -> list[Engine]:
    if not names:
        return list(inv.engines.values())
    unknown = [n for n in names if n not in inv.engines]
    if unknown:
        raise ClusterctlError(
            f"{inv.path}: no engine {', '.join(unknown)} in the inventory's engines "
            f"(it has {', '.join(inv.engines) or 'none'})"
        )
    return [inv.engines[n] for n in names]


def list_engines(
    inv: Inventory,
    hosts: Sequence[Host],
    make_fleet: FleetFactory,
    names: Sequence[str] | None = None,
    sudo: bool = True,
) -> list[EngineRow]:
    """One row per host and engine, in the inventory's order."""
    engines = engines_for(inv, names)
    out: dict[str, list[EngineRow]] = {}
    with make_fleet(list(hosts)) as fleet:
        for r in fleet.run(read_command(engines), sudo=sudo, timeout=30):
            if r.ok:
                out[r.host] = parse_read(r.host, engines, r.stdout)
            else:
                why = r.error or (r.stderr or "").strip()[-200:] or f"exit {r.rc}"
                out[r.host] = [EngineRow(r.host, e.name, e.path, e.version, "unread", error=why) for e in engines]
    return [
        row
        for h in hosts
        for row in out.get(
            h.name, [EngineRow(h.name, e.name, e.path, e.version, "unread", error="no result") for e in engines]
        )
    ]
