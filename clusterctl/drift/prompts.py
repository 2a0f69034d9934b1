"""Prompt sets: JSONL, one ``{"id", "prompt", "max_tokens"?, "category"?}`` object a line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from clusterctl.errors import ConfigError, Problem


@dataclass(frozen=True)
class Prompt:
    id: str
    prompt: str
    max_tokens: int = 16
    category: str = ""


def load(path: str | Path) -> list[Prompt]:
    """Read a prompt set; every bad line is reported as ``file:line`` (blank and ``#`` lines are skipped)."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError([Problem(str(path), 0, f"cannot read: {e.strerror or e}")]) from None
    out: list[Prompt] = []
    problems: list[Problem] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(Problem(str(path), n, f"not JSON: {e.msg}"))
            continue
        if not isinstance(d, dict) or not isinstance(d.get("prompt"), str) or not d["prompt"]:
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
