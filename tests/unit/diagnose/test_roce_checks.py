"""RoCE counter checks on the shared ConnectX samples, advanced by the rates
each fault produces (research/roce.md §4.2, §7), on both driver flavours,
and how findings spread over hosts and leaves."""

from __future__ import annotations

import pytest

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import run_analyzers

import roce_facts as R

STORM = {"rx_prio3_pause": 20000, "rx_prio3_pause_duration": 900_000, "rx_prio3_pause_transition": 10000}


def bad(findings, check=None):
    return [f for f in findings if f.severity != Severity.OK and (check is None or f.check == check)]


def host_with(rates, host="gpu03", inbox=False, **kw):
    return {
        host: R.doc(
            host, [R.nic("eth2", "mlx5_0", rates=rates, inbox=inbox, **kw), R.nic("eth3", "mlx5_1", inbox=inbox)]
        )
    }


@pytest.mark.parametrize("inbox", [False, True], ids=["mlnx", "inbox"])
def test_healthy_samples_report_nothing_above_ok(inbox):
    docs = {
        f"gpu{i:02d}": R.doc(
            f"gpu{i:02d}", [R.nic("eth2", "mlx5_0", inbox=inbox), R.nic("eth3", "mlx5_1", inbox=inbox)]
        )
        for i in range(1, 9)
    }
    fs = run_analyzers(R.ctx(docs, R.inventory(8)), ["roce", "net", "host.rdma_prereqs"])
    assert fs and not bad(fs)
    assert {f.check for f in fs} >= {
        "roce.pfc",
        "roce.discards",
        "roce.congestion",
        "roce.transport",
        "roce.link",
        "roce.priority",
        "roce.qos",
        "net.data",
    }


@pytest.mark.parametrize("inbox", [False, True], ids=["mlnx", "inbox"])
def test_pause_storm_on_one_host_names_that_host_and_its_cable(inbox):
    fs = run_analyzers(R.cluster(8, host_with(STORM, inbox=inbox)), ["roce.pfc"])
    b = bad(fs)
    assert len(b) == 1
    f = b[0]
    assert (f.severity, f.host, f.subject) == (Severity.CRIT, "gpu03", "nic:eth2")
    assert "paused 90% of the time on priority 3" in f.message and "pause storm" in f.message
    assert "cable" in f.action and "other hosts under leaf1 (gpu[01-02,04]) do not show" in f.action
    assert any("rx_prio3_pause_duration +2700000 in 3.0 s" in e for e in f.evidence)


def test_moderate_pausing_is_a_warning():
    fs = run_analyzers(
        R.cluster(8, host_with({"rx_prio3_pause": 500, "rx_prio3_pause_duration": 300_000})), ["roce.pfc"]
    )
    assert [(f.host, f.severity) for f in bad(fs)] == [("gpu03", Severity.WARN)]


def test_every_host_under_one_leaf_paused_points_at_the_leaf_switch():
    special = {}
    for h in ("gpu05", "gpu06", "gpu07", "gpu08"):
        special.update(host_with(STORM, host=h))
    fs = run_analyzers(R.cluster(8, special), ["roce.pfc"])
    leaf = [f for f in bad(fs) if f.host is None]
    assert len(leaf) == 1 and leaf[0].subject == "leaf:leaf2" and leaf[0].severity == Severity.CRIT
    assert "every host under leaf2 (gpu[05-08])" in leaf[0].message
    per_host = [f for f in bad(fs) if f.host]
    assert {f.host for f in per_host} == {"gpu05", "gpu06", "gpu07", "gpu08"}
    assert all("leaf switch leaf2" in f.action for f in per_host)
    assert all(f.severity == Severity.OK for f in fs if f.host in ("gpu01", "gpu02", "gpu03", "gpu04"))


def test_tx_pause_and_the_storm_watchdog():
    warn = run_analyzers(
        R.cluster(4, host_with({"tx_prio3_pause": 100, "tx_pause_storm_warning_events": 0.4}), per_leaf=2), ["roce.pfc"]
    )
    assert [(f.severity, "long periods" in f.message) for f in bad(warn)] == [(Severity.WARN, True)]
    crit = run_analyzers(
        R.cluster(4, host_with({"tx_prio3_pause_duration": 950_000, "tx_pause_storm_error_events": 0.4}), per_leaf=2),
        ["roce.pfc"],
    )
    sevs = sorted((f.severity.name, f.message.split(":")[1][:20]) for f in bad(crit))
    assert sevs == [("CRIT", " sending pause 95% o"), ("CRIT", " the NIC's pause-sto")]


