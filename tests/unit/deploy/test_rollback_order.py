"""A rollback restores a multi-node replica's members in the replica's order (stop all, the workers, then the
head), not all at once: the node's rollback job holds the members, the control side starts them in order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from clusterctl.deploy.rollout.engine import DeployOptions
from clusterctl.deploy.rollout.gates import GateResult
from clusterctl.deploy.rollout.rollback_order import replica_members, rollback_in_order
from clusterctl.fleet import Fleet
from clusterctl.fleet.transport import FakeReply, FakeTransport
from clusterctl.inventory.model import Host
from clusterctl.node import deploy as node

from .test_multinode import SYSROOT, Scripted, _inv
from .test_node import item, root, unit  # noqa: F401  (root: the node fixture)


def test_the_node_stops_held_members_first_restores_them_and_leaves_them_stopped(root: dict[str, Any]) -> None:  # noqa: F811
    for run, flags in (("r1", "--x 1"), ("r2", "--x 2")):
        node.op_apply(
            {
                "op": "apply",
                "run_id": run,
                "write": [item("big", flags, "k", root["model"]), item("other", flags, "k", root["model"])],
                "start": ["big", "other"],
            }
        )
    root["calls"].clear()
    res = node.op_rollback(
        {
            "op": "rollback",
            "instances": ["big", "other"],
            "run_id": "r2",
            "own_run_id": "rb",
            "hold": ["big", "big-node9"],
        }
    )  # big-node9: no unit on this host
    assert res["ok"] and res["restored"] == ["big", "other"] and res["held"] == ["big"]
    assert root["calls"][0] == ("stop", "clusterctl-big.service")  # before anything is restored
    assert "--x 1" in unit(root, "big")
    verbs = {(c[0], c[-1]) for c in root["calls"]}
    assert ("restart", "clusterctl-other.service") in verbs
    assert (
        not {
            ("restart", "clusterctl-big.service"),
            ("start", "clusterctl-big.service"),
            ("stop", "clusterctl-big-node9.service"),
        }
        & verbs
    )


class Nodes:
    """Fake hosts: a rollback holds what it is told to (every held unit exists); records every job."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, dict[str, Any]]] = []
        self.transport = FakeTransport(self.handle)

    def handle(self, host: Host, command: str, stdin: bytes | None) -> FakeReply:
        job = json.loads((stdin or b"{}").decode().splitlines()[0])
        self.jobs.append((host.name, job))
        if job["op"] == "read":
            out: dict[str, Any] = {
                "ok": True,
                "instances": {},
                "lock": None,
                "previous": [],
                "models": {},
                "gids": {p: node._gids(p, SYSROOT) for p in job.get("rdma_ports", [])},
            }
        elif job["op"] == "rollback":
            out = {
                "ok": True,
                "restored": [n for n in job["instances"] if n != "one"],
                "removed": [],
                "missing": [],
                "held": job.get("hold", []),
            }
        else:
            out = {"ok": True, "recovered": None}
        return FakeReply(0, json.dumps(out) + "\n")


def test_members_are_the_names_restored_and_the_replicas_units_on_those_hosts() -> None:
    inv = _inv()
    # only the head changed on gpu01; its worker on gpu02 is rolled back with it (the batch has both hosts)
    assert replica_members({"gpu01": ["big"], "gpu02": [], "gpu03": ["one"]}, inv.instances) == {
        "gpu01": {"big": "big"},
        "gpu02": {"big-node1": "big"},
    }
    assert replica_members({"gpu03": ["one"]}, inv.instances) == {}


def test_rollback_starts_the_workers_then_the_head_after_every_host_restored() -> None:
    inv = _inv()
    nodes = Nodes()
    with Fleet(list(inv.hosts.values()), transport=nodes.transport) as fleet:
        replies, notes = rollback_in_order(
            fleet,
            {"gpu01": ["big"], "gpu02": ["big-node1"], "gpu03": ["one"]},
            inv.instances,
            own_run_id="rb",
            only_run_id="r2",
        )
    assert all(r.ok for r in replies.values())
    rollbacks = {h: j for h, j in nodes.jobs if j["op"] == "rollback"}
    assert {h: j["hold"] for h, j in rollbacks.items()} == {"gpu01": ["big"], "gpu02": ["big-node1"], "gpu03": []}
    starts = [(h, j["start"]) for h, j in nodes.jobs if j["op"] == "apply"]
    assert starts == [("gpu02", ["big-node1"]), ("gpu01", ["big"])]
    assert [j["op"] for _, j in nodes.jobs][:3] == ["rollback"] * 3  # every host restored before any start
    assert notes == [
        "replica big: rolled back with its units stopped, started the workers (big-node1 on gpu02), "
        "then the head (big on gpu01)"
    ]


class HeadFails(Scripted):
    def gate(self, fleet: Any, names: Sequence[str]) -> list[GateResult]:
        return [GateResult(n, self.rendered[n].host, n != "big", "completion", "scripted", 0.0) for n in names]


def test_a_failed_gate_rolls_the_replica_back_in_order_and_gates_only_its_head(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from clusterctl.deploy.rollout import rollback as rb

    inv = _inv()
    nodes = Nodes()
    gated: list[str] = []

    def gate_restored(inv: Any, state_dir: Any, fleet: Any, restored: Any, *a: Any) -> list[GateResult]:
        gated.extend(n for ns in restored.values() for n in ns)
        return []

    monkeypatch.setattr(rb, "gate_restored", gate_restored)
    d = HeadFails(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=nodes.transport),
        str(tmp_path),
        DeployOptions(instances="big"),
    )
    rep = d.run()
    assert rep.result != "ok"
    after = [(h, j) for h, j in nodes.jobs if j["op"] in ("rollback", "apply")]
    first = next(i for i, (_, j) in enumerate(after) if j["op"] == "rollback")
    tail = after[first:]
    assert sorted((h, j["hold"]) for h, j in tail[:2]) == [("gpu01", ["big"]), ("gpu02", ["big-node1"])]
    assert [(h, j["start"]) for h, j in tail[2:]] == [("gpu02", ["big-node1"]), ("gpu01", ["big"])]
    # the head and the worker were restarted; gate_restored itself leaves the headless worker out
    assert sorted(gated) == ["big", "big-node1"]


def test_a_restored_headless_worker_is_not_a_gate_target(tmp_path: Path) -> None:
    from clusterctl.deploy import remote
    from clusterctl.deploy.rollout.rollback import _targets

    def state(name: str, flags: str) -> remote.InstanceState:
        return remote.InstanceState(
            name,
            f"ExecStart=/opt/vllm serve /models/m --port 8000 {flags}\n",
            "d",
            {},
            True,
            "active",
            "running",
            0,
            1,
            "enabled",
            0,
            {"Model": "m", "Port": "8000"},
        )

    states = {
        "gpu01": remote.HostState("gpu01", {"big": state("big", "--nnodes 2")}),
        "gpu02": remote.HostState("gpu02", {"big-node1": state("big-node1", "--nnodes 2 --headless")}),
    }
    targets = _targets(_inv(), str(tmp_path), {"gpu01": ["big"], "gpu02": ["big-node1"]}, states)
    assert [(t.instance, t.host) for t in targets] == [("big", "gpu01")]
