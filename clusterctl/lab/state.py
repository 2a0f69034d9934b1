"""The lab's record of itself: ``LAB_DIR/state.json``.

It records what ``lab down`` and ``lab up`` after a crash need to undo:
the hosts (name, address, MAC), each host's supervisor PID, the ticker's
PID, and the inotify limit to restore.  Written atomically (temp + rename).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.errors import LabError
from clusterctl.lab.config import HostSpec

STATE_VERSION = 1


@dataclass
class HostState:
    spec: HostSpec
    pid: int | None = None  # the hostrun supervisor


@dataclass
class LabState:
    hosts: list[HostState] = field(default_factory=list)
    gpus_per_host: int = 0
    gpu_model: str = ""
    ticker_pid: int | None = None
    inotify_saved: int | None = None
    template: str = ""
    started_at: float = 0.0
    ready_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["version"] = STATE_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "LabState":
        hosts = [HostState(HostSpec(**h["spec"]), h.get("pid")) for h in d.get("hosts", [])]
        rest = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "hosts"}
        return cls(hosts=hosts, **rest)


def load(path: Path) -> LabState | None:
    """The recorded state, or ``None`` when no lab was brought up here."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return LabState.from_json(json.loads(text))
    except (ValueError, TypeError, KeyError) as e:
        raise LabError(f"{path}:1: unreadable lab state ({e}); remove it after checking that no lab host runs") from e


def save(path: Path, st: LabState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(st.to_json(), indent=1) + "\n")
    os.replace(tmp, path)
