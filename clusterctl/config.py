"""The user's configuration file: defaults for command-line options.

Read from ``$XDG_CONFIG_HOME/clusterctl/config.yaml`` (default
``~/.config/clusterctl/config.yaml``).  Keys (all optional)::

    inventory: /etc/clusterctl/inventory.yaml   # used when -i is not given
    fanout: 64                                  # parallel SSH connections
    connect_timeout: 10                         # seconds
    command_timeout: 60                         # seconds
    state_dir: ~/.local/state/clusterctl        # @failed, history, locks: per cluster under clusters/NAME

Precedence for the inventory path: ``-i/--inventory`` > ``$CLUSTERCTL_INVENTORY``
> this file > ``./inventory.yaml``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from clusterctl.errors import ConfigError, Problem


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "clusterctl" / "config.yaml"


def state_root() -> Path:
    """The user's state directory before keying by cluster (``$XDG_STATE_HOME/clusterctl``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "clusterctl"


#: (root, the cluster's directory under it) once a command knows its cluster (:func:`bind_state_dir`).
_BOUND: tuple[Path, Path] | None = None


def bind_state_dir(root: Path | None, keyed: Path | None = None) -> None:
    """From now on (this process), state under ``root`` means ``keyed`` (the cluster's directory,
    ``clusterctl.clusterstate.bind``); ``None`` unbinds.  A binding to another root is ignored."""
    global _BOUND
    _BOUND = (Path(root), Path(keyed)) if root is not None and keyed is not None else None


def keyed(root: Path) -> Path:
    """``root``'s cluster directory when a cluster is bound to it, else ``root``."""
    return _BOUND[1] if _BOUND is not None and _BOUND[0] == Path(root) else Path(root)


def bound_cluster_dir() -> Path | None:
    return _BOUND[1] if _BOUND is not None else None


def default_state_dir() -> Path:
    """The state directory: the bound cluster's part of :func:`state_root` (docs/architecture.md "State")."""
    return keyed(state_root())


@dataclass
class UserConfig:
    inventory: str | None = None
    fanout: int = 64
    connect_timeout: float = 10.0
    command_timeout: float = 60.0
    state_dir: Path = field(default_factory=default_state_dir)


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "inventory": str,
    "fanout": int,
    "connect_timeout": (int, float),
    "command_timeout": (int, float),
    "state_dir": str,
}


def load_user_config(path: Path | None = None) -> UserConfig:
    """Load the user config; a missing file gives the defaults.

    Raises :class:`ConfigError` naming ``file:line`` for a bad file.
    """
    path = path or config_path()
    cfg = UserConfig()
    if not path.exists():
        cfg.state_dir = keyed(state_root())
        return cfg
    try:
        node = yaml.compose(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        raise ConfigError([Problem(str(path), line, f"not valid YAML: {getattr(e, 'problem', e)}")])
    if node is None:
        return cfg
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError([Problem(str(path), node.start_mark.line + 1, "expected a mapping of settings")])
    problems: list[Problem] = []
    for knode, vnode in node.value:
        key, line = knode.value, knode.start_mark.line + 1
        if key not in _FIELDS:
            problems.append(Problem(str(path), line, f"unknown setting {key!r} (known: {', '.join(_FIELDS)})"))
            continue
        try:
            value = yaml.safe_load(yaml.serialize(vnode))
        except (yaml.YAMLError, ValueError) as e:  # ValueError: PyYAML on scalars like 0b_
            problems.append(Problem(str(path), line, f"{key}: cannot read the value: {e}"))
            continue
        if not isinstance(value, _FIELDS[key]) or isinstance(value, bool):
            problems.append(Problem(str(path), line, f"{key}: wrong type {type(value).__name__}"))
            continue
        if key == "state_dir":
            value = Path(os.path.expanduser(str(value)))
        setattr(cfg, key, value)
    if problems:
        raise ConfigError(problems)
    cfg.state_dir = keyed(cfg.state_dir)
    return cfg


def load_user_config_root(path: Path | None = None) -> UserConfig:
    """:func:`load_user_config` with ``state_dir`` as configured, not keyed by the bound cluster."""
    cfg = load_user_config(path)
    if _BOUND is not None and cfg.state_dir == _BOUND[1]:
        cfg.state_dir = _BOUND[0]
    return cfg


def resolve_inventory_path(cli_value: str | None, cfg: UserConfig) -> str:
    return cli_value or os.environ.get("CLUSTERCTL_INVENTORY") or cfg.inventory or "inventory.yaml"
