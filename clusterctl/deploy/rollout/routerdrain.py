"""Drain a prefill/decode pool's router (docs/disaggregation.md).

The gateway stops sending to it first (``router-P`` marked down, as an instance), then the wait for
in-flight requests reads the pool's members' ``/metrics`` (every request through the router runs on
them: the gateway never sends a pool's members traffic directly), bounded by the drain timeout.
Deploy drains a router before it restarts or removes it (``apply.drain_before``), ``clusterctl
stop|restart router-P`` too (``lifecycle``), and puts it back once its gate passed.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Mapping

from clusterctl.deploy.rollout.drain import DEFAULT_DRAIN_TIMEOUT_S, DEFAULT_POLL_S, DrainResult, GatewayHook, drain
from clusterctl.deploy.status.metrics import (
    DEFAULT_HTTP_TIMEOUT,
    MAX_PARALLEL,
    MetricsSample,
    base_url,
    fetch_sample,
    is_refused,
)
from clusterctl.deploy.units import pdrouter
from clusterctl.inventory.model import Instance, Inventory, PdPool


def _members_in_flight(inv: Inventory, members: list[Instance], timeout: float) -> MetricsSample | str:
    """The pool's requests in flight: running + waiting summed over its members' ``/metrics``."""
    if not members:
        return "ConnectionRefusedError: no member placed"
    with cf.ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(members))) as ex:
        got = list(ex.map(lambda m: fetch_sample(base_url(inv, m), timeout), members))
    errors = [g for g in got if isinstance(g, str) and not is_refused(g)]
    if errors:
        return errors[0]
    ok = [g for g in got if isinstance(g, MetricsSample)]
    if not ok:
        return str(got[0])  # none listening: nothing in flight
    return MetricsSample(
        at=time.monotonic(),
        kv_usage=None,
        running=sum(s.running or 0.0 for s in ok),
        waiting=sum(s.waiting or 0.0 for s in ok),
        generation_tokens=None,
    )


def drain_router(
    inv: Inventory,
    pool: PdPool,
    instances: Mapping[str, Instance],
    *,
    timeout: float = DEFAULT_DRAIN_TIMEOUT_S,
    poll: float = DEFAULT_POLL_S,
    gateway: GatewayHook | None = None,
) -> DrainResult:
    """Mark ``router-P`` down at the gateway, then wait until the pool's members have nothing in
    flight (module doc); the same bounds and result as :func:`clusterctl.deploy.drain.drain`."""
    router = pdrouter.router_instance(inv, pool)
    members = pdrouter.members(inv, pool, instances.values())
    return drain(
        inv,
        router,
        timeout=timeout,
        poll=poll,
        gateway=gateway,
        fetch=lambda _url: _members_in_flight(inv, members, min(DEFAULT_HTTP_TIMEOUT, max(poll, 1.0))),
    )
