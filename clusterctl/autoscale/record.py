"""What the autoscaler keeps in the deploy state directory, under ``autoscale/``.

* ``state.json``: template -> :class:`~clusterctl.autoscale.decide.ScalerState` (hold timers,
  last action, failures, back-off), written with temp + rename under ``autoscale/.lock``.
* ``history.jsonl``: one line per decision (the audit): time, template, signal and its value,
  each replica's value (or why it is missing), the band, current and target counts, the rule,
  the reasons, the action and its outcome, seconds taken, the deploy run id.  Appended.
* ``.lock``: ``flock`` taken around one whole decision, so two autoscalers (a daemon and an
  operator's ``autoscale run``) never decide at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from clusterctl.autoscale.decide import ScalerState
from clusterctl.errors import ClusterctlError
from clusterctl.files import write_atomic
from clusterctl.deploy.rollout.audit import append_line

SUBDIR = "autoscale"
STATE_FILE = "state.json"
HISTORY_FILE = "history.jsonl"


class AutoscaleBusy(ClusterctlError):
    """Another autoscaler is deciding now (its flock is held)."""


def _dir(state_dir: str | Path) -> Path:
    d = Path(state_dir) / SUBDIR
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextmanager
def deciding(state_dir: str | Path, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the autoscaler's lock for one decision; :class:`AutoscaleBusy` after ``wait_s``."""
    fd = os.open(_dir(state_dir) / ".lock", os.O_RDWR | os.O_CREAT, 0o640)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise AutoscaleBusy(f"another autoscaler is deciding now ({Path(state_dir) / SUBDIR / '.lock'})")
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def load_states(state_dir: str | Path) -> dict[str, ScalerState]:
    path = Path(state_dir) / SUBDIR / STATE_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ClusterctlError(f"{path}: unreadable autoscaler state ({e}); move it away to start afresh")
    if not isinstance(doc, dict) or not isinstance(doc.get("templates"), dict):
        raise ClusterctlError(f"{path}: not an autoscaler state (expected {{\"templates\": {{...}}}})")
    return {k: ScalerState.from_json(v) for k, v in doc["templates"].items() if isinstance(v, dict)}


def save_states(state_dir: str | Path, states: dict[str, ScalerState]) -> None:
    write_atomic(
        _dir(state_dir) / STATE_FILE,
        json.dumps({"templates": {k: v.to_json() for k, v in sorted(states.items())}}, indent=1, sort_keys=True) + "\n",
        0o640,
    )


def append_history(state_dir: str | Path, rec: dict[str, Any]) -> Path:
    return append_line(_dir(state_dir) / HISTORY_FILE, rec)


def read_history(
    state_dir: str | Path, template: str | None = None, since: float | None = None
) -> list[dict[str, Any]]:
    """Decisions oldest first (an unreadable line is skipped)."""
    path = Path(state_dir) / SUBDIR / HISTORY_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        if template is not None and rec.get("template") != template:
            continue
        if since is not None and not (isinstance(rec.get("ts"), (int, float)) and rec["ts"] >= since):
            continue
        out.append(rec)
    return out
