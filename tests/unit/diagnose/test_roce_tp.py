"""A critical fabric finding on a host degrades the TP groups whose NCCL
traffic crosses it, and only those."""

from __future__ import annotations

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.tp import check_tp_groups

import gpu_facts as G
import roce_facts as R

INVENTORY = (
    G.INVENTORY.replace(
        "  gpus: {count: 8, model: H100-80GB, memory_gib: 80, interconnect: nvlink}\n",
        "  gpus: {count: 8, model: H100-80GB, memory_gib: 80, interconnect: nvlink}\n"
        "  nics:\n"
        "    - {netdev: eth0, role: management}\n"
        "    - {netdev: eth2, role: data, rdma_device: mlx5_0, speed_gbps: 400}\n",
    )
    + """  across:
    model: qwen3-32b
    engine: vllm
    placement: [gpu01:4, gpu01:5, gpu02:4, gpu02:5]
    port: 8002
    args: {max-model-len: 32768, gpu-memory-utilization: 0.9}
"""
)


def facts(storm_on: str | None = None):
    out = G.healthy()
    for h, doc in out.items():
        rates = {"rx_prio3_pause": 20000, "rx_prio3_pause_duration": 900_000} if h == storm_on else None
        doc["nics"] = [R.eth0(), R.nic("eth2", rates=rates)]
    return out


def groups(f):
    ctx = G.ctx(f, inv=G.inventory(INVENTORY))
    return {x.subject: x for x in check_tp_groups(ctx)}


def test_pause_storm_on_a_host_degrades_only_the_group_that_crosses_hosts():
    assert all(g.severity == Severity.OK for g in groups(facts()).values())
    g = groups(facts(storm_on="gpu02"))
    assert g["tp-group:across"].severity == Severity.WARN
    assert g["tp-group:across"].message == "DEGRADED: member gpu02 has a warning (roce.pfc)"
    assert any("paused 90%" in e for e in g["tp-group:across"].evidence)
    assert g["tp-group:llama"].severity == Severity.OK  # on gpu02, but NVLink only
    assert g["tp-group:qwen-a"].severity == Severity.OK
