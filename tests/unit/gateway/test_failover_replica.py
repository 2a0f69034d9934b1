"""Failover of a replica across hosts (a ``nodes: 2`` template): one lost GPU on any stage makes the whole
group UNAVAILABLE, and failover moves the WHOLE replica: every unit stopped, placed again on N healthy hosts,
rolled out, gated at the head, the gateway switched."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from clusterctl.deploy.rollout import engine, lifecycle
from clusterctl.deploy.rollout.gates import GateResult
from clusterctl.deploy.placement.place import desired_instances
from clusterctl.deploy.rollout.plan import Plan
from clusterctl.deploy.state import StateStore
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.gateway import failover, observe, sync
from clusterctl.gateway import state as gwstate
from clusterctl.gateway.failover import Detection, FailoverOptions, run_failover
from clusterctl.gateway.failover_plan import plan_failover
from clusterctl.gateway.sync import Observed
from clusterctl.inventory.loader import load_inventory_text

from .test_failover_run import Recorder

INVENTORY = """\
version: 1
defaults:
  ssh: {use_ssh_config: false}
  gpus: {count: 2, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}
hosts:
  gw01: {address: 10.0.0.1, gpus: {count: 0}}
  gpu[01-06]: {address: '10.0.1.[1-6]'}
engines:
  vllm: {path: /opt/vllm/bin/vllm, version: 0.33.0}
models:
  qwen: {path: /models/qwen3-8b}
templates:
  big: {model: qwen, engine: vllm, replicas: 2, tp: 2, nodes: 2, hosts: 'gpu[01-06]', port_base: 8001}
gateway:
  hosts: gw01
  port: 8080
