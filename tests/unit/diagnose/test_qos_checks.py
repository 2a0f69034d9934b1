"""QoS configuration against the fabric profile and across hosts: each
misconfiguration of research/roce.md §4.3, on both driver flavours."""

from __future__ import annotations

import pytest

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import run_analyzers
from clusterctl.node import collector

import roce_facts as R


def bad(findings):
    return [f for f in findings if f.severity != Severity.OK]


def one_host(q, host="gpu07", n=8, pfc_prio=3, per_leaf=4):
    docs = {host: R.doc(host, [R.nic("eth2", "mlx5_0", qos_section=q, pfc_prio=pfc_prio), R.nic("eth3", "mlx5_1")])}
    return run_analyzers(R.cluster(n, docs, per_leaf=per_leaf), ["roce.qos"])


# ------------------------------------------------------------- parsers


def test_mlnx_qos_samples_parse_by_label():
    ok = collector.parse_mlnx_qos(R.text("mlnx_qos_eth2_ok.txt"))
    assert (ok["dcbx"], ok["trust"], ok["pfc_enabled"], ok["cable_len"]) == ("os", "dscp", [3], 7)
    assert ok["dscp2prio"]["26"] == 3 and ok["dscp2prio"]["48"] == 6 and len(ok["dscp2prio"]) == 64
    assert ok["prio2tc"] == [1, 0, 2, 3, 4, 5, 6, 7] and ok["prio2buffer"] == [0, 0, 0, 1, 0, 0, 0, 0]
    assert collector.parse_mlnx_qos(R.text("mlnx_qos_eth2_bad_pfc_prio4.txt"))["pfc_enabled"] == [4]


def test_mlnx_qos_descending_wrapped_dscp_lists_and_pcp_trust():
    m = collector.parse_mlnx_qos(R.text("mlnx_qos_eth2_dscp26_prio4.txt"))
    assert m["dscp2prio"]["26"] == 4 and m["dscp2prio"]["27"] == 3 and len(m["dscp2prio"]) == 64
    pcp = collector.parse_mlnx_qos(R.text("mlnx_qos_eth2_trust_pcp.txt"))
    assert pcp["trust"] == "pcp" and pcp["dscp2prio"] is None and pcp["pfc_enabled"] == [3]
    fw = collector.parse_mlnx_qos(R.text("mlnx_qos_eth2_dcbx_fw_lldpad.txt"))
    assert fw["dcbx"] == "firmware" and fw["lldpad_warning"] is True


def test_dcb_and_ethtool_pause_parsers():
    assert collector.parse_dcb_pfc(R.text("dcb_pfc_show_eth2.txt")) == [3]
    assert collector.parse_dcb_pfc(R.text("dcb_pfc_show_eth2_prio4.txt")) == [4]
    assert collector.parse_dcb_pfc("garbage\n") is None
    app = collector.parse_dcb_app_dscp(R.text("dcb_app_show_N_eth2.txt"))
    assert app["26"] == 3 and app["48"] == 6
    assert collector.parse_dcb_apptrust("order: dscp pcp \n") == "dscp"
    assert collector.parse_ethtool_pause(R.text("ethtool_a_eth2_on.txt")) == {"autoneg": False, "rx": True, "tx": True}


# ------------------------------------------------------------- analyzer


@pytest.mark.parametrize("inbox", [False, True], ids=["mlnx", "inbox"])
def test_pfc_on_the_wrong_priority_names_the_odd_one_out(inbox):
    q = R.qos(mlnx_qos="mlnx_qos_eth2_bad_pfc_prio4.txt", dcb_pfc="dcb_pfc_show_eth2_prio4.txt", inbox=inbox)
    docs = {
        f"gpu{i:02d}": R.doc(f"gpu{i:02d}", [R.nic("eth2", inbox=inbox), R.nic("eth3", "mlx5_1", inbox=inbox)])
        for i in range(1, 9)
    }
    docs["gpu07"] = R.doc(
        "gpu07", [R.nic("eth2", qos_section=q, pfc_prio=4, inbox=inbox), R.nic("eth3", "mlx5_1", inbox=inbox)]
    )
    b = bad(run_analyzers(R.ctx(docs, R.inventory(8)), ["roce.qos"]))
    assert len(b) == 1
    f = b[0]
    assert (f.severity, f.host, f.subject) == (Severity.CRIT, "gpu07", "nic:eth2")
    assert f.message == "gpu07 eth2: PFC on priority 4; the profile and the other 7 hosts use 3"
    assert "priority 3" in f.action


