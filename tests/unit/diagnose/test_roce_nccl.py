"""NCCL settings of a TP group spanning hosts, from the inventory's instance
environment and the hosts' QoS facts."""

from __future__ import annotations

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import run_analyzers
from clusterctl.inventory.loader import load_inventory_text

import roce_facts as R


def inventory(env: str, placement: str = "[gpu01:0, gpu01:1, gpu02:0, gpu02:1]"):
    return load_inventory_text(
        f"""version: 1
defaults:
  gpus: {{count: 8, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}}
  nics:
    - {{netdev: eth0, role: management}}
    - {{netdev: eth2, role: data, rdma_device: mlx5_0, speed_gbps: 400}}
fabric: {{kind: roce, trust: dscp, pfc_priority: 3, roce_dscp: 26, cnp_dscp: 48, mtu: 4200}}
hosts:
  gpu[01-02]: {{address: "10.0.0.[1-2]"}}
engines:
  v11: {{path: /opt/vllm/bin/vllm, version: "0.11.0"}}
models:
  m: {{path: /models/m}}
instances:
  big:
    model: m
    engine: v11
    placement: {placement}
    port: 8000
    env: {env}
""",
        filename="nccl.yaml",
    )


def run(env: str, docs=None, placement=None):
    inv = inventory(env, placement) if placement else inventory(env)
    docs = docs or {h: R.doc(h, [R.nic("eth2")]) for h in ("gpu01", "gpu02")}
    return run_analyzers(R.ctx(docs, inv), ["nccl"])


def no_tclass(host: str, **kw):
    return R.doc(host, [R.nic("eth2", qos_section=R.qos(tclass=None, **kw))])


def test_good_settings_are_ok():
    fs = run("{NCCL_IB_TC: '106', NCCL_SOCKET_IFNAME: '=eth2', NCCL_IB_HCA: 'mlx5_0'}")
    assert [(f.severity, f.subject) for f in fs] == [(Severity.OK, "instance:big")]


def test_ib_tc_unset_is_masked_by_a_global_traffic_class_but_not_without_one():
    assert [f.severity for f in run("{NCCL_SOCKET_IFNAME: '=eth2'}")] == [Severity.OK]
    fs = run("{NCCL_SOCKET_IFNAME: '=eth2'}", {"gpu01": R.doc("gpu01", [R.nic("eth2")]), "gpu02": no_tclass("gpu02")})
    bad = [f for f in fs if f.severity != Severity.OK]
    assert [(f.host, f.severity) for f in bad] == [("gpu02", Severity.CRIT)]
    assert (
        "big: NCCL_IB_TC unset; on gpu02 eth2 has no global traffic class, so NCCL's default traffic "
        "class 0 sends RoCE with DSCP 0"
    ) in bad[0].message
    assert "NCCL_IB_TC: '106'" in bad[0].action


def test_ib_tc_on_a_dscp_that_lands_on_another_priority():
    docs = {h: no_tclass(h) for h in ("gpu01", "gpu02")}
    fs = run("{NCCL_IB_TC: '96', NCCL_SOCKET_IFNAME: '=eth2'}", docs)  # DSCP 24 -> prio 3: fine
    assert [f.severity for f in fs] == [Severity.OK]
    fs = run("{NCCL_IB_TC: '136', NCCL_SOCKET_IFNAME: '=eth2'}", docs)  # DSCP 34 -> prio 4
    assert {(f.host, f.severity) for f in fs} == {("gpu01", Severity.CRIT), ("gpu02", Severity.CRIT)}
    assert "NCCL_IB_TC=136 is DSCP 34, which lands on priority 4" in fs[0].message


def test_trust_pcp_makes_any_traffic_class_lossy():
    docs = {"gpu01": no_tclass("gpu01"), "gpu02": no_tclass("gpu02", mlnx_qos="mlnx_qos_eth2_trust_pcp.txt")}
    fs = [f for f in run("{NCCL_IB_TC: '106', NCCL_SOCKET_IFNAME: '=eth2'}", docs) if f.severity != Severity.OK]
    assert [(f.host, "lands on priority 0" in f.message) for f in fs] == [("gpu02", True)]


def test_socket_ifname_unset_or_on_the_management_nic_and_hca_list():
    fs = run("{NCCL_IB_TC: '106'}")
    assert [(f.severity, "NCCL_SOCKET_IFNAME unset" in f.message) for f in fs] == [(Severity.WARN, True)]
    fs = run("{NCCL_IB_TC: '106', NCCL_SOCKET_IFNAME: 'eth'}")
    assert [(f.severity, f.message) for f in fs] == [
        (Severity.WARN, "big: NCCL_SOCKET_IFNAME=eth selects the management NIC eth0")
    ]
    assert [f.severity for f in run("{NCCL_IB_TC: '106', NCCL_SOCKET_IFNAME: '^eth0,lo'}")] == [Severity.OK]
    fs = run("{NCCL_IB_TC: '106', NCCL_SOCKET_IFNAME: '=eth2', NCCL_IB_HCA: 'mlx5_4:1'}")
    assert [(f.severity, "selects none of the data NICs' RDMA devices (mlx5_0)" in f.message) for f in fs] == [
        (Severity.CRIT, True)
    ]


def test_single_host_instance_is_not_checked():
    assert run("{}", placement="[gpu01:0, gpu01:1]") == []