"""


def _lost(host: str, gpu: int) -> Finding:
    return Finding(
        "gpu.lost",
        Severity.CRIT,
        host,
        f"gpu:{gpu}",
        "GPU has fallen off the bus",
        "drain the node, then power-cycle it",
    )


@pytest.fixture
def placed(tmp_path: Path) -> Any:
    inv = load_inventory_text(INVENTORY, "inv.yaml")
    store = StateStore(tmp_path / "state")
    store.save_placements(desired_instances(inv, store.load()).state.placements)
    return inv, store


def test_a_lost_gpu_on_a_worker_stage_moves_the_whole_replica_to_two_healthy_hosts(placed: Any) -> None:
    inv, store = placed
    state = store.load()
    old = state.placements["big"]["big-1"]
    assert len(old.stages) == 2
    worker_host, worker_gpus = old.workers[0]
    instances = desired_instances(inv, state).instances
    plan = plan_failover(
        instances,
        {"big-1": "UNAVAILABLE"},
        state,
        inv,
        max_share=0.5,
        gpu_findings=[_lost(worker_host, worker_gpus[0])],
    )
    assert worker_host in plan.cordons  # node-level: the worker's whole host
    [move] = plan.moves
    assert move.instance == "big-1" and move.old == old
    assert len(move.new.stages) == 2 and worker_host not in move.new.hosts
    # never back onto a GPU it left, and not onto the other replica's GPUs
    left = {(h, g) for h, gs in old.stages for g in gs}
    other = {(h, g) for h, gs in state.placements["big"]["big-2"].stages for g in gs}
    now = {(h, g) for h, gs in move.new.stages for g in gs}
    assert len(now) == 4 and not now & left and not now & other
    j = move.to_json()
    assert j["from"]["workers"] == [{"host": worker_host, "gpus": list(worker_gpus)}]
    assert [w["host"] for w in j["to"]["workers"]] == list(move.new.hosts[1:])


def test_an_explicit_instance_across_hosts_is_marked_down_not_moved_and_the_plan_says_why(tmp_path: Path) -> None:
    # the inventory says where it runs: a move would be undone by the next deploy; the plan names the failed
    # member and the two ways out (a new placement there, or a `nodes: 2` template failover can move)
    text = INVENTORY.replace(
        "templates:\n",
        "instances:\n  wide: {model: qwen, engine: vllm, placement: [gpu05:0, gpu06:0], port: 9001}\ntemplates:\n",
    )
    inv = load_inventory_text(text, "inv.yaml")
    store = StateStore(tmp_path / "state")
    state = store.load()
    instances = desired_instances(inv, state).instances
    plan = plan_failover(
        instances, {"wide": "UNAVAILABLE"}, state, inv, max_share=1.0, gpu_findings=[_lost("gpu06", 0)]
    )
    assert plan.fixed == ["wide"] and not plan.moves and plan.taken_out == ["wide"]
    why = plan.to_json()["fixed_why"]["wide"]
    assert why.startswith("explicit placement in the inventory (inv.yaml): gpu05 GPUs 0 + gpu06 GPUs 0; failed: gpu06;")
    assert "`clusterctl deploy --instances wide`" in why and why.endswith(
        "or make it a template replica (`nodes: 2`: one stage per host), which failover moves"
    )
    assert "gpu06" in plan.cordons  # node-level (a lost GPU): its host is cordoned as for any group


class ReplicaRecorder(Recorder):
    """Reports every host of the moved replica applied (or its worker's host failed), with the head's gate."""

    def __init__(self, state_dir: Path, fail_worker: bool) -> None:
        super().__init__(state_dir)
        self.fail_worker = fail_worker
        self.deployed_hosts: list[str] = []

    def stop(self, inv: Any, fleet: Any, instances: Any, **kw: Any) -> list[Any]:
        self.steps += [f"stop {i.name} on {'+'.join(dict.fromkeys(g.host for g in i.placement))}" for i in instances]
        return [lifecycle.ActionResult(i.name, i.placement[0].host, "stop", ok=True) for i in instances]

    def deploy(
        self, inv: Any, hosts: Any, make_fleet: Any, state_dir: str, opts: Any, on_event: Any = None, **kw: Any
    ) -> Any:
        rec = self
        rec.deployed_hosts = [h.name for h in hosts]

        class FakeDeploy:
            def run(self) -> engine.DeployReport:
                rec.steps.append(f"deploy {opts.instances}")
                p = StateStore(state_dir).load().placements["big"]["big-1"]
                rep = engine.DeployReport("r1", Plan([]), "ok")
                for n, h in enumerate(p.hosts):
                    rep.hosts[h] = engine.HostOutcome(h, "failed" if n and rec.fail_worker else "applied", 1)
                rep.hosts[p.host].gates.append(GateResult("big-1", p.host, True, "completion", "", 0.1))
                return rep

        return FakeDeploy()


@pytest.mark.parametrize("fail_worker", [False, True])
def test_failover_stops_every_member_rolls_out_all_hosts_and_needs_each_applied(
    placed: Any, monkeypatch: pytest.MonkeyPatch, fail_worker: bool
) -> None:
    inv, store = placed
    old = store.load().placements["big"]["big-1"]
    worker_host, worker_gpus = old.workers[0]
    monkeypatch.setattr(
        failover,
        "detect",
        lambda *a, **k: Detection({"big-1": "UNAVAILABLE: member lost"}, [_lost(worker_host, worker_gpus[0])], {}),
    )
    rec = ReplicaRecorder(store.directory, fail_worker)
    monkeypatch.setattr(failover, "_hook", lambda *a: rec)
    monkeypatch.setattr(lifecycle, "stop_instances", rec.stop)
    monkeypatch.setattr(engine, "Deploy", rec.deploy)
    monkeypatch.setattr(
        observe, "observe", lambda inv, instances, *a, **k: ({n: Observed("serving", 0.2) for n in instances}, set())
    )
    monkeypatch.setattr(sync, "sync_gateway", rec.sync_gateway)
    rep = run_failover(inv, store.directory, lambda hs: contextlib.nullcontext(), FailoverOptions(max_share=0.5))
    new = store.load().placements["big"]["big-1"]
    assert len(new.stages) == 2 and worker_host not in new.hosts
    assert rec.steps == ["mark_down big-1", f"stop big-1 on {'+'.join(old.hosts)}", "deploy big-1", "sync"]
    # the deploy reaches the old hosts (to remove the units there) and every new one
    assert set(old.hosts) | set(new.hosts) <= set(rec.deployed_hosts)
    if fail_worker:
        assert rep.exit_code == 2 and rep.moved["big-1"] == f"{new.hosts[1]}: failed"
        assert "big-1" in gwstate.load(store.directory).marked_down and rec.synced["big-1"].down
    else:
        assert rep.exit_code == 0 and rep.moved == {"big-1": None}
        assert "big-1" not in gwstate.load(store.directory).marked_down and not rec.synced["big-1"].down
