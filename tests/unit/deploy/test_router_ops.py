"""A pool's router in operations (deploy/status/routers.py, deploy/rollout/routerdrain.py): status rows
from its own Prometheus page, the drain through its members, stop/restart by name, deploy draining it first.

The Prometheus page is vllm-router 0.1.17's, recorded in front of two simulators
(tests/fixtures/deploy/router/README.md); hosts are a fake transport, HTTP servers real on 127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clusterctl.deploy.remote import HostState, InstanceState
from clusterctl.deploy.rollout import apply as ap
from clusterctl.deploy.rollout import routerdrain
from clusterctl.deploy.rollout.drain import DrainResult
from clusterctl.deploy.rollout.lifecycle import run_action
from clusterctl.deploy.rollout.plan import HostPlan, PlanItem
from clusterctl.deploy.status import routers
from clusterctl.deploy.status.instances import collect_status, exit_code
from clusterctl.diagnose.findings import Severity
from clusterctl.inventory.loader import load_inventory_text

from .status_fakes import FakeVllm, fleet_for, metrics_text, server, unit  # noqa: F401 (server: a fixture)

PAGE = (
    Path(__file__).resolve().parents[2] / "fixtures" / "deploy" / "router" / "vllm-router-0.1.17-pd.prom"
).read_text()
#: the members' URLs in the recorded page
PREFILL_PORT, DECODE_PORT = 40939, 51301


def _inv(router_port: int, metrics_port: int, p_port: int = PREFILL_PORT, d_port: int = DECODE_PORT):
    return load_inventory_text(
        f"""\
version: 1
defaults:
  gpus: {{count: 2, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}}
hosts:
  h1: {{address: 127.0.0.1}}
  h2: {{address: 127.0.0.1}}
engines:
  sim: {{path: /usr/local/bin/vllm, version: "0.11.0"}}
models:
  q: {{path: /models/q, served_name: q}}
instances:
  qp1: {{model: q, engine: sim, placement: "h1:0", port: {p_port}, role: prefill}}
  qd1: {{model: q, engine: sim, placement: "h2:0", port: {d_port}, role: decode}}
pd_pools:
  pool: {{model: q, router: {{host: h1, port: {router_port}, metrics_port: {metrics_port}}}}}
