"""TARGET arguments of ``bench`` and ``drift``: a URL or an inventory instance name (``ops/bench.endpoint``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from clusterctl.cli._common import fail, load_inventory, user_config
from clusterctl.errors import ClusterctlError

if TYPE_CHECKING:
    from clusterctl.vllmclient import Endpoint

TargetArg = typer.Argument(..., help="Endpoint URL (http://HOST:PORT) or the name of an inventory instance.")


def endpoint(target: str, inventory: Optional[str]) -> Endpoint:
    """The :class:`~clusterctl.vllmclient.Endpoint` of ``target`` (with its API key); exits 3 on a bad URL,
    an unknown instance or an unreadable secret.  The inventory is read only for an instance name."""
    from clusterctl.ops import bench as ops

    try:
        return ops.endpoint(target, lambda: load_inventory(inventory), user_config)
    except ClusterctlError as e:
        fail(str(e))
