"""tp.group across hosts: a ``nodes: 2`` template's replica with one lost GPU on its worker's host is
UNAVAILABLE as a whole (what the gateway's sync and failover act on); its head's GPUs being fine changes
nothing."""

from __future__ import annotations

from dataclasses import replace

from clusterctl.deploy.placement.place import desired_instances
from clusterctl.deploy.state import DeployState
from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.tp import check_tp_groups
from clusterctl.gateway.sync import tp_unavailable

import gpu_facts as G

TEMPLATE = """\
templates:
  big:
    model: llama-70b
    engine: vllm
    replicas: 1
    tp: 4
    nodes: 2
    hosts: gpu[01-02]
    port_base: 9000
"""


def test_a_lost_gpu_on_the_worker_stage_makes_the_whole_replica_unavailable() -> None:
    text = G.INVENTORY.split("instances:")[0].replace("version: 0.11.0", 'version: "0.33.0"') + TEMPLATE
    inv = G.inventory(text)
    res = desired_instances(inv, DeployState())
    inv = replace(inv, instances=dict(res.instances))  # as doctor, status and failover see it
    assert [g.host for g in inv.instances["big-1"].placement] == ["gpu01"] * 4 + ["gpu02"] * 4
    healthy = {f.subject: f for f in check_tp_groups(G.ctx(G.healthy(), inv=inv))}
    assert (
        healthy["tp-group:big-1"].severity == Severity.OK and "all 8 member GPUs" in healthy["tp-group:big-1"].message
    )
    facts = G.healthy()
    facts["gpu02"]["gpus"]["devices"][2]["lost"] = True
    found = check_tp_groups(G.ctx(facts, inv=inv))
    f = {x.subject: x for x in found}["tp-group:big-1"]
    assert f.severity == Severity.CRIT and f.message.startswith("UNAVAILABLE: member gpu02:2")
    assert "the group of 8 cannot serve" in f.message
    assert tp_unavailable(found) == {"big-1"}
