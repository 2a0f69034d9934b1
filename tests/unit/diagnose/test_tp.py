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
        {"text": "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."}]
    g = groups(G.ctx(facts))
    assert g["tp-group:qwen-a"].severity == Severity.CRIT                    # gpu01:1 = 0000:2a:00
    assert g["tp-group:qwen-a"].message.startswith("UNAVAILABLE: member gpu01:1 is critical (gpu.xid)")
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
