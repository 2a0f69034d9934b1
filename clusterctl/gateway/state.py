"""The gateway's control-side state: ``gateway.json`` in the deploy state directory.

``{"version": 1, "marked_down": {NAME: {"reason", "by", "at"}}, "servers":
{NAME: {"down", "weight", "reason"}}, "last_reload": EPOCH_S, "digest": HEX, "config": HEX16}``

* ``marked_down``: instances an operator or a drain took out
  (:mod:`clusterctl.gateway.hook`); they stay down until marked up, whatever
  their health.
* ``servers``: the states the last sync decided (a mark-down re-renders from
  them without measuring again).
* ``last_reload`` / ``digest``: when the gateway last changed and to what;
  ``gateway sync`` reloads at most once per ``gateway.sync_interval_s``.

Writers hold an exclusive ``flock`` on ``gateway.lock`` for the whole
read-modify-write; the file is written to a temporary name and renamed.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.errors import ConfigError, Problem
from clusterctl.gateway.render import ServerState

FILE = "gateway.json"


@dataclass
class GatewayState:
    marked_down: dict[str, dict[str, str]] = field(default_factory=dict)
    servers: dict[str, ServerState] = field(default_factory=dict)
    last_reload: float = 0.0
    digest: str = ""
    config: str = ""  # what /gateway/health serves (the digest of the files nginx loads)


def load(state_dir: Path) -> GatewayState:
    """The stored state (empty when there is none); a corrupt file raises :class:`ConfigError`."""
    path = state_dir / FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return GatewayState()
    except (OSError, ValueError) as e:
        raise ConfigError(
            [Problem(str(path), getattr(e, "lineno", 0), f"cannot read the gateway state: {e}")]
        ) from None
    try:
        servers = {
            n: ServerState(bool(s["down"]), int(s["weight"]), str(s.get("reason", "")))
            for n, s in data.get("servers", {}).items()
        }
        return GatewayState(
            dict(data.get("marked_down", {})),
            servers,
            float(data.get("last_reload", 0.0)),
            str(data.get("digest", "")),
            str(data.get("config", "")),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ConfigError([Problem(str(path), 0, f"the gateway state is not in the expected form: {e}")]) from None


def _dump(st: GatewayState) -> str:
    body: dict[str, Any] = {
        "version": 1,
        "marked_down": st.marked_down,
        "servers": {n: {"down": s.down, "weight": s.weight, "reason": s.reason} for n, s in sorted(st.servers.items())},
        "last_reload": st.last_reload,
        "digest": st.digest,
        "config": st.config,
    }
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


@contextmanager
def locked(state_dir: Path) -> Iterator[GatewayState]:
    """Hold the lock, yield the state; what the caller leaves in it is written on exit."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "gateway.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        st = load(state_dir)
        yield st
        tmp = state_dir / f".{FILE}.{os.getpid()}.tmp"
        tmp.write_text(_dump(st))
        tmp.rename(state_dir / FILE)


def update(state_dir: Path, change: Callable[[GatewayState], None]) -> GatewayState:
    """Apply ``change`` under the lock and store the result."""
    with locked(state_dir) as st:
        change(st)
    return st


def marked_down(state_dir: Path) -> dict[str, str]:
    """Instance -> reason for every instance marked down at the gateway (``{}`` without a state file).

    What ``clusterctl status`` shows; a corrupt file raises :class:`ConfigError`.
    """
    return {name: m.get("reason", "") or "marked down" for name, m in load(state_dir).marked_down.items()}
