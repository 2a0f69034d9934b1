"""clusterctl deploy --playbook on a 2-host lab with the simulator (VLLM_SIM_TIME_SCALE=0).

One instance per host.  The tests run in file order and share the module's
deployment: the shipped default playbook brings it up; the shipped
rolling-engine-upgrade playbook (an exec step, custom gates) moves both to
vLLM 0.33 one host at a time; a playbook whose exec step fails changes
nothing; a custom gate that cannot pass stops the rollout at the canary and
rolls it back, and the other host, whose unit a ``units`` step had already
written, gets its file back without a restart.  The fixture removes every
unit, env file, previous copy, lock and staged model it created.
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

KEY = "pb-secret-91c2e0d4"
KEY_ENV = "CLUSTERCTL_TEST_PLAYBOOK_KEY"
REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"


class World:
    def __init__(self, lab: Any, root: Path, model_dir: Path):
        self.lab, self.root, self.model_dir = lab, root, model_dir
        self.inv_path = root / "inventory.yaml"
        self.state_dir = root / "state"
        self.base = yaml.safe_load(Path(lab.inventory).read_text())
        self.hosts = list(lab.names)[:2]

    def write(self, engine: str = "vllm-0.11", max_len: int = 2048) -> None:
        doc = dict(self.base)
        doc["models"] = {"tiny": tiny_entry(self.model_dir, "/models/pb-tiny")}
        doc["instances"] = {
            f"p{n}": {
                "model": "tiny",
                "engine": engine,
                "placement": f"{h}:6",
                "port": 8400,
                "args": {"max-model-len": max_len},
                "env": {"VLLM_SIM_TIME_SCALE": "0"},
                "secrets": {"VLLM_API_KEY": {"env": KEY_ENV}},
            }
            for n, h in enumerate(self.hosts, 1)
        }
        self.inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def playbook(self, path: Path | str, *args: str) -> tuple[int, dict[str, Any], str]:
        env = {**os.environ, KEY_ENV: KEY, "PYTHONPATH": str(REPO)}
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "clusterctl.cli.main",
                "deploy",
                "--playbook",
                str(path),
                "-i",
                str(self.inv_path),
                "--state-dir",
                str(self.state_dir),
                "--json",
                "--gate-timeout",
                "60",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert KEY not in p.stdout + p.stderr
        try:
            data = json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"rc {p.returncode}: {p.stdout[-2000:]} {p.stderr[-3000:]}") from None
        return p.returncode, data, p.stderr

    def unit(self, host: str, name: str) -> tuple[str, int, str]:
        """(ActiveState, MainPID, unit file text) of instance ``name`` on ``host``."""
        show = self.lab.run(host, f"systemctl show -p ActiveState,MainPID clusterctl-{name}.service", check=True).stdout
        d = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
        text = self.lab.run(host, f"cat /etc/systemd/system/clusterctl-{name}.service").stdout
        return d["ActiveState"], int(d["MainPID"]), text

    def cleanup(self) -> None:
        remove_deployed(
            self.lab,
            "clusterctl-*.service",
            "/etc/clusterctl/instances /var/lib/clusterctl/deploy "
            "/var/lib/clusterctl/deploy.lock /models/pb-tiny /models/.versions/pb-tiny",
            hosts=self.hosts,
        )


def outcomes(data: dict[str, Any]) -> dict[str, str]:
    return {o["name"]: o["status"] for o in data["outcomes"]}


@pytest.fixture(scope="module")
def world(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("playbook")
    model_dir = tiny_model(root)
    w = World(lab, root, model_dir)
    w.cleanup()
    try:
        yield w
    finally:
        w.cleanup()


def test_default_playbook_brings_the_instances_up(world: World) -> None:
    world.write()
    rc, data, err = world.playbook(PLAYBOOKS / "default.yaml")
    assert rc == 0 and data["result"] == "ok", (data, err[-3000:])
    assert outcomes(data) == {
        "pre-flight": "ok",
        "stage": "ok",
        "units": "ok",
        "canary": "ok",
        "rollout": "ok",
        "gates": "ok",
    }
    assert data["batches"] == [world.hosts[:1], world.hosts[1:]]  # the canary, then the rest
    for n, h in enumerate(world.hosts, 1):
        state, pid, text = world.unit(h, f"p{n}")
        assert state == "active" and pid > 0 and "EngineVersion=0.11.0" in text
    # A second run changes nothing.
    rc, data, _ = world.playbook(PLAYBOOKS / "default.yaml")
    assert rc == 0 and data["result"] == "nothing"


def test_rolling_engine_upgrade_playbook_with_exec_step_and_custom_gates(world: World) -> None:
    world.write(engine="vllm-0.33")
    rc, data, err = world.playbook(PLAYBOOKS / "rolling-engine-upgrade.yaml")
    assert rc == 0 and data["result"] == "ok", (data, err[-3000:])
    assert outcomes(data) == {
        "engine present": "ok",
        "pre-flight": "ok",
        "stage": "ok",
        "canary": "ok",
        "one host at a time": "ok",
    }
    assert data["batches"] == [[h] for h in world.hosts]
    gates = [g for h in data["hosts"] for g in h["gates"]]
    assert sum(g["step"] == "custom" and g["ok"] for g in gates) == 2  # each instance passed the 3 custom gates
    for n, h in enumerate(world.hosts, 1):
        state, _, text = world.unit(h, f"p{n}")
        assert state == "active" and "EngineVersion=0.33.0" in text


def test_a_failing_exec_step_stops_before_anything_changes(world: World, tmp_path: Path) -> None:
    before = {h: world.unit(h, f"p{n}") for n, h in enumerate(world.hosts, 1)}
    world.write(engine="vllm-0.11")
    pb = tmp_path / "pb.yaml"
    pb.write_text(
        "steps:\n  - {name: new engine, kind: exec, command: 'test -x /opt/vllm-9.9/bin/vllm'}\n  - {kind: rollout}\n"
    )
    rc, data, _ = world.playbook(pb)
    assert rc == 2 and data["result"] == "stopped"
    assert outcomes(data) == {"new engine": "failed", "rollout": "skipped"}
    assert "exit status 1, expected 0" in data["outcomes"][0]["note"]
    assert {h: world.unit(h, f"p{n}") for n, h in enumerate(world.hosts, 1)} == before


def test_a_failing_custom_gate_stops_and_rolls_back(world: World, tmp_path: Path) -> None:
    before = {h: world.unit(h, f"p{n}") for n, h in enumerate(world.hosts, 1)}
    world.write(engine="vllm-0.11")  # a downgrade back to 0.11 ...
    pb = tmp_path / "pb.yaml"
    pb.write_text("""\
steps:
  - {kind: units}
  - name: canary
    kind: canary
    gates:
      - http: {path: /v1/models, expect_status: 200, contains: no-such-model}
        timeout: 2
  - {kind: rollout, serial: 1}
""")
    rc, data, err = world.playbook(pb)
    assert rc == 2 and data["result"] == "rolled_back", (data, err[-3000:])
    assert outcomes(data) == {"units": "ok", "canary": "failed", "rollout": "skipped"}
    canary, other = world.hosts
    hosts = {h["host"]: h for h in data["hosts"]}
    assert hosts[canary]["status"] == "rolled_back" and "no-such-model" in hosts[canary]["error"]
    assert hosts[other]["status"] == "not_reached"
    # ... is undone: the canary runs 0.33 again (restarted), the other host never restarted,
    # and the unit the units step wrote there is the 0.33 one again.
    state, pid, text = world.unit(canary, "p1")
    assert state == "active" and "EngineVersion=0.33.0" in text and pid != before[canary][1]
    assert world.unit(other, "p2") == before[other]
    audit = [json.loads(line) for line in (world.state_dir / "audit.jsonl").read_text().splitlines()]
    assert audit[-1]["result"] == "rolled_back" and "canary" in audit[-1]["detail"]
