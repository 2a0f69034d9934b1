"""A Prometheus ``file_sd`` target list of every vLLM instance's /metrics endpoint.

One target group per instance: ``{"targets": ["<address>:<port>"],
"labels": {"vllm_instance", "model", "host", "tp_size"}}``.  The endpoint is
the API server's, on the first host of the instance's placement (rank 0).
An IPv6 address is bracketed.  Write it with
:func:`clusterctl.files.write_atomic` (Prometheus re-reads the file
on change and must never see half of it).
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from clusterctl.inventory.model import Inventory


def _hostport(address: str, port: int) -> str:
    try:
        if ipaddress.ip_address(address).version == 6:
            return f"[{address}]:{port}"
    except ValueError:
        pass  # a DNS name
    return f"{address}:{port}"


def targets(inv: Inventory) -> list[dict[str, Any]]:
    """The target groups, in the inventory's instance order; instances without placement are skipped."""
    out = []
    for inst in inv.instances.values():
        if not inst.placement:
            continue
        head = inst.placement[0].host
        host = inv.hosts.get(head)
        if host is None:
            continue
        out.append(
            {
                "targets": [_hostport(host.address, inst.port)],
                "labels": {"vllm_instance": inst.name, "model": inst.model, "host": head, "tp_size": str(inst.tp_size)},
            }
        )
    return out


def render(inv: Inventory) -> str:
    return json.dumps(targets(inv), indent=2) + "\n"
