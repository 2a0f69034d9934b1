"""nccl.env on what the running units carry (facts units[].environment), the
inventory's env only where a host has no running unit."""

from __future__ import annotations

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import run_analyzers

import roce_facts as R
from test_roce_nccl import inventory, no_tclass

GOOD = "{NCCL_IB_TC: '106', NCCL_SOCKET_IFNAME: '=eth2'}"


def with_unit(doc: dict, env: dict, unit: str = "clusterctl-big.service") -> dict:
    doc["units"] = [{"unit": unit, "active_state": "active", "environment": env, "environment_files": []}]
    for n in doc["nics"]:
        if n.get("netdev") == "eth2":
            # as the collector records it: the kernel's sysfs spelling of ::ffff:10.77.1.11 / .12
            n["rdma"]["gids"] = [
                {
                    "index": 3,
                    "gid": "0000:0000:0000:0000:0000:ffff:0a4d:010b"
                    if doc["host"]["hostname"] == "gpu01"
                    else "0000:0000:0000:0000:0000:ffff:0a4d:010c",
                    "type": "RoCE v2",
                    "netdev": "eth2",
                }
            ]
    return doc


def run(docs, env=GOOD):
    return [f for f in run_analyzers(R.ctx(docs, inventory(env)), ["nccl"]) if f.severity != Severity.OK]


def docs(env1=None, env2=None, tclass2=True):
    d1 = R.doc("gpu01", [R.nic("eth2")])
    d2 = R.doc("gpu02", [R.nic("eth2")]) if tclass2 else no_tclass("gpu02")
    if env1 is not None:
        with_unit(d1, env1)
    if env2 is not None:
        with_unit(d2, env2)
    return {"gpu01": d1, "gpu02": d2}


def test_running_unit_on_the_management_nic_is_found_on_that_host():
    good = {"NCCL_IB_TC": "106", "NCCL_SOCKET_IFNAME": "=eth2", "VLLM_HOST_IP": "10.77.1.11"}
    bad = dict(good, NCCL_SOCKET_IFNAME="eth0", VLLM_HOST_IP="10.0.0.2")
    fs = run(docs(good, bad))
    assert [(f.host, f.severity, f.message) for f in fs] == [
        (
            "gpu02",
            Severity.WARN,
            "big: NCCL_SOCKET_IFNAME=eth0 in the running unit clusterctl-big.service selects the management NIC eth0",
        ),
        (
            "gpu02",
            Severity.WARN,
            "big: VLLM_HOST_IP=10.0.0.2 in the running unit clusterctl-big.service is the "
            "management address: vLLM's and NCCL's bootstrap traffic crosses the "
            "management network",
        ),
    ]
    assert "10.77.1.12" in fs[1].action


def test_running_env_beats_the_inventory():
    # the inventory is fine, the unit runs without NCCL_IB_TC on a host whose NIC has no global class
    env = {"NCCL_SOCKET_IFNAME": "=eth2"}
    fs = run(docs({"NCCL_IB_TC": "106", "NCCL_SOCKET_IFNAME": "=eth2"}, env, tclass2=False))
    assert [(f.host, f.severity) for f in fs] == [("gpu02", Severity.CRIT)]
    assert fs[0].message.startswith("big: NCCL_IB_TC unset in the running unit clusterctl-big.service; on gpu02")
    # and the other way: the inventory lacks NCCL_IB_TC, the running units set it
    fs = run(
        docs(
            {"NCCL_IB_TC": "106", "NCCL_SOCKET_IFNAME": "=eth2"},
            {"NCCL_IB_TC": "106", "NCCL_SOCKET_IFNAME": "=eth2"},
            tclass2=False,
        ),
        env="{NCCL_SOCKET_IFNAME: '=eth2'}",
    )
    assert fs == []


def test_hosts_without_a_unit_fall_back_to_the_inventory():
    fs = run(
        docs({"NCCL_IB_TC": "106", "NCCL_SOCKET_IFNAME": "=eth2"}, None, tclass2=False),
        env="{NCCL_SOCKET_IFNAME: '=eth2'}",
    )
    assert [(f.host, f.severity, "in the running unit" in f.message) for f in fs] == [("gpu02", Severity.CRIT, False)]


def test_vllm_host_ip_not_on_a_data_nic_and_withheld_values():
    fs = run(
        docs(
            {"NCCL_IB_TC": "106", "NCCL_SOCKET_IFNAME": "=eth2", "VLLM_HOST_IP": "192.168.9.9"},
            {"NCCL_IB_TC": "106", "NCCL_SOCKET_IFNAME": "=eth2", "HF_TOKEN": None},
        )
    )
    assert [(f.host, f.severity) for f in fs] == [("gpu01", Severity.WARN)]
    assert "not an address of the data NICs (10.77.1.11)" in fs[0].message


def test_a_unit_of_another_instance_is_not_this_ones():
    d = docs()
    with_unit(d["gpu02"], {"NCCL_SOCKET_IFNAME": "eth0"}, unit="clusterctl-other.service")
    assert run(d) == []
