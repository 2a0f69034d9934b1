"""Load the check data (``checks/*.yaml``): XID catalogue and thresholds.

Where the files come from (:func:`check_sources`), per file name:

1. a **site directory**: ``$CLUSTERCTL_CHECKS_DIR`` when set, else
   ``/etc/clusterctl/checks`` when it exists.  A file there replaces the shipped
   file of the same name (a site may override only ``xid.yaml``); files it does not
   have come from the shipped copy;
2. the **shipped** files: ``checks/`` at the top of the source tree when running
   from it, else the copy a built package carries (``clusterctl/_checks``, put
   there by ``setup.py``).

:func:`load_thresholds` returns ``{"xid": ..., "gpu": ...}`` (one key per file
stem), the mapping analyzers find in ``AnalysisContext.thresholds``.  A malformed
file raises ``ConfigError`` with ``file:line``; so does a missing or empty
catalogue (:data:`REQUIRED`): a doctor without thresholds or an XID table would
report OK on data it never judged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from clusterctl.errors import ConfigError, Problem

ENV_DIR = "CLUSTERCTL_CHECKS_DIR"
#: The site directory used when ``$CLUSTERCTL_CHECKS_DIR`` is not set (if it exists).
SITE_DIR = Path("/etc/clusterctl/checks")
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]
#: The copy inside an installed package (``setup.py`` puts it there).
PACKAGED_DIR = _PACKAGE_ROOT / "_checks"
#: ``checks/`` of a source checkout (only when a ``pyproject.toml`` sits beside it).
SOURCE_DIR = _PACKAGE_ROOT.parent / "checks"
#: Files that must be present and non-empty, and the key each must have with entries.
REQUIRED = {"xid": "codes", "gpu": "gpu", "roce": "pfc"}


def shipped_dir() -> Path:
    """The check data shipped with this clusterctl (package copy, else the source tree)."""
    if PACKAGED_DIR.is_dir():
        return PACKAGED_DIR
    if SOURCE_DIR.is_dir() and (SOURCE_DIR.parent / "pyproject.toml").is_file():
        return SOURCE_DIR
    raise ConfigError(
        [
            Problem(
                str(PACKAGED_DIR),
                0,
                "the shipped check data is missing (neither the package's "
                f"_checks/ nor a source tree's checks/): reinstall clusterctl or set ${ENV_DIR}",
            )
        ]
    )


def site_dir() -> Path | None:
    """The site directory that overrides shipped files, ``None`` when there is none."""
    env = os.environ.get(ENV_DIR)
    if env:
        d = Path(env)
        if not d.is_dir():
            raise ConfigError([Problem(str(d), 0, f"${ENV_DIR} names a directory that does not exist")])
        return d
    return SITE_DIR if SITE_DIR.is_dir() else None


def checks_dir() -> Path:
    """The shipped check data directory (a site override: :func:`check_file`)."""
    return shipped_dir()


def check_file(name: str) -> Path:
    """The file ``name`` (relative, e.g. ``drift/basic.jsonl``) from the site directory
    when it has one, else the shipped one."""
    site = site_dir()
    if site is not None and (site / name).is_file():
        return site / name
    return shipped_dir() / name


def check_sources(directory: Path | None = None) -> list[Path]:
    """The ``*.yaml`` files in effect, one per stem: ``directory`` alone when given,
    else the shipped files overlaid by the site directory's."""
    if directory is not None:
        return sorted(directory.glob("*.yaml")) if directory.is_dir() else []
    files = {p.name: p for p in shipped_dir().glob("*.yaml")}
    site = site_dir()
    if site is not None:
        files.update({p.name: p for p in site.glob("*.yaml")})
    return [files[k] for k in sorted(files)]


def load_thresholds(directory: Path | None = None) -> dict[str, Any]:
    """Every check data file in effect (:func:`check_sources`), keyed by file stem.

    Raises ``ConfigError`` for a malformed file and for a missing or empty
    catalogue (:data:`REQUIRED`)."""
    out: dict[str, Any] = {}
    sources = check_sources(directory)
    for path in sources:
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = mark.line + 1 if mark is not None else 0
            raise ConfigError([Problem(str(path), line, f"not valid YAML: {getattr(e, 'problem', e)}")]) from None
        except OSError as e:
            raise ConfigError([Problem(str(path), 0, f"cannot read: {e.strerror}")]) from None
        if data is not None and not isinstance(data, dict):
            raise ConfigError([Problem(str(path), 1, "expected a mapping at the top level")])
        problems = _check(path, yaml.compose(path.read_text()))
        if problems:
            raise ConfigError(problems)
        out[path.stem] = data or {}
    where = {p.stem: p for p in sources}
    base = directory if directory is not None else (site_dir() or shipped_dir())
    problems = []
    for stem, key in REQUIRED.items():
        path = where.get(stem, base / f"{stem}.yaml")
        if stem not in out:
            problems.append(
                Problem(str(path), 0, f"missing: doctor needs {stem}.yaml (its thresholds would be silently absent)")
            )
        elif not out[stem].get(key):
            problems.append(
                Problem(str(path), 1, f"empty: {key!r} has no entries (doctor would judge nothing against it)")
            )
    if problems:
        raise ConfigError(problems)
    return out


SEVERITIES = ("OK", "WARN", "CRIT", "UNKNOWN")


def _check(path: Path, root: Any) -> list[Problem]:
    """Problems with their line: a severity that is not one of SEVERITIES, a
    threshold that is not a number (``*_c``, ``*_warn``, ``*_crit``, ``*_s``...)."""
    problems: list[Problem] = []

    def walk(node: Any, key: str = "") -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                walk(v, str(k.value))
        elif isinstance(node, yaml.SequenceNode):
            for v in node.value:
                walk(v, key)
        elif isinstance(node, yaml.ScalarNode):
            line = node.start_mark.line + 1
            if key == "severity" and node.value not in SEVERITIES:
                problems.append(
                    Problem(str(path), line, f"severity {node.value!r}: use one of {', '.join(SEVERITIES)}")
                )
            elif key.endswith(
                ("_c", "_warn", "_crit", "_s", "_mib", "_fraction", "_full", "_after")
            ) and not _is_number(node.value):
                problems.append(Problem(str(path), line, f"{key}: {node.value!r} is not a number"))

    if root is not None:
        walk(root)
    return problems


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def section(thresholds: Any, file: str, name: str) -> dict[str, Any]:
    """``thresholds[file][name]`` as a dict, ``{}`` when absent."""
    value = (thresholds or {}).get(file, {}) or {}
    value = value.get(name, {}) if name else value
    return value if isinstance(value, dict) else {}


def number(table: dict[str, Any], key: str, default: float) -> float:
    """A numeric threshold, ``default`` when missing or not a number."""
    v = table.get(key, default)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float(default)
