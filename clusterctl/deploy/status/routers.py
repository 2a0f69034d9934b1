"""A prefill/decode pool's router in ``clusterctl status`` (docs/disaggregation.md, docs/status.md).

The router of pool ``P`` (``clusterctl-router-P.service``, :mod:`clusterctl.deploy.units.pdrouter`) is a
row as an instance is (``router-P`` on its host, its unit state and ``/health``) with ``pool`` and
``router``: its Prometheus page (``--prometheus-host`` the host's address, ``--prometheus-port``
``pd_pools.P.router.metrics_port``, default port + 10000; vllm-router 0.1.17 names, recorded in
``tests/fixtures/deploy/router/``): each member's URL with the router's own view of its health
(``vllm_router_worker_health``), requests and errors so far.  A serving router that sees a member
unhealthy, or does not list a member the inventory places, is WARN naming it; its page unreadable
is WARN as an instance's ``/metrics``.  Its drain: :mod:`clusterctl.deploy.rollout.routerdrain`.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any, Iterable, Mapping

from clusterctl.deploy.status.metrics import DEFAULT_HTTP_TIMEOUT, MAX_PARALLEL, http_get
from clusterctl.deploy.units import pd, pdrouter
from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.serving import parse_metrics
from clusterctl.inventory.model import Instance, Inventory, PdPool

#: vllm-router's counters of failed requests (0.1.17), summed into ``errors_total``.
ERROR_COUNTERS = (
    "vllm_router_pd_errors_total",
    "vllm_router_pd_prefill_errors_total",
    "vllm_router_pd_decode_errors_total",
    "vllm_router_pd_stream_errors_total",
    "vllm_router_request_errors_total",
)


def router_instances(inv: Inventory, instances: Mapping[str, Instance]) -> dict[str, Instance]:
    """``router-P`` -> the router of every pool ready among ``instances``, as an Instance (its host, port)."""
    return {n: i for n, i in pdrouter.gateway_servers(inv, instances).items() if pdrouter.pool_of(inv, n) is not None}


def metrics_url(inv: Inventory, pool: PdPool) -> str:
    return f"http://{inv.hosts[pool.router.host].address}:{pool.router.prometheus_port}/metrics"


def read_metrics(
    inv: Inventory, names: Iterable[str], timeout: float = DEFAULT_HTTP_TIMEOUT
) -> dict[str, dict[str, Any] | str]:
    """``router-P`` -> its parsed Prometheus page (``parse_metrics``), or why it could not be read."""
    pools = {n: p for n in names if (p := pdrouter.pool_of(inv, n)) is not None}
    if not pools:
        return {}

    def one(pool: PdPool) -> dict[str, Any] | str:
        a = http_get(metrics_url(inv, pool), timeout)
        if not a.ok:
            return a.error or f"HTTP {a.status}"
        return parse_page(a.body.decode("utf-8", "replace"))

    with cf.ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(pools))) as ex:
        return dict(zip(pools, ex.map(one, pools.values())))


def parse_page(text: str) -> dict[str, Any]:
    """vllm-router's Prometheus text, parsed (``{name: [(labels, value)]}``)."""
    return parse_metrics(text)


def _sum(m: Mapping[str, Any], name: str) -> float | None:
    rows = m.get(name)
    return None if not rows else sum(v for _, v in rows)


def view(
    inv: Inventory, pool: PdPool, instances: Mapping[str, Instance], got: Mapping[str, Any] | str | None
) -> tuple[dict[str, Any], list[str]]:
    """The router's status record (``pool``, ``metrics_port``, ``members`` with the router's view of
    each, ``requests_total``, ``errors_total``, ``metrics_error``) and what is wrong with it."""
    members = pdrouter.members(inv, pool, instances.values())
    rec: dict[str, Any] = {
        "pool": pool.name,
        "metrics_port": pool.router.prometheus_port,
        "members": [],
        "requests_total": None,
        "errors_total": None,
        "metrics_error": None,
    }
    bad: list[str] = []
    if got is None or isinstance(got, str):
        rec["metrics_error"] = got or "not read"
    health = (
        {}
        if not isinstance(got, Mapping)
        else {labels.get("worker", ""): v for labels, v in got.get("vllm_router_worker_health", [])}
    )
    for m in members:
        url = pd.instance_url(inv, m)
        seen = health.get(url)
        rec["members"].append(
            {"instance": m.name, "role": m.role, "url": url, "healthy": None if seen is None else seen >= 1}
        )
        if isinstance(got, Mapping) and seen is None:
            bad.append(
                f"the router does not list {m.role} {m.name} ({url}): its unit predates the member "
                f"(clusterctl deploy renders it again)"
            )
        elif seen is not None and seen < 1:
            bad.append(f"the router sees {m.role} {m.name} ({url}) unhealthy")
    if isinstance(got, Mapping):
        rec["requests_total"] = _sum(got, "vllm_router_pd_requests_total")
        errors = [v for n in ERROR_COUNTERS if (v := _sum(got, n)) is not None]
        rec["errors_total"] = sum(errors) if errors else 0.0
    return rec, bad


def apply_status(
    row: Any, inv: Inventory, instances: Mapping[str, Instance], got: Mapping[str, Any] | str | None
) -> None:
    """Fill a router's status row (``deploy.status.InstanceStatus``): ``pool``, ``router``, and a WARN
    when it serves but sees a member unhealthy, misses one, or its page cannot be read."""
    pool = pdrouter.pool_of(inv, row.name)
    if pool is None:
        return
    rec, bad = view(inv, pool, instances, got)
    row.pool, row.router = pool.name, rec
    if row.state != "serving":
        return
    if rec["metrics_error"] is not None:
        bad.append(f"/metrics on port {pool.router.prometheus_port}: {rec['metrics_error']}")
    if bad:
        if row.severity.rank < Severity.WARN.rank:
            row.severity = Severity.WARN
        row.message = "; ".join(bad) + (f"; {row.message}" if row.message else "")
