"""The highest generation throughput seen per instance: the load score's capacity.

``throughput-peaks.json`` in the user's state directory holds
``{"version": 1, "peaks": {instance: tokens_per_s}}``.  Each ``status`` run
raises an instance's peak to what it measured over its window; nothing lowers
it (a redeploy with another model keeps its name, so ``forget`` drops an
entry).  Written to a temporary file and renamed; an unreadable file counts
as empty, because peaks only refine a score and can be learnt again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

from clusterctl.files import write_atomic

FILENAME = "throughput-peaks.json"


def load_peaks(state_dir: Path) -> dict[str, float]:
    """``{instance: peak tokens/s}``; empty when the file is missing or unreadable."""
    try:
        data = json.loads((Path(state_dir) / FILENAME).read_text())
        return {str(k): float(v) for k, v in data.get("peaks", {}).items() if float(v) > 0}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def update_peaks(state_dir: Path, observed: Mapping[str, float | None], forget: Iterable[str] = ()) -> dict[str, float]:
    """Raise each instance's stored peak to ``observed`` (tokens/s); return the peaks now stored.

    A write failure (read-only home) leaves the file as it was and still
    returns the merged peaks.
    """
    peaks = load_peaks(state_dir)
    for name in forget:
        peaks.pop(name, None)
    changed = False
    for name, tps in observed.items():
        if tps is not None and tps > peaks.get(name, 0.0):
            peaks[name] = round(tps, 3)
            changed = True
    if changed or forget:
        try:
            d = Path(state_dir)
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(d / FILENAME, json.dumps({"version": 1, "peaks": peaks}, indent=1, sort_keys=True), mode=0o600)
        except OSError:
            pass
    return peaks
