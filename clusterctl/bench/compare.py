"""Compare two bench reports of the same workload (old vs new, stable vs canary).

For each concurrency level and metric, the relative change ``(new - old) / old``;
a change is a regression when it is worse than ``tolerance`` (0.1 = 10 %):
latencies (mean and p99 TTFT, TPOT, E2E) higher, throughput lower.
"""

from __future__ import annotations

import math
from typing import Any

#: (report key, summary key or None, True when higher is worse)
METRICS = (
    ("ttft_ms", "mean", True),
    ("ttft_ms", "p99", True),
    ("tpot_ms", "mean", True),
    ("e2e_ms", "p99", True),
    ("output_throughput", None, False),
)


def compare(old: list[dict[str, Any]], new: list[dict[str, Any]], tolerance: float) -> list[dict[str, Any]]:
    """One row per level and metric: old, new, relative change and whether it regressed beyond ``tolerance``."""
    rows = []
    for a, b in zip(old, new):
        for key, sub, higher_worse in METRICS:
            va = a[key][sub] if sub else a[key]
            vb = b[key][sub] if sub else b[key]
            if not va or math.isnan(va) or math.isnan(vb):
                change = math.nan
            else:
                change = (vb - va) / va
            worse = change if higher_worse else -change
            rows.append(
                {
                    "concurrency": a["concurrency"],
                    "metric": f"{key}.{sub}" if sub else key,
                    "a": va,
                    "b": vb,
                    "change": change,
                    "regression": not math.isnan(change) and worse > tolerance,
                }
            )
    return rows
