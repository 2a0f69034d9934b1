"""A multi-node replica is drained through its head only: the gateway knows the head alone, and a headless
worker has no API server.  Deploy's drain before a change and a rollback's drain marked the worker down too,
and nothing put it back (found by the multi-node gateway lab test: ``mn-1-node1`` stayed in the gateway
state's marked-down set after a rolled-back deploy)."""

from __future__ import annotations

from typing import Any

import pytest

from clusterctl.deploy import remote
from clusterctl.deploy.rollout import apply as ap
from clusterctl.deploy.rollout import drain as dr
from clusterctl.deploy.rollout.drain import DrainResult
from clusterctl.deploy.rollout.plan import HostPlan, PlanItem
from clusterctl.deploy.rollout.rollback import drain_restored

from .test_multinode import _inv


def _state(host: str, name: str, flags: str) -> remote.HostState:
    unit = f"ExecStart=/opt/vllm serve /models/m --port 8000 --nnodes 2 {flags}\n"
    st = remote.InstanceState(
        name, unit, "d", {}, True, "active", "running", 0, 1, "enabled", 0, {"Model": "m", "Port": "8000"}
    )
    return remote.HostState(host, {name: st})


@pytest.fixture
def drained(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    got: list[str] = []

    def drain(inv: Any, inst: Any, **kw: Any) -> DrainResult:
        got.append(inst.name)
        return DrainResult(inst.name, True, False, 0, 0.0)

    monkeypatch.setattr(dr, "drain", drain)
    return got


def test_deploy_drains_the_head_and_not_the_headless_worker(drained: list[str]) -> None:
    inv = _inv()
    head = ap.drain_before(
        inv, HostPlan("gpu01", [PlanItem("big", "gpu01", "changed")]), _state("gpu01", "big", "--node-rank 0"), {}, 5
    )
    worker = ap.drain_before(
        inv,
        HostPlan("gpu02", [PlanItem("big-node1", "gpu02", "changed")]),
        _state("gpu02", "big-node1", "--node-rank 1 --headless"),
        {},
        5,
    )
    assert (head, worker, drained) == ({"big": "drained"}, {}, ["big"])


def test_a_rollback_drains_the_head_and_not_the_headless_worker(drained: list[str]) -> None:
    inv = _inv()
    got = drain_restored(inv, _state("gpu01", "big", "--node-rank 0"), ["big"], None, 5)
    got += drain_restored(inv, _state("gpu02", "big-node1", "--node-rank 1 --headless"), ["big-node1"], None, 5)
    assert [r.instance for r in got] == drained == ["big"]
