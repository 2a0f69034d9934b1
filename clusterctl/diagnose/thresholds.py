"""Load the check data (``checks/*.yaml``): XID catalogue and thresholds.

The files live in the ``checks/`` directory of the source tree; the
environment variable ``CLUSTERCTL_CHECKS_DIR`` names another directory (a
site's own copy).  :func:`load_thresholds` returns ``{"xid": ..., "gpu": ...}``
(one key per file stem), the mapping analyzers find in
``AnalysisContext.thresholds``.  A malformed file raises ``ConfigError`` with
``file:line``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from clusterctl.errors import ConfigError, Problem

ENV_DIR = "CLUSTERCTL_CHECKS_DIR"
_SOURCE_DIR = Path(__file__).resolve().parents[2] / "checks"


def checks_dir() -> Path:
    """The directory the check data is read from."""
    return Path(os.environ.get(ENV_DIR) or _SOURCE_DIR)


def load_thresholds(directory: Path | None = None) -> dict[str, Any]:
    """Every ``*.yaml`` of the checks directory, keyed by file stem ({} if it is absent)."""
    d = directory or checks_dir()
    out: dict[str, Any] = {}
    if not d.is_dir():
        return out
    for path in sorted(d.glob("*.yaml")):
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
                problems.append(Problem(str(path), line, f"severity {node.value!r}: use one of {', '.join(SEVERITIES)}"))
            elif key.endswith(("_c", "_warn", "_crit", "_s", "_mib", "_fraction", "_full", "_after")) and \
                    not _is_number(node.value):
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
