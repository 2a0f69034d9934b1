"""The ``inventory`` commands' work: validate a file (every problem listed), the hosts a pattern
selects (``@failed``: the previous run's failed hosts), and an Ansible inventory converted into
a validated clusterctl inventory (``import-ansible``).  ``inventory discover`` and ``diff`` are in
:mod:`clusterctl.ops.discover`.  Errors are :class:`~clusterctl.errors.ClusterctlError` naming the
file or pattern; the CLI parses the options and renders.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from clusterctl.deploy.units.secrets import looks_secret
from clusterctl.errors import ClusterctlError, InventoryError
from clusterctl.files import write_atomic
from clusterctl.fleet.failed import FILENAME as FAILED_FILE, load_failed
from clusterctl.inventory.ansible import import_ansible as read_ansible, to_yaml
from clusterctl.inventory.loader import load_inventory, load_inventory_text
from clusterctl.inventory.model import Host, Inventory
from clusterctl.inventory.select import select_hosts


def validate(path: str, *, force: bool = False) -> Inventory:
    """The inventory at ``path``, loaded and validated (``force``: warnings accepted); raises
    :class:`~clusterctl.errors.InventoryError` with every problem (``file:line``)."""
    return load_inventory(path, force=force)


def previous_failed(inventory: Inventory, state_dir: Path) -> Optional[list[str]]:
    """The hosts that failed in the previous run of this inventory, or None when none is recorded."""
    if not (Path(state_dir) / FAILED_FILE).exists():
        return None
    return load_failed(state_dir, inventory=inventory.path)


def hosts(inventory: Inventory, pattern: str, state_dir: Path) -> list[Host]:
    """The hosts ``pattern`` selects (``@failed``: the previous run's); a bad pattern raises."""
    return select_hosts(inventory, pattern, failed=previous_failed(inventory, state_dir))


@dataclass(frozen=True)
class Converted:
    """An Ansible inventory as a clusterctl inventory: its YAML ``text`` (validated), ``data``, and
    ``warnings`` (passwords dropped, variables not understood)."""

    text: str
    data: dict[str, Any]
    warnings: list[str]


def _ignore(_w: str) -> None:
    pass


def import_ansible(
    source: Path, output: Optional[Path] = None, on_warning: Callable[[str], None] = _ignore
) -> Converted:
    """``source`` (INI or YAML, with group_vars/ and host_vars/ beside it) converted and validated
    (``output``: the name the validation errors give); each warning goes to ``on_warning`` as soon
    as the file is read, before the validation."""
    result = read_ansible(source)
    for w in result.warnings:
        on_warning(w)
    text = to_yaml(result.data, source=str(source))
    try:
        load_inventory_text(text, str(output) if output else "<output>", force=True)
    except InventoryError as e:
        raise ClusterctlError(f"the converted inventory does not validate:\n{e}") from None
    return Converted(text, result.data, list(result.warnings))


def save(converted: Converted, output: Path) -> None:
    """Write the converted inventory to ``output`` atomically, readable by its owner only."""
    try:
        write_atomic(output.resolve(), converted.text, mode=0o600, make_dirs=False)
    except OSError as e:
        raise ClusterctlError(f"cannot write {output}: {e.strerror}") from None


def redacted(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the values of secret-looking names (``VLLM_API_KEY``) replaced by ``***``."""
    return {k: "***" if looks_secret(k) else v for k, v in env.items()}
