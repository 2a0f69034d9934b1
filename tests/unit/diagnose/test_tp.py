"""tp.group: one bad member makes the whole TP group UNAVAILABLE, the others stay OK."""

from __future__ import annotations

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.tp import check_tp_groups

import gpu_facts as G


def groups(ctx):
    return {f.subject: f for f in check_tp_groups(ctx)}


def test_xid_79_on_one_member_makes_its_group_unavailable_only():
    facts = G.healthy()
    facts["gpu01"]["kernel_log"]["lines"] = [
        {"text": "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."}
    ]
    g = groups(G.ctx(facts))
    assert g["tp-group:qwen-a"].severity == Severity.CRIT  # gpu01:1 = 0000:2a:00
    assert g["tp-group:qwen-a"].message.startswith("UNAVAILABLE: member gpu01:1 (0000:2a:00.0) is critical (gpu.xid)")
    assert "drain instance qwen-a" in g["tp-group:qwen-a"].action and "power-cycle" in g["tp-group:qwen-a"].action
    assert g["tp-group:qwen-b"].severity == Severity.OK
    assert g["tp-group:llama"].severity == Severity.OK


def test_a_warning_member_makes_the_group_degraded():
    facts = G.healthy()
    facts["gpu02"]["gpus"]["devices"][3]["remapped_rows"]["pending"] = True
    g = groups(G.ctx(facts))
    assert g["tp-group:llama"].severity == Severity.WARN and g["tp-group:llama"].message.startswith("DEGRADED")
    assert g["tp-group:qwen-a"].severity == Severity.OK


def test_lost_gpu_and_unreachable_host():
    facts = G.healthy()
    facts["gpu01"]["gpus"]["devices"][2]["lost"] = True
    del facts["gpu02"]
    g = groups(G.ctx(facts, missing={"gpu02": "unreachable: connection refused"}))
    assert g["tp-group:qwen-b"].severity == Severity.CRIT and "gpu.lost" in g["tp-group:qwen-b"].message
    assert g["tp-group:llama"].severity == Severity.UNKNOWN
    assert g["tp-group:qwen-a"].severity == Severity.OK


def test_no_instances_no_groups():
    assert check_tp_groups(G.ctx(G.healthy(), inv=None)) == []


def test_a_recovery_action_on_a_member_makes_its_group_unavailable():
    facts = G.healthy()
    facts["gpu02"]["gpus"]["devices"][1]["recovery_action"] = "drain_p2p"
    g = groups(G.ctx(facts))
    assert g["tp-group:llama"].severity == Severity.CRIT and "gpu.recovery" in g["tp-group:llama"].message
    assert g["tp-group:qwen-a"].severity == Severity.OK


def test_a_dead_tp_worker_names_the_rank_the_gpu_and_the_group_unavailable():
    from clusterctl.diagnose.serving import check_engine

    log = G.fixture("vllm/runtime_worker_tp1_died_v0.11.0.log")
    c = G.ctx(G.healthy(), raw={"gpu01": {"qwen-a.log": log}})  # qwen-a: gpu01:[0-1], GPUs all healthy
    g = groups(c)
    assert g["tp-group:qwen-a"].severity == Severity.CRIT
    assert g["tp-group:qwen-a"].message == (
        "UNAVAILABLE: TP worker rank 1 (Worker_TP1, GPU gpu01:1 (0000:2a:00.0)) died; the group of 2 cannot serve"
    )
    assert "Worker proc Worker_TP1 died unexpectedly" in g["tp-group:qwen-a"].evidence[0]
    assert g["tp-group:qwen-b"].severity == Severity.OK
    [f] = [f for f in check_engine(c) if f.subject == "instance:qwen-a"]
    assert f.severity == Severity.CRIT
    assert f.message == (
        "TP worker rank 1 (Worker_TP1, GPU gpu01:1 (0000:2a:00.0)) died after it was serving: "
        "the TP group of 2 is UNAVAILABLE"
    )
    assert "oom.cause" not in f.action and "gpu01:1" in f.action


def test_older_worker_names_and_a_gpu_finding_that_explains_the_death():
    # vLLM 0.8-0.10 name the worker VllmWorker-N (the shared NCCL sample); a CRIT GPU finding is named first.
    log = G.fixture("vllm/runtime_engine_dead_nccl_v0.11.0.log")
    g = groups(G.ctx(G.healthy(), raw={"gpu01": {"qwen-a.log": log}}))
    assert g["tp-group:qwen-a"].message.startswith(
        "UNAVAILABLE: TP worker rank 1 (VllmWorker-1, GPU gpu01:1 (0000:2a:00.0)) died"
    )
    facts = G.healthy()
    facts["gpu01"]["gpus"]["devices"][1]["lost"] = True
    g = groups(G.ctx(facts, raw={"gpu01": {"qwen-a.log": log}}))
    assert g["tp-group:qwen-a"].message.startswith("UNAVAILABLE: member gpu01:1 (0000:2a:00.0) is critical (gpu.lost)")


def test_a_subset_is_not_a_failure_unselected_members_are_named_not_selected():
    text = (
        G.INVENTORY
        + """  wide:
    model: llama-70b
    engine: vllm
    placement: gpu01:[4-5],gpu02:[4-5]
    port: 8100
"""
    )
    facts = G.healthy()
    del facts["gpu02"]  # `doctor gpu01`: gpu02 not selected
    g = groups(G.ctx(facts, inv=G.inventory(text)))
    assert "tp-group:llama" not in g  # none of its hosts selected: nothing to say
    assert g["tp-group:wide"].severity == Severity.OK
    assert g["tp-group:wide"].message == (
        "selected members healthy (gpu01:4, gpu01:5); members on gpu02 not "
        "selected (doctor ran on a subset of the hosts)"
    )
    assert "reachable" not in g["tp-group:wide"].action
    # gpu02 selected but unreachable: that is still "could not be checked".
    g = groups(G.ctx(facts, inv=G.inventory(text), missing={"gpu02": "unreachable: connection refused"}))
    assert g["tp-group:wide"].severity == Severity.UNKNOWN and g["tp-group:llama"].severity == Severity.UNKNOWN


def test_every_gpu_row_names_the_index_and_the_pci_bus_id():
    from clusterctl.diagnose.registry import run_analyzers

    # gpu01:1 is 0000:2a:00 in the facts; the XID row already had the bus id, now the index too, and every
    # other row about one GPU names both; the subject stays gpu:1 (grouping, history).
    facts = G.healthy()
    facts["gpu01"]["kernel_log"]["lines"] = [
        {"text": "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."}
    ]
    facts["gpu01"]["gpus"]["devices"][1]["remapped_rows"]["pending"] = True
    c = G.ctx(facts)
    rows = [f for f in run_analyzers(c) if f.host == "gpu01" and f.subject.startswith("gpu:1")]
    assert rows, "no row about gpu01's GPU 1"
    for f in rows:
        assert f.subject == "gpu:1"
        assert f.message.startswith("gpu:1 (0000:2a:00.0): "), f
    assert {f.check for f in rows} >= {"gpu.xid", "gpu.remap"}
    assert groups(c)["tp-group:qwen-a"].message.startswith("UNAVAILABLE: member gpu01:1 (0000:2a:00.0) is critical")
