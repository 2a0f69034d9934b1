from __future__ import annotations

import pytest

from clusterctl.errors import LabError
from clusterctl.lab import netfaults
from clusterctl.lab.config import LabConfig, plan_hosts


@pytest.mark.parametrize(
    "text, bps", [("100mbit", 100_000_000), ("1.5gbit", 1_500_000_000), ("64kbit", 64_000), (" 10 MBIT ", 10_000_000)]
)
def test_parse_rate(text, bps):
    assert netfaults.parse_rate(text) == bps


@pytest.mark.parametrize("text", ["fast", "100", "100mb", "0mbit", "-5mbit", "1kbit"])
def test_bad_rates_are_explained(text):
    with pytest.raises(LabError, match="rate"):
        netfaults.parse_rate(text)


def test_tbf_burst_is_20ms_of_data_with_a_floor():
    assert netfaults.tbf_burst_bytes(100_000_000) == 250_000
    assert netfaults.tbf_burst_bytes(1_000_000) == 16 * 1024


def _capture(monkeypatch):
    calls = []
    monkeypatch.setattr(netfaults, "run", lambda argv, **kw: calls.append((argv, kw.get("input"))))
    monkeypatch.setattr(netfaults, "ok", lambda argv, **kw: calls.append((argv, None)) or True)
    return calls


def test_bandwidth_shapes_both_directions_and_is_recorded(tmp_path, monkeypatch):
    cfg = LabConfig(lab_dir=tmp_path)
    h = plan_hosts(cfg, 1)[0]
    (cfg.hosts_dir / h.name).mkdir(parents=True)
    calls = _capture(monkeypatch)
    netfaults.bandwidth(cfg, h, "100mbit")
    devs = [(a[0][:4], a[0][a[0].index("dev") + 1]) for a in calls]
    assert (["tc", "qdisc", "replace", "dev"], "vlab01") in devs
    assert (["ip", "netns", "exec", "lab01"], "eth0") in devs
    assert netfaults.active(cfg, h.name) == ["bandwidth 100mbit"]
    netfaults.heal(cfg, h)
    assert netfaults.active(cfg, h.name) == []


def test_loss_rules_use_basis_points_each_way(tmp_path, monkeypatch):
    cfg = LabConfig(lab_dir=tmp_path)
    h = plan_hosts(cfg, 1)[0]
    (cfg.hosts_dir / h.name).mkdir(parents=True)
    calls = _capture(monkeypatch)
    netfaults.loss(cfg, h, 12.5)
    rules = next(i for a, i in calls if i)
    assert rules.count("numgen random mod 10000 < 1250 counter drop") == 2
    assert 'iifname "eth0"' in rules and 'oifname "eth0"' in rules
    with pytest.raises(LabError, match="percent"):
        netfaults.loss(cfg, h, 0)
    with pytest.raises(LabError, match="percent"):
        netfaults.loss(cfg, h, 101)


def test_inject_requires_its_options(tmp_path):
    cfg = LabConfig(lab_dir=tmp_path)
    h = plan_hosts(cfg, 1)[0]
    with pytest.raises(LabError, match="--rate"):
        netfaults.inject(cfg, h, "bandwidth")
    with pytest.raises(LabError, match="--percent"):
        netfaults.inject(cfg, h, "loss")
    with pytest.raises(LabError, match="unknown network fault"):
        netfaults.inject(cfg, h, "meteor")
