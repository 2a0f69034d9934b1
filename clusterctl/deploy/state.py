"""The control-side deploy state: placements, cordons and replica overrides.

Where it lives (first that is set wins):

1. ``--state-dir DIR`` on the command line,
2. ``$CLUSTERCTL_STATE_DIR``,
3. ``<state_dir>/deploy`` from the user config (``clusterctl/config.py``;
   default ``~/.local/state/clusterctl/deploy``).

The first two name the deploy state directory itself.  It holds three JSON
files, each ``{"version": 1, ...}``:

* ``placements.json``: template → replica name → host, GPU indexes, port.
  Placement is stable because this file remembers every assignment.
* ``cordons.json``: ``HOST`` or ``HOST:GPU`` → reason, who (user@hostname),
  when (UTC, ISO 8601).  Only an operator's ``uncordon`` removes an entry.
* ``replicas.json``: template → replica count set by ``clusterctl scale``;
  it wins over the inventory's ``replicas``.

Writers take an exclusive ``flock`` on ``.lock`` in the directory for the
whole read-modify-write and write each file to a temporary name, then rename
it, so a reader never sees half a file and two writers never lose an update.
A missing file is empty state; a corrupt one raises :class:`StateError`
naming the file (and the line, for JSON syntax errors).
"""

from __future__ import annotations

import copy
import getpass
import json
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from clusterctl.config import UserConfig
from clusterctl.errors import ConfigError, Problem
from clusterctl.files import LockBusy, RunLock, write_atomic
from clusterctl.inventory.model import CPU_SLOT

STATE_DIR_ENV = "CLUSTERCTL_STATE_DIR"
PLACEMENTS = "placements.json"
CORDONS = "cordons.json"
REPLICAS = "replicas.json"
LOCK = ".lock"
FORMAT_VERSION = 1
#: Seconds a writer waits for another writer's lock before giving up.
LOCK_WAIT_S = 10.0


class StateError(ConfigError):
    """A deploy state file is unreadable or malformed, or the directory is locked."""


