"""Release gates in the rollout (``deploy --gate drift``) on a 2-host lab with the simulator.

One instance per host (VLLM_SIM_TIME_SCALE=0, batch noise off, API key from
a secret).  The tests run in file order and share the module's deployment:
a plain deploy brings both up and ``drift baseline p1 --name previous``
records the running version; a change that breaks quantization
(``VLLM_SIM_BROKEN_QUANTIZATION=1``) deployed with ``--record-baseline
previous --gate drift`` fails the canary's drift gate: the canary is rolled
back (same unit text, serving again), the second host is untouched, exit 2,
and the audit says why; a harmless env change passes the drift gate on both
hosts and the canary's bench gate against p2 (skipped for p2 itself).
The fixture removes every unit, env file, previous copy, lock and staged
model it created (the playbook test's cleanup); baselines live in the test's own XDG_STATE_HOME.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from lab.test_deploy_playbook import World as PlaybookWorld
from support.deploy_lab import tiny_entry, tiny_model

KEY = "rg-secret-5d1e77a0"
KEY_ENV = "CLUSTERCTL_TEST_RELEASE_KEY"
REPO = Path(__file__).resolve().parents[2]
PORT = 8410


class World(PlaybookWorld):
    """The playbook lab test's world (model /models/pb-tiny, unit reader, cleanup) with this file's
    instances, API key and drift state directory."""

    def __init__(self, lab: Any, root: Path, model_dir: Path):
        super().__init__(lab, root, model_dir)
        self.xdg = root / "xdg"
        from clusterctl.clusterstate import default_cluster_name

        # the inventory has no cluster: name; its state is keyed by the file's default name
        self.baselines = (
            self.xdg / "clusterctl" / "clusters" / default_cluster_name(str(self.inv_path)) / "drift" / "baselines"
        )

    def write(self, **env: str) -> None:  # type: ignore[override]
        doc = dict(self.base)
        doc["models"] = {"tiny": tiny_entry(self.model_dir, "/models/pb-tiny")}
        doc["instances"] = {
            f"p{n}": {
                "model": "tiny",
                "engine": "vllm-0.11",
                "placement": f"{h}:5",
                "port": PORT,
                "args": {"max-model-len": 4096},
                "env": {"VLLM_SIM_TIME_SCALE": "0", "VLLM_SIM_BATCH_NOISE": "0", **env},
                "secrets": {"VLLM_API_KEY": {"env": KEY_ENV}},
            }
            for n, h in enumerate(self.hosts, 1)
        }
        self.inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, KEY_ENV: KEY, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(self.xdg)}
        p = subprocess.run(
            [sys.executable, "-m", "clusterctl.cli.main", *args], capture_output=True, text=True, timeout=600, env=env
        )
        assert KEY not in p.stdout + p.stderr
        return p

    def deploy(self, *args: str) -> tuple[int, dict[str, Any], str]:
        p = self.cli(
            "deploy",
            "-i",
            str(self.inv_path),
            "--state-dir",
            str(self.state_dir),
            "--json",
            "--serial",
            "1,100%",
            "--gate-timeout",
            "60",
            *args,
        )
        try:
            data = json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"rc {p.returncode}: {p.stdout[-2000:]} {p.stderr[-3000:]}") from None
        return p.returncode, data, p.stderr

    def serving(self, host: str, timeout_s: float = 30.0) -> bool:
        """True once the instance on ``host`` answers /health with 200 (polled every 0.5 s)."""
        from clusterctl.inventory.loader import load_inventory

        url = f"http://{load_inventory(str(self.inv_path)).hosts[host].address}:{PORT}/health"
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.5)
        return False


@pytest.fixture(scope="module")
def world(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("release")
    model_dir = tiny_model(root)
    w = World(lab, root, model_dir)
    w.cleanup()
    try:
        yield w
    finally:
        w.cleanup()


def gates_of(data: dict[str, Any], host: str) -> list[tuple[str, bool]]:
    [h] = [h for h in data["hosts"] if h["host"] == host]
    return [(g["step"], g["ok"]) for g in h["gates"]]


def test_deploy_and_record_the_previous_baseline(world: World) -> None:
    world.write()
    rc, data, err = world.deploy()
    assert rc == 0 and data["result"] == "ok", (data, err[-3000:])
    p = world.cli("drift", "baseline", "p1", "--name", "previous", "-i", str(world.inv_path), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["prompts"] == 12
    assert (world.baselines / "previous.json").is_file()


def test_a_drifting_canary_is_rolled_back_and_the_rollout_stops(world: World) -> None:
    before = {h: world.unit(h, f"p{n}") for n, h in enumerate(world.hosts, 1)}
    baseline = world.baselines / "previous.json"
    recorded = baseline.stat().st_mtime_ns
    world.write(VLLM_SIM_BROKEN_QUANTIZATION="1")
    rc, data, err = world.deploy("--record-baseline", "previous", "--gate", "drift")
    assert rc == 2 and data["result"] == "rolled_back", (data, err[-3000:])
    canary, other = world.hosts
    assert data["batches"] == [[canary], [other]]
    statuses = {h["host"]: h["status"] for h in data["hosts"]}
    assert (statuses[canary], statuses[other]) == ("rolled_back", "not_reached")
    assert set(statuses.values()) - {"rolled_back", "not_reached"} <= {"unchanged"}  # lab hosts it does not use
    assert gates_of(data, canary) == [("completion", True), ("drift", False)]
    [row] = [h for h in data["hosts"] if h["host"] == canary]
    assert "outputs drifted from baseline 'previous'" in row["error"]
    assert baseline.stat().st_mtime_ns > recorded  # --record-baseline: recorded again from the running p1
    state, _, text = world.unit(canary, "p1")
    assert state == "active" and text == before[canary][2] and world.serving(canary)
    assert world.unit(other, "p2") == before[other]  # not restarted, not rewritten
    [rec] = [json.loads(line) for line in (world.state_dir / "audit.jsonl").read_text().splitlines()][-1:]
    assert rec["result"] == "rolled_back" and "outputs drifted" in rec["detail"] and canary in rec["detail"]


def test_a_change_that_does_not_drift_passes_the_gates(world: World) -> None:
    world.write(HARMLESS_SETTING="1")
    # The bench gate compares the canary p1 with p2 (still the previous version); the tolerance is wide
    # because at time scale 0 latencies are sub-millisecond noise: this checks the wiring, not speed.
    rc, data, err = world.deploy(
        "--record-baseline", "previous", "--gate", "drift", "--gate", "bench:p2", "--bench-tolerance", "5"
    )
    canary, other = world.hosts
    if data["result"] == "paused":
        # On a loaded machine (the lab shares its cores with the generator) the bench's own trust check
        # may say its numbers cannot be trusted: inconclusive, which is no regression and no pass. The
        # canary keeps the change and serves; the rollout pauses; the same deploy goes on from there.
        assert rc == 1, (data, err[-3000:])
        assert gates_of(data, canary) == [("completion", True), ("drift", True), ("bench", False)]
        [row] = [h for h in data["hosts"] if h["host"] == canary]
        assert row["status"] == "held" and "inconclusive" in row["error"] and row["gates"][-1]["inconclusive"]
        assert world.unit(canary, "p1")[0] == "active" and world.serving(canary)
        assert "HARMLESS_SETTING" in world.unit(canary, "p1")[2]  # the new version, not rolled back
        assert "HARMLESS_SETTING" not in world.unit(other, "p2")[2]  # not reached
        rc, data, err = world.deploy("--gate", "drift", "--gate", "bench:p2", "--bench-tolerance", "5")
        assert rc == 0 and data["result"] == "ok", (data, err[-3000:])
        assert gates_of(data, other) == [("completion", True), ("drift", True)]  # p2, the reference: not benched
    else:
        assert rc == 0 and data["result"] == "ok", (data, err[-3000:])
        assert gates_of(data, canary) == [("completion", True), ("drift", True), ("bench", True)]
        # p2 is the reference: once upgraded it is not benched against itself.
        assert gates_of(data, other) == [("completion", True), ("drift", True)]
    for n, h in enumerate(world.hosts, 1):
        assert world.unit(h, f"p{n}")[0] == "active"
