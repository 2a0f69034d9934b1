"""clusterctl scale and cordon on the lab: scaling up adds replicas without touching the running ones,
new replicas avoid a cordoned GPU, scaling down removes the highest-numbered replica (drained, stopped).

A template ``sc`` of TP-1 replicas of a tiny synthetic model (VLLM_SIM_TIME_SCALE=0) over every lab
host, driven through the CLI as an operator would.  Only ``clusterctl-sc-*`` units and the ``sc-tiny``
model are created, and removed at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from support.deploy_lab import remove_deployed, tiny_entry, tiny_model

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = {
    "model": "sc-tiny",
    "engine": "vllm-0.11",
    "replicas": 2,
    "tp": 1,
    "hosts": "all",
    "port_base": 8500,
    "args": {"max-model-len": 2048},
    "env": {"VLLM_SIM_TIME_SCALE": "0"},
}


class Scene:
    def __init__(self, lab: Any, root: Path, model_dir: Path) -> None:
        self.lab, self.root = lab, root
        self.inv_path, self.state_dir = root / "inventory.yaml", root / "state"
        doc = yaml.safe_load(Path(lab.inventory).read_text())
        doc["models"] = {"sc-tiny": tiny_entry(model_dir, "/models/sc-tiny", served_name="sc-tiny")}
        # Two hosts whatever the lab's size, so where a new replica goes is known.
        doc["templates"] = {"sc": {**TEMPLATE, "hosts": ",".join(lab.names[:2])}}
        doc.pop("instances", None)
        self.inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "clusterctl.cli.main",
                *args,
                "-i",
                str(self.inv_path),
                "--state-dir",
                str(self.state_dir),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )

    def units(self) -> dict[str, tuple[str, str, int, int]]:
        """sc-N -> (host, ActiveState, MainPID, ExecMainStartTimestampMonotonic)."""
        out = {}
        for host in self.lab.names:
            text = self.lab.run(
                host,
                "systemctl show -p Id,ActiveState,MainPID,ExecMainStartTimestampMonotonic 'clusterctl-sc-*.service'",
            ).stdout
            for block in text.strip().split("\n\n"):
                d = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
                if d.get("Id", "").startswith("clusterctl-sc-") and d.get("ActiveState") != "inactive":
                    out[d["Id"][len("clusterctl-") : -len(".service")]] = (
                        host,
                        d["ActiveState"],
                        int(d["MainPID"]),
                        int(d["ExecMainStartTimestampMonotonic"]),
                    )
        return out

    def placements(self) -> dict[str, tuple[str, list[int]]]:
        doc = json.loads((self.state_dir / "placements.json").read_text())
        return {n: (p["host"], p["gpus"]) for n, p in doc["templates"].get("sc", {}).items()}

    def cleanup(self) -> None:
        remove_deployed(
            self.lab,
            "clusterctl-sc-*.service",
            "/etc/clusterctl/instances/sc-*.env "
            "/var/lib/clusterctl/deploy/previous/sc-* /models/sc-tiny /models/.versions/sc-tiny",
        )


@pytest.fixture(scope="module")
def scene(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    root = tmp_path_factory.mktemp("scale")
    model_dir = tiny_model(root)
    s = Scene(lab, root, model_dir)
    s.cleanup()
    res = s.cli("deploy", "--instances", "sc-*", "--gate-timeout", "60")
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        yield s
    finally:
        s.cleanup()


def test_scale_up_adds_replicas_off_the_cordoned_gpu_and_leaves_running_ones_alone(scene: Scene) -> None:
    first, second = scene.lab.names[0], scene.lab.names[1]
    before = scene.units()
    assert sorted(before) == ["sc-1", "sc-2"] and all(u[1] == "active" for u in before.values())
    placed = scene.placements()
    assert placed == {"sc-1": (first, [0]), "sc-2": (second, [0])}

    res = scene.cli("cordon", f"{first}:1", "--reason", "lab test")
    assert res.returncode == 0, res.stderr
    try:
        plan = scene.cli("scale", "sc", "--replicas", "4", "--plan", "--json")
        assert plan.returncode == 0 and [a["replica"] for a in json.loads(plan.stdout)["added"]] == ["sc-3", "sc-4"]
        assert scene.units() == before  # --plan changes nothing

        res = scene.cli("scale", "sc", "--replicas", "4", "--gate-timeout", "60", "--json")
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert json.loads(res.stdout)["deploy"]["result"] == "ok"
        after = scene.units()
        assert {k: after[k] for k in before} == before  # same process, same start time
        assert after["sc-3"][:2] == (first, "active") and after["sc-4"][:2] == (second, "active")
        now = scene.placements()
        assert {k: now[k] for k in placed} == placed
        assert now["sc-3"] == (first, [2])  # GPU 1 is cordoned
    finally:
        assert scene.cli("uncordon", f"{first}:1").returncode == 0


def test_scale_down_removes_the_highest_numbered_replica_only(scene: Scene) -> None:
    before = scene.units()
    assert sorted(before) == ["sc-1", "sc-2", "sc-3", "sc-4"]
    res = scene.cli("scale", "sc", "--replicas", "3", "--drain-timeout", "10", "--gate-timeout", "60", "--json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["removed"] == ["sc-4"]
    drained = {k: v for h in doc["deploy"]["hosts"] for k, v in (h.get("drained") or {}).items()}
    assert drained == {"sc-4": "drained"}
    after = scene.units()
    assert sorted(after) == ["sc-1", "sc-2", "sc-3"]
    assert after == {k: v for k, v in before.items() if k != "sc-4"}
    assert sorted(scene.placements()) == ["sc-1", "sc-2", "sc-3"]