@dataclass(frozen=True)
class Placement:
    """Where one template replica runs: a host, its TP group's GPU indexes, a TCP port.

    A replica of a ``nodes: N`` template (docs/multinode.md) spans N hosts: ``host``/``gpus`` is its
    first pipeline stage (the head), ``workers`` the other stages in rank order, each
    ``(host, GPU indexes)`` with as many GPUs as the head's.
    """

    host: str
    gpus: tuple[int, ...]
    port: int
    workers: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def stages(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Every stage ``(host, GPU indexes)``, the head first."""
        return ((self.host, self.gpus),) + self.workers

    @property
    def hosts(self) -> tuple[str, ...]:
        """The hosts of its stages, the head first."""
        return tuple(h for h, _ in self.stages)


@dataclass(frozen=True)
class Cordon:
    """An operator's mark that placement must not put new replicas on a host or GPU.

    ``when`` is UTC in ISO 8601 (seconds); ``who`` is ``user@hostname``.
    """

    reason: str
    who: str
    when: str


@dataclass
class DeployState:
    """Everything the control side remembers between deploys (see the module doc).

    ``placements``: template → replica name → :class:`Placement`;
    ``cordons``: ``HOST`` or ``HOST:GPU`` → :class:`Cordon`;
    ``replicas``: template → replica count override set by ``scale``.
    """

    placements: dict[str, dict[str, Placement]] = field(default_factory=dict)
    cordons: dict[str, Cordon] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)

    def copy(self) -> "DeployState":
        return copy.deepcopy(self)

    def host_cordoned(self, host: str) -> bool:
        """Whether the whole host is cordoned."""
        return host in self.cordons

    def gpu_cordoned(self, host: str, index: int) -> bool:
        """Whether GPU ``index`` of ``host`` is cordoned, by itself or with its host."""
        return host in self.cordons or f"{host}:{index}" in self.cordons


def cordon_key(host: str, gpu: int | None = None) -> str:
    """``host`` or ``host:gpu``: the key of a cordon."""
    return host if gpu is None else f"{host}:{gpu}"


def who_am_i() -> str:
    """``user@hostname`` of this process, recorded with a cordon."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def utc_now() -> str:
    """Now in UTC, ISO 8601 to the second (``2026-11-30T15:20:00Z``)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_state_dir(cli_value: str | Path | None, cfg: UserConfig) -> Path:
    """The deploy state directory: ``--state-dir`` > ``$CLUSTERCTL_STATE_DIR`` > ``<config state_dir>/deploy``."""
    if cli_value:
        return Path(cli_value).expanduser()
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return Path(cfg.state_dir) / "deploy"


# --- reading -----------------------------------------------------------------


def _read(path: Path, key: str) -> dict[str, Any]:
    """The ``key`` mapping of one state file; ``{}`` when the file does not exist."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise StateError([Problem(str(path), 0, f"cannot read: {e.strerror or e}")]) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise StateError([Problem(str(path), e.lineno, f"not valid JSON: {e.msg}; fix or remove the file")]) from None
    if not isinstance(doc, dict):
        raise _bad(path, "expected a JSON object")
    version = doc.get("version")
    if version != FORMAT_VERSION:
        raise _bad(path, f"format version {version!r} is not {FORMAT_VERSION} (written by another clusterctl?)")
    body = doc.get(key, {})
    if not isinstance(body, dict):
        raise _bad(path, f"{key!r} must be a JSON object")
    return body


def _bad(path: Path, message: str) -> StateError:
    return StateError([Problem(str(path), 0, message)])


def _name(path: Path, value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(path, f"{what}: expected a non-empty string, got {value!r}")
    return value


def _int(path: Path, value: Any, what: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise _bad(path, f"{what}: expected a whole number {lo}-{hi}, got {value!r}")
    return value


def _placements(path: Path) -> dict[str, dict[str, Placement]]:
    out: dict[str, dict[str, Placement]] = {}
    for tpl, replicas in _read(path, "templates").items():
        if not isinstance(replicas, dict):
            raise _bad(path, f"templates.{tpl}: expected an object of replicas")
        out[tpl] = {}
        for name, p in replicas.items():
            w = f"templates.{tpl}.{name}"
            if not isinstance(p, dict):
                raise _bad(path, f"{w}: expected an object with host, gpus, port")
            gpus = p.get("gpus")
            if not isinstance(gpus, list) or not gpus:
                raise _bad(path, f"{w}.gpus: expected a non-empty list of GPU indexes")
            idx = tuple(_int(path, g, f"{w}.gpus", CPU_SLOT, 1023) for g in gpus)
            if len(set(idx)) != len(idx):
                raise _bad(path, f"{w}.gpus: a GPU is listed twice")
            if CPU_SLOT in idx and len(idx) != 1:
                raise _bad(path, f"{w}.gpus: the CPU slot ({CPU_SLOT}) stands alone")
            out[tpl][name] = Placement(
                host=_name(path, p.get("host"), f"{w}.host"),
                gpus=idx,
                port=_int(path, p.get("port"), f"{w}.port", 1, 65535),
                workers=_workers(path, p.get("workers", []), w, len(idx)),
            )
    return out


def _workers(path: Path, value: Any, w: str, size: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A multi-node replica's other stages: ``[{"host", "gpus"}]``, each with ``size`` GPUs."""
    if not isinstance(value, list):
        raise _bad(path, f"{w}.workers: expected a list of {{host, gpus}}")
    out = []
    for n, stage in enumerate(value, 1):
        where = f"{w}.workers[{n}]"
        gpus = stage.get("gpus") if isinstance(stage, dict) else None
        if not isinstance(gpus, list) or len(gpus) != size:
            raise _bad(path, f"{where}.gpus: expected {size} GPU indexes (as many as the head's)")
        idx = tuple(_int(path, g, f"{where}.gpus", 0, 1023) for g in gpus)
        if len(set(idx)) != len(idx):
            raise _bad(path, f"{where}.gpus: a GPU is listed twice")
        out.append((_name(path, stage.get("host"), f"{where}.host"), idx))
    return tuple(out)


def _cordons(path: Path) -> dict[str, Cordon]:
    out: dict[str, Cordon] = {}
    for key, c in _read(path, "cordons").items():
        if not isinstance(c, dict):
            raise _bad(path, f"cordons.{key}: expected an object with reason, who, when")
        reason = c.get("reason", "")
        if not isinstance(reason, str):
            raise _bad(path, f"cordons.{key}.reason: expected a string, got {reason!r}")
        out[key] = Cordon(
            reason=reason,
            who=_name(path, c.get("who"), f"cordons.{key}.who"),
            when=_name(path, c.get("when"), f"cordons.{key}.when"),
        )
    return out


def _replicas(path: Path) -> dict[str, int]:
    return {tpl: _int(path, n, f"replicas.{tpl}", 0, 65535) for tpl, n in _read(path, "replicas").items()}


# --- writing -----------------------------------------------------------------


def _dump(key: str, body: Any) -> str:
    return json.dumps({"version": FORMAT_VERSION, key: body}, indent=1, sort_keys=True) + "\n"


def _placements_json(placements: dict[str, dict[str, Placement]]) -> str:
    return _dump(
        "templates", {tpl: {name: placement_json(p) for name, p in reps.items()} for tpl, reps in placements.items()}
    )


def placement_json(p: Placement) -> dict[str, Any]:
    """``{"host", "gpus", "port"}`` (and ``workers`` for a replica across hosts), as placements.json has it."""
    out: dict[str, Any] = {"host": p.host, "gpus": list(p.gpus), "port": p.port}
    if p.workers:
        out["workers"] = [{"host": h, "gpus": list(g)} for h, g in p.workers]
    return out


def _cordons_json(cordons: dict[str, Cordon]) -> str:
    return _dump("cordons", {k: {"reason": c.reason, "who": c.who, "when": c.when} for k, c in cordons.items()})


def _replicas_json(replicas: dict[str, int]) -> str:
    return _dump("replicas", dict(replicas))


def _write_atomic(path: Path, text: str) -> None:
    try:
        write_atomic(path, text)
    except OSError as e:
        raise _bad(path, f"cannot write: {e.strerror or e}") from None


class StateStore:
    """The deploy state directory ``directory`` (created on the first write)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def path(self, name: str) -> Path:
        return self.directory / name

    def load(self) -> DeployState:
        """Read all three files (missing ones are empty); :class:`StateError` on a corrupt one."""
        return DeployState(
            placements=_placements(self.path(PLACEMENTS)),
            cordons=_cordons(self.path(CORDONS)),
            replicas=_replicas(self.path(REPLICAS)),
        )

    @contextmanager
    def _locked(self) -> Iterator[None]:
        lock = RunLock(self.path(LOCK), wait_s=LOCK_WAIT_S)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            lock.__enter__()
        except LockBusy:
            raise _bad(
                self.path(LOCK),
                f"another clusterctl has held the deploy state lock for over {LOCK_WAIT_S:.0f} s; try again",
            ) from None
        except OSError as e:
            raise _bad(self.path(LOCK), f"cannot lock the deploy state directory: {e.strerror or e}") from None
        try:
            yield
        finally:
            lock.__exit__(None, None, None)

    @contextmanager
    def update(self) -> Iterator[DeployState]:
        """``with store.update() as st:`` read under the lock, change ``st``, written on exit.

        Only files whose content changed are rewritten; nothing is written
        when the block raises.
        """
        with self._locked():
            state = self.load()
            before = self._texts(state)
            yield state
            for name, text in self._texts(state).items():
                if text != before[name]:
                    _write_atomic(self.path(name), text)

    def save_placements(self, placements: dict[str, dict[str, Placement]]) -> None:
        """Replace ``placements.json`` (under the lock), leaving cordons and overrides as they are.

        The deploy engine calls this with ``PlacementResult.state.placements``
        once it applies, so a cordon set meanwhile is not lost.
        """
        with self._locked():
            _write_atomic(self.path(PLACEMENTS), _placements_json(placements))

    @staticmethod
    def _texts(state: DeployState) -> dict[str, str]:
        return {
            PLACEMENTS: _placements_json(state.placements),
            CORDONS: _cordons_json(state.cordons),
            REPLICAS: _replicas_json(state.replicas),
        }
