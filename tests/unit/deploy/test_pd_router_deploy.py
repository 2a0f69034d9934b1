"""A prefill/decode pool's router goes out with `deploy` (a unit on its host, last in the rollout, gated
through the router) and the gateway sends the pool's model to it, never to the members."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from clusterctl.deploy.units import pdrouter
from clusterctl.deploy.rollout.engine import Deploy, DeployOptions
from clusterctl.deploy.rollout.gates import GateResult
from clusterctl.deploy.rollout.batches import parse_serial
from clusterctl.deploy.units.render import x_clusterctl
from clusterctl.fleet import Fleet
from clusterctl.fleet.transport import FakeReply, FakeTransport
from clusterctl.gateway.render import render_gateway
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Host

INV = """\
version: 1
defaults:
  ssh: {user: root}
  gpus: {count: 4, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}
hosts:
  gw01: {address: 10.0.0.2, gpus: {count: 0}}
  gpu01: {address: 10.0.0.11}
  gpu02: {address: 10.0.0.12}
engines:
  vllm-0.11: {path: /opt/vllm-0.11/bin/vllm, version: "0.11.0"}
models:
  qwen3-8b: {path: /models/qwen3-8b, served_name: qwen}
  tiny: {path: /models/tiny}
instances:
  qp1: {model: qwen3-8b, engine: vllm-0.11, placement: "gpu01:0", port: 8001, role: prefill}
  qd1: {model: qwen3-8b, engine: vllm-0.11, placement: "gpu02:0", port: 8001, role: decode}
  t1: {model: tiny, engine: vllm-0.11, placement: "gpu02:1", port: 8002}
pd_pools:
  qwen-pd:
    model: qwen3-8b
    router: {host: gw01, port: 8300}
gateway:
  hosts: gw01
  port: 8080
"""


def _inv(text: str = INV) -> Any:
    return load_inventory_text(text, "site.yaml")


def test_the_router_renders_as_a_unit_of_its_host_naming_the_placed_members() -> None:
    inv = _inv()
    [r] = pdrouter.render_routers(inv, inv.instances)
    assert (r.instance, r.host, r.port, r.model, r.model_path, r.gpus) == ("router-qwen-pd", "gw01", 8300, "", "", ())
    assert r.unit_name == "clusterctl-router-qwen-pd.service"
    assert "--prefill http://10.0.0.11:8001" in r.unit_text and "--decode http://10.0.0.12:8001" in r.unit_text
    assert "--worker-startup-check-interval 2" in r.unit_text
    x = x_clusterctl(r.unit_text)
    assert x["Role"] == "router" and x["Pool"] == "qwen-pd" and x["Members"] == "qd1,qp1"
    # a pool without a placed decode instance has no router yet
    no_decode = {n: i for n, i in inv.instances.items() if n != "qd1"}
    assert pdrouter.render_routers(inv, no_decode) == []


def test_a_member_that_moves_changes_the_routers_unit() -> None:
    inv = _inv()
    [before] = pdrouter.render_routers(inv, inv.instances)
    [again] = pdrouter.render_routers(_inv(), _inv().instances)
    assert before.digest == again.digest  # stable: a second deploy restarts nothing
    moved = _inv(INV.replace('placement: "gpu02:0", port: 8001', 'placement: "gpu02:0", port: 8009'))
    [after] = pdrouter.render_routers(moved, moved.instances)
    assert after.digest != before.digest and "--decode http://10.0.0.12:8009" in after.unit_text


def test_the_gateway_sends_the_pools_model_to_its_router_and_others_to_their_instances() -> None:
    inv = _inv()
    conf = next(f.text for f in render_gateway(inv, inv.instances).files if f.path.endswith("gateway.conf"))
    assert "server 10.0.0.2:8300" in conf and "# router-qwen-pd" in conf
    assert "10.0.0.11:8001" not in conf and "10.0.0.12:8001" not in conf  # never a member directly
    assert "10.0.0.12:8002" in conf  # the mixed model keeps its instance
    # until the pool has both roles placed, its members serve as they are
    only_prefill = {n: i for n, i in inv.instances.items() if n != "qd1"}
    conf = next(f.text for f in render_gateway(inv, only_prefill).files if f.path.endswith("gateway.conf"))
    assert "10.0.0.2:8300" not in conf and "10.0.0.11:8001" in conf


def test_router_hosts_go_last_in_the_rollout() -> None:
    inv = _inv()
    rendered = pdrouter.render_routers(inv, inv.instances)
    assert pdrouter.routers_last(["gw01", "gpu01", "gpu02"], inv, rendered) == ["gpu01", "gpu02", "gw01"]


class Cluster:
    def __init__(self) -> None:
        self.jobs: list[tuple[str, dict[str, Any]]] = []
        self.transport = FakeTransport(self.handle)

    def handle(self, host: Host, command: str, stdin: bytes | None) -> FakeReply:
        job = json.loads((stdin or b"{}").decode().splitlines()[0])
        self.jobs.append((host.name, job))
        if job["op"] == "read":
            out: dict[str, Any] = {"ok": True, "instances": {}, "lock": None, "previous": [], "models": {}}
        else:
            out = {"ok": True, "recovered": None}
        return FakeReply(0, json.dumps(out) + "\n")


class Scripted(Deploy):
    targets: list[Any] = []

    def preflight(self, fleet: Any, plan: Any) -> Any:
        return None

    def gate(self, fleet: Any, names: Sequence[str]) -> list[GateResult]:
        self.targets += [self._gate_target(n, {}) for n in names]
        return [GateResult(n, self.rendered[n].host, True, "completion", "scripted", 0.0) for n in names]


def test_deploy_writes_the_router_unit_on_its_host_in_the_last_batch_and_gates_it_through_the_router(
    tmp_path: Path,
) -> None:
    inv = _inv(INV.replace("gateway:\n  hosts: gw01\n  port: 8080\n", ""))
    cluster = Cluster()
    d = Scripted(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=cluster.transport),
        str(tmp_path),
        DeployOptions(serial=parse_serial("1")),
    )
    rep = d.run()
    assert rep.result == "ok", rep.to_dict()
    assert rep.batches == [["gpu01"], ["gpu02"], ["gw01"]]
    applied = {h: j for h, j in cluster.jobs if j["op"] == "apply"}
    [w] = applied["gw01"]["write"]
    assert (
        w["instance"] == "router-qwen-pd" and w["model_path"] == "" and applied["gw01"]["start"] == ["router-qwen-pd"]
    )
    reads = [j for h, j in cluster.jobs if j["op"] == "read"]
    assert all("" not in j.get("model_paths", []) for j in reads)
    [t] = [t for t in d.targets if t.instance == "router-qwen-pd"]
    assert (t.address, t.port, t.served_name) == ("10.0.0.2", 8300, "qwen")
