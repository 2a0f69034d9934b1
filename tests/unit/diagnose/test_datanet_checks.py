"""Data-network checks: the inventory's data NICs against the facts."""

from __future__ import annotations

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import run_analyzers

import roce_facts as R


def bad(findings):
    return [f for f in findings if f.severity != Severity.OK]


def run(special, n=8, checks=("net.data",)):
    return run_analyzers(R.cluster(n, special, per_leaf=2 if n < 8 else 4), list(checks))


def test_gigabit_data_nic_is_for_debugging_only():
    fs = run({"gpu02": R.doc("gpu02", [R.nic("eth2", speed_mbps=1000), R.nic("eth3", "mlx5_1")])}, n=4)
    b = bad(fs)
    assert [(f.host, f.subject, f.severity) for f in b] == [("gpu02", "nic:eth2", Severity.WARN)]
    assert "gigabit is for debugging only" in b[0].message


def test_slower_than_the_inventory():
    b = bad(run({"gpu02": R.doc("gpu02", [R.nic("eth2", speed_mbps=200000), R.nic("eth3", "mlx5_1")])}, n=4))
    assert [f.message for f in b] == ["eth2: link at 200 Gb/s, the inventory says 400 Gb/s"]


def test_mtu_odd_one_out():
    b = bad(run({"gpu05": R.doc("gpu05", [R.nic("eth2", mtu=1500), R.nic("eth3", "mlx5_1", mtu=1500)])}))
    assert len(b) == 2 and all(f.severity == Severity.WARN for f in b)
    assert b[0].message == "gpu05 eth2: MTU 1500; the profile and the other 7 hosts use 4200"
    assert "`clusterctl node setup --hosts 'gpu05'` converges it" in b[0].action


def test_missing_and_down_data_nics_and_no_roce_v2_gid():
    fs = run(
        {
            "gpu01": R.doc("gpu01", [R.nic("eth2", state="DOWN")]),
            "gpu02": R.doc(
                "gpu02",
                [
                    R.nic("eth2", gids=[{"index": 0, "gid": "fe80::1", "type": "IB/RoCE v1", "netdev": "eth2"}]),
                    R.nic("eth3", "mlx5_1"),
                ],
            ),
        },
        n=4,
    )
    got = sorted((f.host, f.subject, f.severity.name, f.message.split(":")[1][:22]) for f in bad(fs))
    assert got == [
        ("gpu01", "nic:eth2", "CRIT", " link down (operstate "),
        ("gpu01", "nic:eth3", "CRIT", " the inventory's data "),
        ("gpu02", "nic:eth2", "CRIT", " no RoCE v2 GID on mlx"),
    ]


def test_a_data_nic_without_its_rdma_device():
    n = R.nic("eth3", "mlx5_1")
    n["rdma"] = None
    b = bad(run({"gpu03": R.doc("gpu03", [R.nic(), n])}, n=4))
    assert [(f.subject, f.severity) for f in b] == [("nic:eth3", Severity.CRIT)]
    assert "no RDMA device behind it" in b[0].message


def test_small_dev_shm():
    fs = run({"gpu01": R.doc("gpu01", shm_bytes=64 << 20)}, n=2, checks=("host.rdma_prereqs",))
    assert [(f.host, f.severity, f.message[:15]) for f in bad(fs)] == [("gpu01", Severity.WARN, "/dev/shm is 64 ")]


def test_no_inventory_nothing_to_compare():
    assert run_analyzers(R.ctx({"x": R.doc("x")}), ["net.data"]) == []


def _gpus(doc, nodes):
    doc["gpus"]["devices"] = [{"index": i, "numa_node": n} for i, n in enumerate(nodes)]
    return doc


def test_gpu_without_a_data_nic_on_its_numa_node():
    eth2, eth3 = R.nic("eth2"), R.nic("eth3", "mlx5_1")
    eth2["numa_node"], eth3["numa_node"] = 0, 0
    fs = run({"gpu01": _gpus(R.doc("gpu01", [eth2, eth3]), [0, 0, 1, 1])}, n=2, checks=("host.rdma_prereqs",))
    b = bad(fs)
    assert [(f.host, f.subject, f.severity) for f in b] == [
        ("gpu01", "gpu:2", Severity.WARN),
        ("gpu01", "gpu:3", Severity.WARN),
    ]
    assert "GPU 2 is on NUMA node 1, the data NICs on node(s) 0" in b[0].message
    eth3["numa_node"] = 1
    fs = run({"gpu01": _gpus(R.doc("gpu01", [eth2, eth3]), [0, 0, 1, 1])}, n=2, checks=("host.rdma_prereqs",))
    assert not bad(fs)
