"""``clusterctl report run`` on the lab: a lost GPU is new, then resolved after healing.

(A lost GPU, not an XID: healing restores the GPU state, while an XID stays in the
kernel log, as on a real host.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clusterctl.cli.main import main
from clusterctl.lab.hardware import faults


@pytest.fixture(scope="module")
def inventory(lab, tmp_path_factory) -> Path:
    """The lab inventory with one TP-2 instance on the first host (the lab's own has none)."""
    data = yaml.safe_load(Path(lab.inventory).read_text())
    data["models"] = {
        "qwen3-8b": {
            "path": "/models/qwen3-8b",
            "arch": {
                "layers": 36,
                "hidden_size": 4096,
                "attention_heads": 32,
                "kv_heads": 8,
                "head_dim": 128,
                "vocab": 151936,
                "params": 8190735360,
                "dtype": "bfloat16",
            },
        }
    }
    data["instances"] = {
        "grp-a": {
            "model": "qwen3-8b",
            "engine": next(iter(data["engines"])),
            "placement": f"{lab.names[0]}:[0-1]",
            "port": 8100,
        }
    }
    path = tmp_path_factory.mktemp("report") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def report(inventory: Path, db: Path, out: Path, capsys) -> tuple[int, dict]:
    rc = main(
        [
            "report",
            "run",
            "all",
            "-i",
            str(inventory),
            "--db",
            str(db),
            "--out",
            str(out),
            "--json",
            "--interval",
            "0",
            "--textfile",
            str(out / "clusterctl.prom"),
        ]
    )
    return rc, json.loads(capsys.readouterr().out)


def test_lost_gpu_is_new_then_resolved_after_heal(lab, inventory, tmp_path, capsys, healed_hosts):
    db, out = tmp_path / "report.db", tmp_path / "out"
    victim = lab.names[0]
    healed_hosts.append(victim)
    # XIDs that earlier tests injected stay in kern.log (as on a real node); start clean.
    for name in lab.names:
        lab.run(name, ": > /var/log/kern.log", check=True)
    faults.inject(lab.host_dir(victim), "gpu-lost", gpu=1, log=False)
    rc, doc = report(inventory, db, out, capsys)
    assert rc == 2
    assert any(
        f["check"] == "gpu.lost" and f["host"] == victim and f["subject"] == "gpu:1" for f in doc["changes"]["new"]
    )
    assert {g["instance"]: g["state"] for g in doc["tp_groups"]}["grp-a"] == "UNAVAILABLE"
    faults.heal(lab.host_dir(victim))
    rc, doc = report(inventory, db, out, capsys)
    assert any(f["check"] == "gpu.lost" and f["host"] == victim for f in doc["changes"]["resolved"]), doc["changes"]
    assert not any(f["check"] == "gpu.lost" for f in doc["changes"]["new"] + doc["changes"]["ongoing"])
    assert {g["instance"]: g["state"] for g in doc["tp_groups"]}["grp-a"] != "UNAVAILABLE"
    assert doc["run"]["previous"] == 1 and rc != 2
    assert (out / "report.html").stat().st_size > 0 and "clusterctl_report_problems" in (
        out / "clusterctl.prom"
    ).read_text()
