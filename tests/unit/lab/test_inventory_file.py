"""The inventory `lab up` writes is accepted by the project's own loader."""

from __future__ import annotations

from pathlib import Path

from clusterctl.inventory.loader import load_inventory
from clusterctl.lab import inventory_file
from clusterctl.lab.config import LabConfig, plan_hosts


def _write_and_load(tmp_path: Path, n: int, **kw):
    cfg = LabConfig(lab_dir=tmp_path)
    data = inventory_file.build(
        cfg, plan_hosts(cfg, n), gpus=kw.pop("gpus", 8), gpu_model=kw.pop("gpu_model", "H100-SXM5-80GB"), **kw
    )
    inventory_file.write(cfg.inventory_file, data)
    assert not list(tmp_path.glob("*.tmp"))
    return cfg, load_inventory(str(cfg.inventory_file))


def test_four_host_inventory(tmp_path):
    cfg, inv = _write_and_load(tmp_path, 4)
    assert list(inv.hosts) == ["lab01", "lab02", "lab03", "lab04"]
    assert [h.address for h in inv.hosts.values()] == [f"10.77.0.{x}" for x in range(101, 105)]
    assert inv.groups["rack1"] == ["lab01", "lab02"] and inv.groups["rack2"] == ["lab03", "lab04"]
    assert inv.hosts["lab03"].labels == {"site": "lab", "rack": "r2", "leaf": "leaf2"}
    for h in inv.hosts.values():
        assert h.ssh.identity_file == str(cfg.key_file)
        assert h.ssh.known_hosts == str(cfg.known_hosts)
        assert h.ssh.host_key_policy == "strict"
        assert (h.gpus.count, h.gpus.memory_gib) == (8, 80)
        assert h.nics[0].netdev == "eth0" and h.nics[0].role == "management"
    assert (inv.hosts["lab04"].ssh.user, inv.hosts["lab04"].ssh.become) == ("ops", True)
    assert inv.hosts["lab01"].ssh.user == "root"


def test_one_host_and_hosts_spanning_octets(tmp_path):
    _, one = _write_and_load(tmp_path, 1)
    assert list(one.hosts) == ["lab01"] and one.hosts["lab01"].ssh.user == "ops"
    _, big = _write_and_load(tmp_path, 200, gpus=0)
    assert len(big.hosts) == 200
    assert big.hosts["lab156"].address == "10.77.1.0"
    assert big.hosts["lab200"].address == "10.77.1.44"


def _desc(model="L40S", memory=45.0, link="pcie", nics=("eth2", "eth3")):
    return {
        "gpus": {
            "count": 4,
            "model": model,
            "name": "NVIDIA " + model,
            "memory_gib": memory,
            "interconnect": link,
            "uuids": [],
        },
        "nics": [
            {"netdev": n, "rdma_device": f"mlx5_{i}", "port": 1, "speed_gbps": 400.0, "mtu": 4200, "mac": "x"}
            for i, n in enumerate(nics)
        ],
    }


def test_gpus_and_data_nics_come_from_the_hardware_description(tmp_path):
    cfg = LabConfig(lab_dir=tmp_path)
    hosts = plan_hosts(cfg, 3)
    hw = {"lab01": _desc(), "lab02": _desc(), "lab03": _desc(nics=("eth2",))}
    data = inventory_file.build(cfg, hosts, gpus=8, gpu_model="ignored", hardware=hw, inbox=["lab03"])
    inventory_file.write(cfg.inventory_file, data)
    inv = load_inventory(str(cfg.inventory_file))
    h = inv.hosts["lab01"]
    assert [n.netdev for n in h.nics] == ["eth0", "eth2", "eth3"]
    assert (h.nics[1].role, h.nics[1].rdma_device, h.nics[1].speed_gbps) == ("data", "mlx5_0", 400)
    assert (h.gpus.count, h.gpus.model, h.gpus.memory_gib, h.gpus.interconnect) == (4, "L40S", 45, "pcie")
    assert [n.netdev for n in inv.hosts["lab03"].nics] == ["eth0", "eth2"]  # its own entry
    assert inv.hosts["lab03"].address == "10.77.0.103"
    assert inv.groups["inbox"] == ["lab03"]
    assert inv.hosts["lab03"].labels["nic_driver"] == "inbox"


def test_fold():
    assert inventory_file.fold(["lab01"]) == "lab01"
    assert inventory_file.fold(["lab01", "lab02", "lab03"]) == "lab[01-03]"
