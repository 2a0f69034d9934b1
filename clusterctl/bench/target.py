"""TARGET of ``bench`` and ``drift``: an endpoint URL or an inventory instance name.

An instance resolves to ``http://ADDRESS:PORT`` of its first placement host
(where vLLM's API server runs) and the API key the instance requires, as
deploy resolves it (:func:`clusterctl.deploy.units.secrets.instance_api_key`: an
inline ``env: VLLM_API_KEY``, else its ``VLLM_API_KEY`` secret), else
``$CLUSTERCTL_API_KEY``.  A URL takes ``$VLLM_API_KEY`` / ``$OPENAI_API_KEY``
/ ``$CLUSTERCTL_API_KEY``.  The key travels in the endpoint, never in a
command line, and the endpoint's repr leaves it out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.vllmclient import Endpoint
from clusterctl.deploy.units.secrets import instance_api_key

#: A TARGET that is a URL (scheme, or HOST:PORT) rather than an instance name.
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://|^[^/:]+:\d+(/.*)?$", re.IGNORECASE)


def is_url(target: str) -> bool:
    return bool(_URL.match(target))


def _env_key() -> str | None:
    return (
        os.environ.get("VLLM_API_KEY")
        or os.environ.get("OPENAI_API_KEY")
        or os.environ.get("CLUSTERCTL_API_KEY")
        or None
    )


def instance_endpoint(inv: Inventory, inst: Instance) -> Endpoint:
    """``http://address:port`` of ``inst``'s first host with its API key (see the module doc); raises
    ConfigError when a secret the inventory names cannot be read."""
    host = inv.hosts[inst.placement[0].host]
    key = instance_api_key(inv, inst) or os.environ.get("CLUSTERCTL_API_KEY") or None
    return Endpoint(host.address, inst.port).with_key(key)


def resolve(target: str, load_inventory: Callable[[], Inventory]) -> Endpoint:
    """The endpoint of ``target``; ``load_inventory`` is called only for an instance name.  Raises
    ClusterctlError for a bad URL or an unknown instance (naming the inventory's instances)."""
    if is_url(target):
        return Endpoint.parse(target).with_key(_env_key())
    inv = load_inventory()
    inst = inv.instances.get(target)
    if inst is None:
        known = ", ".join(sorted(inv.instances)) or "none"
        raise ClusterctlError(
            f"{target!r} is neither a URL (http://HOST:PORT) nor an instance of {inv.path} (instances: {known})"
        )
    return instance_endpoint(inv, inst)
