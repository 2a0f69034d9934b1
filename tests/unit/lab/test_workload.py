"""`clusterctl lab workload`: the lab inventory plus a model, a template and a gateway that load."""

from __future__ import annotations

from pathlib import Path

import yaml

from clusterctl.cli.main import main
from clusterctl.inventory.loader import load_inventory
from clusterctl.lab.config import LabConfig, plan_hosts
from clusterctl.lab import inventory_file, workload


def _lab(tmp_path: Path, monkeypatch) -> LabConfig:
    for var in ("CLUSTERCTL_LAB_BRIDGE", "CLUSTERCTL_LAB_NET", "CLUSTERCTL_LAB_PREFIX", "CLUSTERCTL_LAB_HOSTS"):
        monkeypatch.delenv(var, raising=False)  # the default lab's names, whatever this shell's lab is
    monkeypatch.setenv("CLUSTERCTL_LAB_DIR", str(tmp_path / "lab"))
    cfg = LabConfig.from_env()
    cfg.lab_dir.mkdir(parents=True)
    data = inventory_file.build(cfg, plan_hosts(cfg, 4), gpus=8, gpu_model="H100-SXM5-80GB")
    inventory_file.write(cfg.inventory_file, data)
    return cfg


def test_the_workload_inventory_loads_and_places_every_replica(tmp_path, monkeypatch, capsys) -> None:
    cfg = _lab(tmp_path, monkeypatch)
    out = tmp_path / "w.yaml"
    assert (
        main(["lab", "workload", "-o", str(out), "--replicas", "6", "--gateway", "lab02", "--time-scale", "0.1"]) == 0
    )
    inv = load_inventory(str(out))
    assert list(inv.hosts) == ["lab01", "lab02", "lab03", "lab04"]
    t = inv.templates["pool"]
    assert (t.replicas, t.tp, t.model, t.env["VLLM_SIM_TIME_SCALE"]) == (6, 1, "tiny", "0.1")
    assert inv.models["tiny"].source == str(cfg.lab_dir / "models" / "tiny")
    assert (cfg.lab_dir / "models" / "tiny" / "config.json").is_file()
    assert inv.models["tiny"].arch.layers == 2 and inv.models["tiny"].arch.params > 0
    gw = yaml.safe_load(out.read_text())["gateway"]
    assert gw["hosts"] == "lab02" and "lab02" in capsys.readouterr().out


def test_without_a_lab_it_says_to_bring_one_up(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("CLUSTERCTL_LAB_DIR", str(tmp_path / "none"))
    assert main(["lab", "workload"]) == 3
    assert "run 'clusterctl lab up' first" in " ".join(capsys.readouterr().err.split())


def test_the_default_gateway_is_the_first_host(tmp_path) -> None:
    doc = workload.add_workload(
        {"hosts": {"lab[01-04]": {}}},
        tmp_path,
        replicas=2,
        gateway_host=workload._first_host({"hosts": {"lab[01-04]": {}}}),
        time_scale=0,
    )
    assert doc["gateway"]["hosts"] == "lab01" and doc["templates"]["pool"]["env"]["VLLM_SIM_TIME_SCALE"] == "0"