def test_pfc_readout_from_the_counters_when_no_tool_answers():
    q = R.qos()
    q.update(
        tool=None,
        trust=None,
        pfc_enabled=None,
        dscp2prio=None,
        reasons={"mlnx_qos -i eth2": "mlnx_qos not installed", "dcb pfc show dev eth2": "dcb not installed"},
    )
    b = bad(one_host(q, pfc_prio=4))
    assert [(f.host, f.severity) for f in b] == [("gpu07", Severity.CRIT)]
    assert "PFC on priority 4" in b[0].message


def test_no_tool_and_no_counters_is_unknown():
    q = R.qos()
    q.update(tool=None, trust=None, pfc_enabled=None, dscp2prio=None, reasons={"mlnx_qos -i eth2": "not installed"})
    n = R.nic("eth2", qos_section=q)
    n["ethtool_stats"] = None
    fs = run_analyzers(R.cluster(2, {"gpu01": R.doc("gpu01", [n])}, per_leaf=2), ["roce.qos"])
    b = bad(fs)
    assert [(f.host, f.severity) for f in b] == [("gpu01", Severity.UNKNOWN)]
    assert "neither mlnx_qos nor dcb answered" in b[0].message


def test_trust_pcp_on_one_host():
    b = bad(one_host(R.qos(mlnx_qos="mlnx_qos_eth2_trust_pcp.txt"), host="gpu02", n=4, per_leaf=2))
    assert [f.message for f in b] == ["gpu02 eth2: trust pcp; the profile and the other 3 hosts use dscp"]
    assert b[0].severity == Severity.CRIT and "priority 0" in b[0].action


def test_trust_pcp_inbox_inferred_from_an_empty_app_table():
    q = R.qos(inbox=True, dcb_app=None)
    assert q["trust"] == "pcp"
    b = bad(one_host(q, host="gpu03", n=4, per_leaf=2))
    assert [(f.host, f.severity, "trust pcp" in f.message) for f in b] == [("gpu03", Severity.CRIT, True)]


def test_roce_dscp_mapped_to_another_priority():
    b = bad(one_host(R.qos(mlnx_qos="mlnx_qos_eth2_dscp26_prio4.txt")))
    assert [f.message for f in b] == [
        "gpu07 eth2: DSCP 26 (RoCE) maps to priority 4; the profile and the other 7 hosts use 3"
    ]
    assert b[0].severity == Severity.CRIT


def test_traffic_class_overriding_qps_with_dscp_0_and_unset_traffic_class():
    b = bad(one_host(R.qos(tclass=0)))
    assert [(f.severity, f.message) for f in b] == [
        (
            Severity.CRIT,
            "gpu07 eth2: RoCE traffic class 0 (DSCP 0) overrides every QP; the profile and the other 7 hosts use 106",
        )
    ]
    unset = bad(one_host(R.qos(tclass=None)))
    assert [(f.severity, "no global RoCE traffic class set" in f.message) for f in unset] == [(Severity.WARN, True)]


def test_ecn_disabled_on_the_roce_priority():
    ecn = {
        "roce_np": {str(p): 0 for p in range(8)},
        "roce_rp": {str(p): int(p == 3) for p in range(8)},
        "cnp_dscp": 48,
        "cnp_802p_prio": 6,
    }
    b = bad(one_host(R.qos(ecn=ecn)))
    assert [(f.severity, f.message) for f in b] == [
        (Severity.WARN, "gpu07 eth2: ECN notification point off on priority 3; the other 7 hosts use priority 3")
    ]


def test_global_pause_and_firmware_dcbx():
    b = bad(one_host(R.qos(pause="ethtool_a_eth2_on.txt", mlnx_qos="mlnx_qos_eth2_dcbx_fw_lldpad.txt")))
    msgs = sorted(f.message for f in b)
    assert msgs == [
        "gpu07 eth2: 802.3x global pause is on; the profile and the other 7 hosts use off",
        "gpu07 eth2: DCBX is firmware controlled; the profile and the other 7 hosts use os",
    ]
    assert all(f.severity == Severity.WARN for f in b)


def test_the_whole_cluster_off_profile_says_so():
    q = R.qos(mlnx_qos="mlnx_qos_eth2_bad_pfc_prio4.txt")
    docs = {f"gpu{i:02d}": R.doc(f"gpu{i:02d}", [R.nic("eth2", qos_section=q, pfc_prio=4)]) for i in range(1, 5)}
    b = bad(run_analyzers(R.ctx(docs, R.inventory(4, 2)), ["roce.qos"]))
    assert len(b) == 4
    assert b[0].message == "gpu01 eth2: PFC on priority 4; the other 3 hosts use 4 too (the profile says 3)"


