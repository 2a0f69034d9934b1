"""The inventory as deployed: explicit instances plus the template replicas placement recorded.

Analyzers (doctor, report, the Prometheus file_sd list) read ``Inventory.instances``;
template replicas exist only once placement has recorded them in the deploy state
directory (``placements.json``).  :func:`with_replicas` gives an inventory whose
``instances`` holds both, so a replica is diagnosed, reported and scraped exactly like an
explicit instance.  Replicas not placed yet (never deployed) are left out: nothing expects
them to run.  Reading never writes the state.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from clusterctl.config import UserConfig
from clusterctl.deploy.placement.place import desired_instances
from clusterctl.deploy.state import StateError, StateStore, resolve_state_dir
from clusterctl.inventory.model import Instance, Inventory


def wanted_instances(inv: Inventory, state_dir: str | Path) -> dict[str, Instance]:
    """Every instance that should run: the explicit ones and each template replica, placed on
    the recorded state in ``state_dir`` (replicas not recorded yet get a place, unsaved).
    Raises ``StateError`` when the state cannot be read."""
    return dict(desired_instances(inv, StateStore(state_dir).load()).instances)


def with_replicas(inv: Inventory, state_dir: str | Path | None = None, cfg: UserConfig | None = None) -> Inventory:
    """A copy of ``inv`` whose ``instances`` include the recorded template replicas.

    ``state_dir`` as ``--state-dir`` (else ``$CLUSTERCTL_STATE_DIR``, else the user
    config's).  An inventory without templates, or a state directory that cannot be read,
    gives ``inv`` itself unchanged (and the unreadable state a warning in ``warnings``).
    """
    if not inv.templates:
        return inv
    directory = resolve_state_dir(state_dir, cfg or UserConfig())
    try:
        result = desired_instances(inv, StateStore(directory).load())
    except StateError as e:
        return dataclasses.replace(inv, warnings=[*inv.warnings, f"template replicas left out: {e}"])
    placed = {name: inst for name, inst in result.instances.items() if name in inv.instances or name not in result.new}
    return dataclasses.replace(inv, instances=placed)
