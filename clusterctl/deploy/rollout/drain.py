"""Drain an instance before it stops: no stream in flight is cut.

:func:`drain` (1) marks the instance down at the gateway when one is
configured, so no new request reaches it, then (2) polls the instance's
``/metrics`` every ``poll`` seconds from the control machine until
``vllm:num_requests_running + vllm:num_requests_waiting`` is 0, or
``timeout`` seconds have passed.  After the count reaches 0 it waits
``SETTLE_S`` more so the last chunks of a finished stream (``data: [DONE]``)
leave the server before the caller stops it.

Without a gateway nothing stops new requests from arriving: the drain then
waits for a moment with none in flight, which under steady traffic may be
the timeout.  An instance that refuses connections has nothing in flight
(drained at once); an instance whose ``/metrics`` cannot be read otherwise
(timeouts, errors) is polled until the timeout and reported with the error.

The gateway is reached through a :class:`GatewayHook` the caller gives (the
workflow layer builds it from the inventory: ``clusterctl.ops.deploy.drain_hook``;
``None`` without a gateway): deploy never reaches the gateway package itself.

A drain marks the instance down with the reason ``drain``; every path that
drains and then starts the instance again (deploy, rollback, restart, scale,
failover) calls :func:`put_back` once the instance passed its gates, which
marks up exactly the instances still marked down by a drain (an instance
marked down for another reason, e.g. failover's, keeps that mark).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from clusterctl.errors import ClusterctlError
from clusterctl.deploy.status.metrics import DEFAULT_HTTP_TIMEOUT, MetricsSample, base_url, fetch_sample, is_refused
from clusterctl.inventory.model import Instance, Inventory

#: Seconds waited after the in-flight count reaches 0 (the last bytes of a stream).
SETTLE_S = 0.5
#: Default seconds a drain may take before the instance is stopped anyway.
DEFAULT_DRAIN_TIMEOUT_S = 120.0
#: Default seconds between two ``/metrics`` polls.
DEFAULT_POLL_S = 1.0
#: The reason a drain records at the gateway (what :func:`put_back` lifts).
DRAIN_REASON = "drain"


class GatewayHook(Protocol):
    """What drain needs from the gateway (implemented in ``clusterctl/gateway/``).

    ``mark_down(name)``: stop sending new requests to the instance (it stays
    down until ``mark_up``); ``mark_up(name)``: send to it again.  Both return
    once the gateway applies the change, and raise ``ClusterctlError`` when
    they cannot.
    """

    def mark_down(self, instance_name: str) -> None: ...

    def mark_up(self, instance_name: str) -> None: ...


def put_back(gateway: GatewayHook | None, names: Iterable[str]) -> dict[str, str]:
    """Mark up at ``gateway`` each of ``names`` that a drain left marked down; name -> what happened.

    Called once the instances passed their gates.  An instance marked down for
    another reason (failover, an operator) is left as it is; when the hook
    cannot say why an instance is down (no ``marked()``), every name is marked
    up.  Never raises: a gateway that cannot apply the change is a note
    ("still down at the gateway: ...").
    """
    if gateway is None:
        return {}
    marked = getattr(gateway, "marked", None)
    current: dict[str, str] | None = marked() if callable(marked) else None
    todo = [n for n in dict.fromkeys(names) if current is None or current.get(n) == DRAIN_REASON]
    if not todo:
        return {}
    try:
        many = getattr(gateway, "mark_up_many", None)
        if callable(many):
            many(todo)
        else:
            for n in todo:
                gateway.mark_up(n)
    except ClusterctlError as e:
        return {n: f"still down at the gateway: {e}" for n in todo}
    return {n: "up at the gateway" for n in todo}


@dataclass(frozen=True)
class DrainResult:
    """How a drain ended.

    ``drained``: nothing was in flight at the end.  ``timed_out``: the
    timeout passed first; ``remaining`` requests (running + waiting) were
    still in flight (``None``: unknown, see ``error``).  ``waited_s``: seconds
    spent.  ``marked_down``: the gateway took the instance out first.
    """

    instance: str
    drained: bool
    timed_out: bool
    remaining: int | None
    waited_s: float
    marked_down: bool = False
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def drain(
    inv: Inventory,
    instance: Instance,
    *,
    timeout: float = DEFAULT_DRAIN_TIMEOUT_S,
    poll: float = DEFAULT_POLL_S,
    gateway: GatewayHook | None = None,
    fetch: Callable[[str], "MetricsSample | str"] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DrainResult:
    """Mark ``instance`` down at ``gateway`` (if any), then wait for its requests to finish.

    ``timeout``: seconds to wait for running + waiting to reach 0 (0: do not
    wait, report what is in flight).  ``poll``: seconds between ``/metrics``
    reads.  Never raises for an unreachable instance; a gateway that cannot
    mark the instance down raises (the caller must not stop it blindly).
    """
    get = fetch or (lambda u: fetch_sample(u, min(DEFAULT_HTTP_TIMEOUT, max(poll, 1.0))))
    url = base_url(inv, instance)
    t0 = clock()
    marked = False
    if gateway is not None:
        gateway.mark_down(instance.name)  # reason DRAIN_REASON (the hook's default)
        marked = True
    last_error: str | None = None
    remaining: int | None = None
    while True:
        got = get(url)
        if isinstance(got, str):
            if is_refused(got):
                return DrainResult(
                    instance.name, True, False, 0, round(clock() - t0, 3), marked, "not listening (nothing in flight)"
                )
            last_error = got
        else:
            last_error = None
            remaining = int(got.in_flight or 0)
            if remaining == 0:
                sleep(SETTLE_S)
                return DrainResult(instance.name, True, False, 0, round(clock() - t0, 3), marked)
        left = timeout - (clock() - t0)
        if left <= 0:
            return DrainResult(instance.name, False, True, remaining, round(clock() - t0, 3), marked, last_error)
        sleep(min(poll, left))
