from __future__ import annotations

import pytest

from clusterctl.errors import LabError
from clusterctl.lab.config import LabConfig, plan_hosts


def test_hosts_are_named_addressed_and_given_fixed_macs():
    hosts = plan_hosts(LabConfig(), 4)
    assert [h.name for h in hosts] == ["lab01", "lab02", "lab03", "lab04"]
    assert [h.address for h in hosts] == [f"10.77.0.{100 + i}" for i in range(1, 5)]
    assert hosts[0].mac == "02:4d:00:00:00:01"
    assert (hosts[0].netns, hosts[0].veth) == ("lab01", "vlab01")
    assert plan_hosts(LabConfig(), 4) == hosts  # deterministic (stale ARP, P16)


def test_large_labs_stay_unique_and_inside_the_16():
    hosts = plan_hosts(LabConfig(net="10.78", prefix="t"), 1000)
    assert hosts[0].name == "t0001" and hosts[-1].name == "t1000"
    assert len({h.address for h in hosts}) == 1000
    assert len({h.mac for h in hosts}) == 1000
    assert all(h.address.startswith("10.78.") for h in hosts)
    assert hosts[-1].address == "10.78.4.76"  # 100 + 1000 = 4 * 256 + 76
    assert all(len(h.veth) <= 15 for h in hosts)


@pytest.mark.parametrize("count", [0, -1, 1001])
def test_host_count_out_of_range_is_refused(count):
    with pytest.raises(LabError, match="--hosts must be between 1 and 1000"):
        plan_hosts(LabConfig(), count)


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"net": "10.77.0"}, "two octets"),
        ({"net": "10.300"}, "two octets"),
        ({"prefix": "Lab"}, "lower-case"),
        ({"prefix": "toolongname"}, "lower-case"),
        ({"bridge": "a" * 16}, "bridge name"),
    ],
)
def test_bad_settings_are_explained(kw, msg):
    with pytest.raises(LabError, match=msg):
        LabConfig(**kw).validate()


def test_environment_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("CLUSTERCTL_LAB_DIR", str(tmp_path / "l"))
    monkeypatch.setenv("CLUSTERCTL_LAB_NET", "10.79")
    monkeypatch.setenv("CLUSTERCTL_LAB_PREFIX", "x")
    cfg = LabConfig.from_env()
    assert cfg.inventory_file == tmp_path / "l" / "inventory.yaml"
    assert cfg.gateway == "10.79.0.1"
    assert plan_hosts(cfg, 1)[0].name == "x01"
    monkeypatch.setenv("CLUSTERCTL_LAB_NET", "nonsense")
    with pytest.raises(LabError):
        LabConfig.from_env()
