"""Bench datasets: JSONL, one ``{"prompt": str, "output_len"?: int}`` object a line.

``max_tokens`` is accepted for ``output_len`` (so a drift prompt set is a
dataset too); without either a line takes ``--output-len``.  Every bad line is
reported as ``file:line`` at once (:class:`~clusterctl.errors.ConfigError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterctl.drift.prompts import jsonl_objects
from clusterctl.errors import ConfigError, Problem

#: Longest output a dataset line may ask for (vLLM's own limit is the model's context).
MAX_OUTPUT_LEN = 1 << 20


@dataclass(frozen=True)
class Dataset:
    """Prompts in file order and, per prompt, the output length asked (None = the run's default)."""

    prompts: list[str]
    output_lens: list[int | None]


def load(path: str | Path) -> Dataset:
    """Read a dataset; raises ConfigError listing every bad line (file:line) or an empty file."""
    objects, problems = jsonl_objects(path)
    prompts: list[str] = []
    lens: list[int | None] = []
    for n, d in objects:
        prompt = d.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            problems.append(Problem(str(path), n, "needs a non-empty string 'prompt'"))
            continue
        key = "output_len" if "output_len" in d else "max_tokens"
        n_out = d.get(key)
        if n_out is not None and (
            not isinstance(n_out, int) or isinstance(n_out, bool) or not 1 <= n_out <= MAX_OUTPUT_LEN
        ):
            problems.append(
                Problem(str(path), n, f"'{key}' must be a whole number from 1 to {MAX_OUTPUT_LEN}, not {n_out!r}")
            )
            continue
        prompts.append(prompt)
        lens.append(n_out)
    if not prompts and not problems:
        problems.append(Problem(str(path), 0, "no prompts"))
    if problems:
        raise ConfigError(sorted(problems, key=lambda q: q.line))
    return Dataset(prompts, lens)
