"""TARGET arguments of ``bench`` and ``drift``: a URL or an inventory instance name (clusterctl/bench/target.py)."""

from __future__ import annotations

from typing import Any, Optional

import typer

from clusterctl.cli._common import fail, load_inventory, user_config
from clusterctl.errors import ClusterctlError

TargetArg = typer.Argument(..., help="Endpoint URL (http://HOST:PORT) or the name of an inventory instance.")


def endpoint(target: str, inventory: Optional[str]) -> Any:
    """The :class:`~clusterctl.vllmclient.Endpoint` of ``target`` (with its API key); exits 3 on a bad URL,
    an unknown instance or an unreadable secret.  The inventory is read only for an instance name."""
    from clusterctl.bench.target import resolve
    from clusterctl.deploy.placement.deployed import with_replicas

    try:  # template replicas too, where placement recorded them
        return resolve(target, lambda: with_replicas(load_inventory(inventory), cfg=user_config()))
    except ClusterctlError as e:
        fail(str(e))