def test_global_pause_frames_on_a_pfc_fabric_warn():
    n = R.nic("eth2", rates={"rx_global_pause": 50}, first={}, second={})
    for s in n["samples"]:
        s["ethtool_stats"]["rx_global_pause"] = 1000
    n["samples"][1]["ethtool_stats"]["rx_global_pause"] = 1150
    fs = run_analyzers(R.cluster(4, {"gpu02": R.doc("gpu02", [n])}, per_leaf=2), ["roce.pfc"])
    assert [(f.host, f.severity) for f in bad(fs)] == [("gpu02", Severity.WARN)]
    assert "802.3x global pause" in bad(fs)[0].message


@pytest.mark.parametrize("inbox", [False, True], ids=["mlnx", "inbox"])
def test_discards_on_the_lossless_priority_are_critical(inbox):
    rates = {"rx_discards_phy": 100, "rx_prio3_discards": 100, "rx_prio3_buf_discard": 100}
    fs = run_analyzers(R.cluster(4, host_with(rates, host="gpu04", inbox=inbox), per_leaf=2), ["roce.discards"])
    b = bad(fs)
    assert [(f.host, f.severity) for f in b] == [("gpu04", Severity.CRIT)]
    assert "rx_prio3_discards 100/s" in b[0].message and "PFC is on for priority 3" in b[0].action
    assert ("rx_prio3_buf_discard" in b[0].message) is (not inbox)  # shared-buffer counters: mlnx only


@pytest.mark.parametrize("inbox", [False, True], ids=["mlnx", "inbox"])
def test_port_wide_discards_alone_are_a_warning_naming_lossy_traffic(inbox):
    # rx_discards_phy counts every priority of the port (mlx5 counters.rst): drops of TCP on
    # priority 0 rise there while rx_prio3_discards stays flat.
    rates = {"rx_discards_phy": 40, "rx_prio0_discards": 40}
    fs = run_analyzers(R.cluster(4, host_with(rates, host="gpu02", inbox=inbox), per_leaf=2), ["roce.discards"])
    b = bad(fs)
    assert [(f.host, f.severity) for f in b] == [("gpu02", Severity.WARN)]
    assert "rx_discards_phy counts the whole port, lossy traffic such as TCP included" in b[0].message
    assert "rx_prio3_discards" in b[0].message and "did not rise" in b[0].message


def test_drops_on_a_lossy_priority_are_not_lossless_drops():
    fs = run_analyzers(
        R.cluster(4, host_with({"rx_prio0_buf_discard": 50, "rx_prio0_discards": 50}), per_leaf=2), ["roce.discards"]
    )
    assert not bad(fs)


def test_cnp_incast_on_one_leaf_names_the_leaf():
    special = {}
    for h in ("gpu03", "gpu04"):
        special.update(
            host_with({"np_cnp_sent": 50000, "np_ecn_marked_roce_packets": 51500, "rp_cnp_handled": 47500}, host=h)
        )
    fs = run_analyzers(R.cluster(4, special, per_leaf=2), ["roce.congestion"])
    leaf = [f for f in bad(fs) if f.host is None]
    assert [f.subject for f in leaf] == ["leaf:leaf2"]
    assert {f.host for f in bad(fs) if f.host} == {"gpu03", "gpu04"}
    assert all("sending 50,000/s CNPs" in f.message for f in bad(fs) if f.host)


def test_a_cnp_outlier_below_the_speed_threshold_is_named_against_the_median():
    special = host_with({"np_cnp_sent": 4000, "np_ecn_marked_roce_packets": 4100}, host="gpu06")
    for h in ("gpu01", "gpu02"):
        special.update(host_with({"np_cnp_sent": 300, "np_ecn_marked_roce_packets": 310}, host=h))
    fs = run_analyzers(R.cluster(8, special), ["roce.congestion"])
    b = bad(fs)
    assert [(f.host, f.severity) for f in b] == [("gpu06", Severity.WARN)]
    assert "5x or more the median of the other hosts" in b[0].message


def test_ecn_marks_without_cnps_and_ignored_cnps():
    fs = run_analyzers(
        R.cluster(4, host_with({"np_ecn_marked_roce_packets": 30000, "rp_cnp_ignored": 5000}), per_leaf=2),
        ["roce.congestion"],
    )
    msgs = sorted(f.message for f in bad(fs))
    assert len(msgs) == 2
    assert "ECN-marked RoCE packets received but no CNPs sent" in msgs[0]
    assert "CNPs received and ignored" in msgs[1]


