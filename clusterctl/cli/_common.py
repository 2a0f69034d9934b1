"""Helpers shared by the CLI command modules: output, errors, inventory."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console

from clusterctl.config import (
    UserConfig,
    bind_state_dir,
    keyed,
    load_user_config,
    load_user_config_root,
    resolve_inventory_path,
)
from clusterctl.errors import ClusterctlError, ConfigError
from clusterctl.cli._options import InventoryOpt as InventoryOpt  # re-exported: defined in _options
from clusterctl.cli._options import JsonOpt as JsonOpt  # re-exported: defined in _options
from clusterctl.exitcodes import USAGE_ERROR

if TYPE_CHECKING:
    from clusterctl.clusterstate import Bound
    from clusterctl.inventory.model import Inventory

# soft_wrap: messages (file:line problems, paths) stay one line each, so grep works;
# tables are still laid out to the terminal width.
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def write_files(files: dict[Any, str], *, dry_run: bool) -> None:
    """Write each ``path: text`` atomically (``clusterctl.files.write_atomic``) and say ``wrote PATH``;
    with ``dry_run`` print ``# PATH`` and the text instead.  A file that cannot be written exits 3."""
    from clusterctl.files import write_atomic

    for path, text in files.items():
        if dry_run:
            console.print(f"# {path}\n{text}", markup=False)
            continue
        try:
            write_atomic(path, text)
        except OSError as e:
            fail(f"{path}: cannot write: {e.strerror}")
        console.print(f"wrote {path}", markup=False)


def fail(message: str, code: int = USAGE_ERROR) -> NoReturn:
    """Print ``message`` on stderr and exit with ``code`` (3 = could not run)."""
    # Plain text: messages carry paths and node sets such as gpu[01-04] that
    # rich would read as markup or wrap mid-path.
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(code)


def user_config() -> UserConfig:
    """The user config; its ``state_dir`` is the cluster's part of the state directory
    (``clusterctl.clusterstate``): the cluster of the inventory this command loaded, else of the
    default inventory (``$CLUSTERCTL_INVENTORY``, the config's, ``./inventory.yaml``) when one exists."""
    try:
        root = load_user_config_root().state_dir
        if keyed(root) == root:
            _bind_default()
        return load_user_config()
    except ConfigError as e:
        fail(str(e))


_binding = False


def _bind_default() -> None:
    """Bind the default inventory's cluster when it exists and loads; otherwise leave the state un-keyed."""
    global _binding
    if _binding:
        return
    from pathlib import Path

    from clusterctl.inventory.loader import load_inventory as _load

    _binding = True
    try:
        path = resolve_inventory_path(None, load_user_config_root())
        if Path(path).is_file():
            try:
                inv = _load(path, force=True)
            except ClusterctlError:
                return
            bind_cluster(inv)
    finally:
        _binding = False


def bind_cluster(inv: Inventory) -> Bound:
    """Key this command's state by ``inv``'s cluster (``clusterctl.clusterstate.bind``: adopt un-keyed
    state once, refuse another cluster's state with exit 3); returns the binding (cluster, state_dir)."""
    from clusterctl.clusterstate import bind

    def say(message: str) -> None:
        sys.stderr.write(message + "\n")

    try:
        root = load_user_config_root().state_dir
        b = bind(inv, root, on_event=say)
    except ConfigError as e:
        fail(str(e))
    except ClusterctlError as e:
        fail(str(e))
    except OSError as e:
        fail(f"state directory: {e}")
    bind_state_dir(root, b.state_dir)
    return b


def cluster_meta() -> dict[str, str]:
    """``{"cluster", "state_dir"}`` of the cluster this command's state is keyed by; ``{}`` when none is."""
    from clusterctl.config import bound_cluster_dir

    d = bound_cluster_dir()
    root = load_user_config_root().state_dir
    if d is None or keyed(root) == root:
        return {}
    return {"cluster": d.name, "state_dir": str(d)}


def cluster_line() -> str | None:
    """The header line naming the cluster whose state a command uses (status, doctor, report)."""
    m = cluster_meta()
    return f"cluster {m['cluster']} (state {m['state_dir']})" if m else None


def load_inventory(path: str | None, force: bool = False):  # -> Inventory
    """Load and validate the inventory or exit 3 with every problem listed; the command's state is
    then the inventory's cluster's (:func:`bind_cluster`)."""
    from clusterctl.inventory.loader import load_inventory as _load

    global _binding
    _binding = True  # resolving the path must not bind the default inventory first
    try:
        cfg = user_config()
    finally:
        _binding = False
    try:
        inv = _load(resolve_inventory_path(path, cfg), force=force)
    except ClusterctlError as e:
        fail(str(e))
    bind_cluster(inv)
    return inv


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