def test_drift_without_a_profile_value_names_the_minority_host():
    n = R.nic("eth2")
    n["rdma"]["fw_ver"] = "28.39.1002"
    docs = {f"gpu{i:02d}": R.doc(f"gpu{i:02d}", [dict(n, rdma=dict(n["rdma"]))]) for i in range(1, 5)}
    old = dict(n, rdma=dict(n["rdma"], fw_ver="28.36.1010"))
    docs["gpu03"] = R.doc("gpu03", [old])
    cx6 = dict(n, rdma=dict(n["rdma"], fw_ver="22.36.1010"))  # another device family: not compared
    docs["gpu04"] = R.doc("gpu04", [cx6])
    b = bad(run_analyzers(R.ctx(docs, R.inventory(4, 2)), ["roce.qos"]))
    assert [(f.host, f.severity, f.message) for f in b] == [
        ("gpu03", Severity.WARN, "gpu03 eth2: NIC firmware 28.36.1010; the other 2 hosts use 28.39.1002")
    ]


def test_a_whole_leaf_with_the_same_wrong_setting_is_one_finding_pointing_at_the_switch():
    q = R.qos(mlnx_qos="mlnx_qos_eth2_bad_pfc_prio4.txt", dcb_pfc="dcb_pfc_show_eth2_prio4.txt")
    docs = {f"gpu{i:02d}": R.doc(f"gpu{i:02d}", [R.nic("eth2")]) for i in range(1, 9)}
    for i in range(5, 9):  # leaf2: gpu05-gpu08, all on priority 4
        docs[f"gpu{i:02d}"] = R.doc(f"gpu{i:02d}", [R.nic("eth2", qos_section=q, pfc_prio=4)])
    found = run_analyzers(R.ctx(docs, R.inventory(8, 4)), ["roce.qos"])
    [leaf] = bad(found)
    assert (leaf.severity, leaf.host, leaf.subject) == (Severity.CRIT, None, "leaf:leaf2")
    assert leaf.message == (
        "every host under leaf leaf2 (gpu[05-08]): PFC on priority 4; the profile says 3; "
        "gpu[01-04] under other leaves do not"
    )
    assert leaf.action.startswith("look at the leaf switch leaf2") and "mlnx_qos -i eth2 --pfc" in leaf.action
    assert leaf.action.endswith(
        "`clusterctl net apply --hosts 'gpu[05-08]'` sets the inventory's profile (--plan first shows the changes)"
    )
    assert len(leaf.evidence) == 4 and leaf.evidence[0].startswith("gpu05 eth2: pfc = 4")
    assert {f.host for f in found if f.severity == Severity.OK} == {f"gpu{i:02d}" for i in range(1, 5)}
    # Three of the leaf's four: no rollup, each host named.
    docs["gpu08"] = R.doc("gpu08", [R.nic("eth2")])
    b = bad(run_analyzers(R.ctx(docs, R.inventory(8, 4)), ["roce.qos"]))
    assert sorted(f.host for f in b) == ["gpu05", "gpu06", "gpu07"]
    assert all(f"`clusterctl net apply --hosts '{f.host}'`" in f.action for f in b)


def test_drift_without_a_profile_value_names_no_fixing_command():
    """net apply sets the profile; firmware or cable length drift is not its to fix."""
    q = R.qos()
    q["cable_len"] = 12
    docs = {f"gpu{i:02d}": R.doc(f"gpu{i:02d}") for i in range(1, 9)}
    for d in docs.values():
        for n in d["nics"][1:]:
            n["qos"]["cable_len"] = 7
    docs["gpu03"] = R.doc("gpu03", [R.nic("eth2", qos_section=q), R.nic("eth3", "mlx5_1")])
    docs["gpu03"]["nics"][2]["qos"]["cable_len"] = 7
    [f] = bad(run_analyzers(R.ctx(docs, R.inventory(8, 4)), ["roce.qos"]))
    assert "cable length" in f.message and "net apply" not in f.action


def test_rdma_cm_default_tos_off_the_roce_dscp_is_a_warning_naming_net_apply():
    q = R.qos()
    q["cm_tos"] = 0  # the kernel's default: RDMA-CM connections on DSCP 0, priority 0 (no PFC)
    b = bad(one_host(q))
    assert [(f.severity, f.host) for f in b] == [(Severity.WARN, "gpu07")]
    assert b[0].message.startswith("gpu07 eth2: RDMA-CM default ToS 0 (DSCP 0)")
    assert "cma_roce_tos -d mlx5_0 -t 106" in b[0].action
    assert "clusterctl net apply --hosts 'gpu07'" in b[0].action
    q["cm_tos"] = 104  # DSCP 26 without the ECN bits: the NIC sets ECN itself, the DSCP is right
    assert bad(one_host(q)) == []
