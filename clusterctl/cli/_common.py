"""Helpers shared by the CLI command modules: output, errors, inventory."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

from clusterctl.config import UserConfig, load_user_config, resolve_inventory_path
from clusterctl.errors import ClusterctlError, ConfigError
from clusterctl.exitcodes import USAGE_ERROR

# soft_wrap: messages (file:line problems, paths) stay one line each, so grep works;
# tables are still laid out to the terminal width.
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

InventoryOpt = typer.Option(
    None, "--inventory", "-i", envvar="CLUSTERCTL_INVENTORY",
    help="Inventory file [default: user config, then ./inventory.yaml].")
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")


def fail(message: str, code: int = USAGE_ERROR) -> NoReturn:
    """Print ``message`` on stderr and exit with ``code`` (3 = could not run)."""
    # Plain text: messages carry paths and node sets such as gpu[01-04] that
    # rich would read as markup or wrap mid-path.
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(code)


def user_config() -> UserConfig:
    try:
        return load_user_config()
    except ConfigError as e:
        fail(str(e))


def load_inventory(path: str | None, force: bool = False):  # -> Inventory
    """Load and validate the inventory or exit 3 with every problem listed."""
    from clusterctl.inventory.loader import load_inventory as _load

    cfg = user_config()
    try:
        return _load(resolve_inventory_path(path, cfg), force=force)
    except ClusterctlError as e:
        fail(str(e))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