@pytest.mark.parametrize(
    "rates,sev,says",
    [
        ({"packet_seq_err": 2, "out_of_sequence": 1}, Severity.WARN, "packet loss on the RDMA path"),
        ({"packet_seq_err": 50}, Severity.CRIT, "packet loss on the RDMA path"),
        # the ACK timer expired and the request was retransmitted; the QP lives on: a warning of loss
        ({"local_ack_timeout_err": 50}, Severity.WARN, "retry limit was not reached"),
        # RNR NAK: the responder had no receive buffer posted; not loss
        ({"rnr_nak_retry_err": 5}, Severity.WARN, "Receiver Not Ready"),
        ({"req_transport_retries_exceeded": 1}, Severity.CRIT, "exhausted its retries"),
        ({"req_rnr_retries_exceeded": 1}, Severity.CRIT, "exhausted its retries"),
    ],
)
def test_transport_loss_signals(rates, sev, says):
    fs = run_analyzers(R.cluster(4, host_with(rates), per_leaf=2), ["roce.transport"])
    assert [(f.host, f.severity) for f in bad(fs)] == [("gpu03", sev)]
    assert says in bad(fs)[0].message


def test_rnr_naks_are_not_called_packet_loss():
    fs = run_analyzers(R.cluster(4, host_with({"rnr_nak_retry_err": 5}), per_leaf=2), ["roce.transport"])
    [f] = bad(fs)
    assert "not packet loss" in f.message and "packet loss on the RDMA path" not in f.message


def test_shared_sample_of_mlx5_1_with_sequence_errors_rising():
    # rdma_statistic_show.txt: mlx5_1 carries out_of_sequence 41, packet_seq_err 38,
    # local_ack_timeout_err 2; a second reading with a few more is a loss on the path.
    n = R.nic(
        "eth3",
        "mlx5_1",
        first={"out_of_sequence": 41, "packet_seq_err": 38, "local_ack_timeout_err": 2},
        second={"out_of_sequence": 47, "packet_seq_err": 44, "local_ack_timeout_err": 2},
    )
    fs = run_analyzers(R.cluster(4, {"gpu01": R.doc("gpu01", [R.nic(), n])}, per_leaf=2), ["roce.transport"])
    b = bad(fs)
    assert [(f.host, f.subject, f.severity) for f in b] == [("gpu01", "nic:eth3", Severity.WARN)]
    assert "out_of_sequence 2/s" in b[0].message


def test_link_flap_and_symbol_errors_are_critical():
    flap = R.nic(first={"link_down_events_phy": 1}, second={"link_down_events_phy": 3})
    sym = R.nic("eth3", "mlx5_1", rates={"rx_pcs_symbol_err_phy": 20})
    fs = run_analyzers(R.cluster(4, {"gpu02": R.doc("gpu02", [flap, sym])}, per_leaf=2), ["roce.link"])
    b = sorted(bad(fs), key=lambda f: f.subject)
    assert [(f.subject, f.severity) for f in b] == [("nic:eth2", Severity.CRIT), ("nic:eth3", Severity.CRIT)]
    assert "went down 2 time(s)" in b[0].message and "rx_pcs_symbol_err_phy 20/s" in b[1].message


def test_rdma_bytes_on_a_lossy_priority():
    # NCCL_IB_TC unset / trust pcp: RDMA leaves on priority 0
    rates = {"tx_prio3_bytes": 0, "tx_prio0_bytes": 2.5e9}
    fs = run_analyzers(R.cluster(4, host_with(rates), per_leaf=2), ["roce.priority"])
    b = bad(fs)
    assert [(f.host, f.severity) for f in b] == [("gpu03", Severity.CRIT)]
    assert "priority 3 carries only 0%" in b[0].message and "priority 0 carries" in b[0].message
    assert "NCCL_IB_TC" in b[0].action


def test_not_a_roce_fabric_no_roce_findings():
    ctx = R.cluster(2, host_with(STORM, host="gpu01"), per_leaf=2)
    ctx.inventory.fabric.kind = "ib"
    assert run_analyzers(ctx, ["roce"]) == []


def test_pcie_back_pressure_and_receives_without_buffers():
    fs = run_analyzers(
        R.cluster(4, host_with({"outbound_pci_stalled_wr_events": 1, "out_of_buffer": 300}), per_leaf=2),
        ["roce.rxpath"],
    )
    msgs = sorted(f.message for f in bad(fs))
    assert [f.host for f in bad(fs)] == ["gpu03", "gpu03"]
    assert "300/s RDMA receives found no posted buffer" in msgs[0]
    assert "PCIe back-pressure (outbound_pci_stalled_wr_events 1/s)" in msgs[1]


def test_pre_fec_error_outlier_names_the_cable():
    special = {}
    for i in range(1, 9):
        h = f"gpu{i:02d}"
        special.update(host_with({"rx_corrected_bits_phy": 200_000 if h == "gpu05" else 1000}, host=h))
    b = bad(run_analyzers(R.cluster(8, special), ["roce.rxpath"]))
    assert [(f.host, f.subject, f.severity) for f in b] == [("gpu05", "nic:eth2", Severity.WARN)]
    assert "pre-FEC BER 5.0e-07" in b[0].message and "cable or transceiver" in b[0].action
