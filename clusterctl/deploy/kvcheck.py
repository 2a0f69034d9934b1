"""After start: the KV capacity vLLM logged against the pre-flight prediction.

vLLM logs ``GPU KV cache size: 311,040 tokens`` once it has sized the cache:
0.11 once per TP rank, 0.12+ (0.33) one line for the engine, followed on the
same line by ``, Maximum concurrency ...``.  The capacity the engine can use
is the smallest rank's, so that is the logged value compared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_KV_LINE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_ESTIMATE = re.compile(r"estimated maximum model length is (\d+)")
#: Lines that start a new vLLM process in a journal: only the last start counts.
_START = re.compile(r"vLLM API server version|non-default args:")


@dataclass(frozen=True)
class KvCheck:
    """``predicted`` and ``logged`` tokens; ``error_pct`` = (predicted - logged) / logged x 100
    (positive: the prediction was too high).  ``logged`` is ``None`` when the journal has no
    KV-size line yet (still loading, or start-up failed); ``per_rank`` lists every value logged."""

    predicted: int
    logged: int | None
    per_rank: tuple[int, ...] = field(default_factory=tuple)

    @property
    def error_pct(self) -> float | None:
        if not self.logged:
            return None
        return (self.predicted - self.logged) / self.logged * 100

    def to_json(self) -> dict[str, Any]:
        err = self.error_pct
        return {"predicted_tokens": self.predicted, "logged_tokens": self.logged,
                "per_rank": list(self.per_rank), "error_pct": None if err is None else round(err, 3)}


def logged_kv_tokens(journal_text: str) -> tuple[int, ...]:
    """Every "GPU KV cache size" value of the last start in ``journal_text``."""
    values: list[int] = []
    for line in journal_text.splitlines():
        if _START.search(line):
            values = []
        m = _KV_LINE.search(line)
        if m:
            values.append(int(m.group(1).replace(",", "")))
    return tuple(values)


def kv_prediction_error(predicted_tokens: int, journal_text: str) -> KvCheck:
    """Compare a predicted KV capacity (tokens) with what vLLM logged in ``journal_text``."""
    values = logged_kv_tokens(journal_text)
    return KvCheck(predicted=predicted_tokens, logged=min(values) if values else None, per_rank=values)


def logged_max_len_estimate(journal_text: str) -> int | None:
    """vLLM's "estimated maximum model length" from a KV-cache start-up failure, if any (last one)."""
    found = _ESTIMATE.findall(journal_text)
    return int(found[-1]) if found else None
