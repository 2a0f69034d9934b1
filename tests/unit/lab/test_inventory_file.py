"""The inventory `lab up` writes is accepted by the project's own loader."""

from __future__ import annotations

from pathlib import Path

from clusterctl.inventory.loader import load_inventory
from clusterctl.lab import inventory_file
from clusterctl.lab.config import LabConfig, plan_hosts


def _write_and_load(tmp_path: Path, n: int, **kw):
    cfg = LabConfig(lab_dir=tmp_path)
    data = inventory_file.build(cfg, plan_hosts(cfg, n), gpus=kw.pop("gpus", 8),
                                gpu_model=kw.pop("gpu_model", "H100-SXM5-80GB"), **kw)
    inventory_file.write(cfg.inventory_file, data)
    assert not list(tmp_path.glob("*.tmp"))
    return cfg, load_inventory(str(cfg.inventory_file))


def test_four_host_inventory(tmp_path):
    cfg, inv = _write_and_load(tmp_path, 4)
    assert list(inv.hosts) == ["lab01", "lab02", "lab03", "lab04"]
    assert [h.address for h in inv.hosts.values()] == [f"10.77.0.{x}" for x in range(101, 105)]
    assert inv.groups["rack1"] == ["lab01", "lab02"] and inv.groups["rack2"] == ["lab03", "lab04"]
    assert inv.hosts["lab03"].labels == {"site": "lab", "rack": "r2", "leaf": "leaf1"}
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


def test_data_nics_from_the_hardware_part_are_listed(tmp_path):
    nics = [{"netdev": "eth2", "role": "data", "rdma_device": "mlx5_0", "port": 1,
             "speed_gbps": 400}]
    _, inv = _write_and_load(tmp_path, 2, data_nics=nics, gpu_model="L40S-48GB")
    h = inv.hosts["lab01"]
    assert [n.netdev for n in h.nics] == ["eth0", "eth2"]
    assert h.nics[1].rdma_device == "mlx5_0"
    assert (h.gpus.memory_gib, h.gpus.interconnect) == (48, "pcie")


def test_fold():
    assert inventory_file.fold(["lab01"]) == "lab01"
    assert inventory_file.fold(["lab01", "lab02", "lab03"]) == "lab[01-03]"