""",
        "pd.yaml",
    )


def _router_unit(active: str = "active", sub: str = "running") -> dict[str, Any]:
    u = unit("router-pool", active, sub)
    u["x"] = {"Instance": "router-pool", "Role": "router", "Pool": "pool", "Engine": "vllm-router", "Port": "0"}
    return u


class Gateway:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def mark_down(self, name: str) -> None:
        self.log.append(f"down {name}")

    def mark_up(self, name: str) -> None:
        self.log.append(f"up {name}")


def _status(inv: Any, units: dict[str, Any]) -> list[Any]:
    wanted = {**inv.instances, **routers.router_instances(inv, inv.instances)}
    fleet, _ = fleet_for(inv, units)
    with fleet:
        return collect_status(inv, wanted, fleet, window=0, http_timeout=2, tp_check=False)


def test_the_recorded_page_gives_each_members_health_as_the_router_sees_it() -> None:
    inv = _inv(8300, 18300)
    rec, bad = routers.view(inv, inv.pd_pools["pool"], inv.instances, routers.parse_page(PAGE))
    assert bad == []
    assert rec["members"] == [
        {"instance": "qd1", "role": "decode", "url": f"http://127.0.0.1:{DECODE_PORT}", "healthy": True},
        {"instance": "qp1", "role": "prefill", "url": f"http://127.0.0.1:{PREFILL_PORT}", "healthy": True},
    ]
    assert (rec["requests_total"], rec["errors_total"], rec["metrics_port"]) == (2.0, 0.0, 18300)
    sick = routers.parse_page(
        PAGE.replace(
            f'worker_health{{worker="http://127.0.0.1:{DECODE_PORT}"}} 1',
            f'worker_health{{worker="http://127.0.0.1:{DECODE_PORT}"}} 0',
        )
    )
    _, bad = routers.view(inv, inv.pd_pools["pool"], inv.instances, sick)
    assert bad == [f"the router sees decode qd1 (http://127.0.0.1:{DECODE_PORT}) unhealthy"]
    moved = _inv(8300, 18300, d_port=9999)  # a member the running router does not know
    _, bad = routers.view(moved, moved.pd_pools["pool"], moved.instances, routers.parse_page(PAGE))
    assert bad and bad[0].startswith("the router does not list decode qd1 (http://127.0.0.1:9999)")


def test_status_has_a_router_row_with_its_pool_and_members(server) -> None:
    front, page = server(), server(metrics=[PAGE])
    inv = _inv(front.port, page.port)
    rows = {r.name: r for r in _status(inv, {"h1": {"router-pool": _router_unit()}})}
    r = rows["router-pool"]
    assert (r.state, r.severity, r.pool, r.host) == ("serving", Severity.OK, "pool", "h1"), r.message
    assert [m["healthy"] for m in r.router["members"]] == [True, True]
    assert r.to_json()["router"]["requests_total"] == 2.0
    assert not [n for n in rows if n.startswith("router-pool@")]  # not an extra row
    assert "/metrics" not in front.requests  # vLLM's load figures are not asked of the router


def test_a_router_that_sees_a_member_down_or_cannot_be_scraped_is_warn_and_a_failed_one_crit(server) -> None:
    front = server()
    sick = PAGE.replace(
        f'worker_health{{worker="http://127.0.0.1:{PREFILL_PORT}"}} 1',
        f'worker_health{{worker="http://127.0.0.1:{PREFILL_PORT}"}} 0',
    )
    page = server(metrics=[sick])
    inv = _inv(front.port, page.port)
    r = {x.name: x for x in _status(inv, {"h1": {"router-pool": _router_unit()}})}["router-pool"]
    assert r.severity == Severity.WARN and "the router sees prefill qp1" in r.message
    page.close()
    r = {x.name: x for x in _status(inv, {"h1": {"router-pool": _router_unit()}})}["router-pool"]
    assert r.severity == Severity.WARN and f"/metrics on port {page.port}" in r.message
    rows = _status(inv, {"h1": {"router-pool": _router_unit("failed", "failed")}})
    r = {x.name: x for x in rows}["router-pool"]
    assert (r.state, r.severity) == ("failed", Severity.CRIT) and exit_code(rows) == 2


def test_drain_marks_the_router_down_then_waits_for_the_members(server) -> None:
    busy = {"n": 2}

    def decode_metrics() -> str:
        busy["n"] = max(0, busy["n"] - 1)
        return metrics_text(busy["n"], 0)

    pre, dec = server(metrics=[metrics_text(0, 0)]), server(metrics_fn=decode_metrics)
    inv = _inv(8300, 18300, p_port=pre.port, d_port=dec.port)
    log: list[str] = []
    res = routerdrain.drain_router(
        inv, inv.pd_pools["pool"], inv.instances, timeout=10, poll=0.05, gateway=Gateway(log)
    )
    assert res.drained and res.marked_down and res.instance == "router-pool" and log == ["down router-pool"]
    assert dec.requests.count("/metrics") >= 2  # it waited for the decode member's request to finish
    stuck = server(metrics=[metrics_text(3, 1)])
    inv = _inv(8300, 18300, p_port=pre.port, d_port=stuck.port)
    res = routerdrain.drain_router(inv, inv.pd_pools["pool"], inv.instances, timeout=0.3, poll=0.05)
    assert res.timed_out and res.remaining == 4


def test_restart_router_by_name_drains_through_the_pool_and_restarts_its_unit(server) -> None:
    front, pre, dec = server(), server(), server()
    inv = _inv(front.port, 18300, p_port=pre.port, d_port=dec.port)
    fleet, t = fleet_for(inv, {})
    log: list[str] = []
    router = routers.router_instances(inv, inv.instances)["router-pool"]
    with fleet:
        [res] = run_action(
            inv, fleet, [router], "restart", drain_timeout=5, poll=0.05, health_timeout=5, gateway=Gateway(log)
        )
    assert res.ok and res.drain is not None and res.drain.drained, res
    assert log == ["down router-pool", "up router-pool"]
    assert ("h1", "systemctl restart clusterctl-router-pool.service") in [(h, c) for h, c, _ in t.commands]
    assert "/metrics" in pre.requests and "/metrics" in dec.requests and "/metrics" not in front.requests


def test_deploy_drains_a_running_router_it_restarts(monkeypatch) -> None:
    inv = _inv(8300, 18300)
    seen: list[str] = []

    def fake(inv_: Any, pool: Any, instances: Any, **kw: Any) -> Any:
        seen.append(pool.name)
        return DrainResult("router-pool", True, False, 0, 0.1, True)

    monkeypatch.setattr(routerdrain, "drain_router", fake)
    st = HostState(
        host="h1",
        instances={
            "router-pool": InstanceState(
                "router-pool",
                "",
                "d",
                {},
                True,
                "active",
                "running",
                0,
                42,
                "enabled",
                0,
                {"Instance": "router-pool", "Role": "router"},
            )
        },
    )
    hp = HostPlan("h1", [PlanItem("router-pool", "h1", "changed")])
    assert ap.drain_before(inv, hp, st, inv.instances, 5.0) == {"router-pool": "drained"}
    assert seen == ["pool"]
