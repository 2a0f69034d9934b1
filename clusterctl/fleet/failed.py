"""Remember the hosts that failed in the last run, for the ``@failed`` pattern.

The list is a JSON file ``last-failed.json`` in the state directory
(``UserConfig.state_dir``), written to a temporary file and renamed, so a
reader never sees half a file.  Each entry records which inventory it came
from, so ``@failed`` never names hosts of a different inventory.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterable

from clusterctl.files import write_atomic

FILENAME = "last-failed.json"


def save_failed(
    state_dir: Path, hosts: Iterable[str], *, inventory: str | None = None, command: str | None = None
) -> Path:
    """Replace the stored failed hosts with ``hosts`` (an empty list clears it)."""
    state_dir = Path(state_dir)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = {
        "time": time.time(),
        "inventory": os.path.abspath(inventory) if inventory else None,
        "command": command,
        "hosts": list(hosts),
    }
    path = state_dir / FILENAME
    write_atomic(path, json.dumps(data, indent=1) + "\n", mode=0o600)
    return path


def load_failed(state_dir: Path, *, inventory: str | None = None) -> list[str] | None:
    """The hosts that failed last time; ``None`` when no run was recorded.

    ``None`` also when the file is unreadable, or when ``inventory`` is given
    and the record was made with another inventory (those names mean nothing
    here).  ``select_hosts(..., failed=None)`` then reports that ``@failed``
    has nothing to refer to.
    """
    path = Path(state_dir) / FILENAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), list):
        return None
    if inventory and data.get("inventory") and data["inventory"] != os.path.abspath(inventory):
        return None
    return [str(h) for h in data["hosts"]]
