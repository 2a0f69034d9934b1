"""Prompt sets: JSONL, one ``{"id", "prompt", "max_tokens"?, "category"?}`` object a line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.errors import ConfigError, Problem


@dataclass(frozen=True)
class Prompt:
    id: str
    prompt: str
    max_tokens: int = 16
    category: str = ""


def jsonl_objects(path: str | Path) -> tuple[list[tuple[int, dict[str, Any]]], list[Problem]]:
    """Every JSON object of a JSONL file with its line number, and a ``file:line`` problem for each line that
    is not one (blank and ``#`` lines are skipped); an unreadable file is one problem at line 0."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        return [], [Problem(str(path), 0, f"cannot read: {getattr(e, 'strerror', None) or e}")]
    out: list[tuple[int, dict[str, Any]]] = []
    problems: list[Problem] = []
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(Problem(str(path), n, f"not JSON: {e.msg}"))
            continue
        if not isinstance(d, dict):
            problems.append(Problem(str(path), n, "expected a JSON object"))
            continue
        out.append((n, d))
    return out, problems


def load(path: str | Path) -> list[Prompt]:
    """Read a prompt set; every bad line is reported as ``file:line`` (blank and ``#`` lines are skipped)."""
    objects, problems = jsonl_objects(path)
    out: list[Prompt] = []
    seen: set[str] = set()
    for n, d in objects:
        if not isinstance(d.get("prompt"), str) or not d["prompt"]:
            problems.append(Problem(str(path), n, "needs a non-empty string 'prompt'"))
            continue
        pid = str(d.get("id", n))
        mt = d.get("max_tokens", 16)
        if not isinstance(mt, int) or isinstance(mt, bool) or not 1 <= mt <= 4096:
            problems.append(Problem(str(path), n, f"'max_tokens' must be an integer in 1..4096, not {mt!r}"))
            continue
        if pid in seen:
            problems.append(Problem(str(path), n, f"duplicate id {pid!r}"))
            continue
        seen.add(pid)
        out.append(Prompt(pid, d["prompt"], mt, str(d.get("category", ""))))
    if not out and not problems:
        problems.append(Problem(str(path), 0, "no prompts"))
    if problems:
        raise ConfigError(problems)
    return out
