"""Kernel limits the lab raises while it runs, restored when the last lab stops.

Each container's systemd takes about 7 inotify instances, and the default
``fs.inotify.max_user_instances`` of 128 is shared by all root processes, so
at about 20 hosts units fail with "Too many open files" (lab.md P15).
Several labs may run at once: a small registry file records the original
value and which labs hold the raised one; the last ``release`` restores it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

INOTIFY = Path("/proc/sys/fs/inotify/max_user_instances")
REGISTRY = Path("/var/lib/clusterctl-lab-limits.json")
#: The value set while a lab runs (lab.md measured 800 instances at 100 hosts).
LAB_INOTIFY_INSTANCES = 8192


@contextlib.contextmanager
def _locked(registry: Path) -> Iterator[None]:
    """Hold an exclusive lock on the registry's directory (no lock file left)."""
    registry.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(registry.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _load(registry: Path) -> dict:
    try:
        return json.loads(registry.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _save(registry: Path, data: dict) -> None:
    tmp = registry.with_name(registry.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, registry)


def hold(lab: str, registry: Path = REGISTRY, knob: Path = INOTIFY) -> int:
    """Raise the inotify limit for lab ``lab``; return the original value."""
    with _locked(registry):
        data = _load(registry)
        if "original" not in data:
            data = {"original": int(knob.read_text()), "holders": []}
        if lab not in data["holders"]:
            data["holders"].append(lab)
        if int(knob.read_text()) < LAB_INOTIFY_INSTANCES:
            knob.write_text(f"{LAB_INOTIFY_INSTANCES}\n")
        _save(registry, data)
        return int(data["original"])


def release(lab: str, registry: Path = REGISTRY, knob: Path = INOTIFY) -> bool:
    """Drop ``lab``'s hold; restore the original limit when no lab holds it.

    Returns True when the original value was written back.
    """
    with _locked(registry):
        data = _load(registry)
        if not data:
            return False
        holders = [h for h in data.get("holders", []) if h != lab]
        if holders:
            data["holders"] = holders
            _save(registry, data)
            return False
        knob.write_text(f"{data['original']}\n")
        registry.unlink(missing_ok=True)
        return True
