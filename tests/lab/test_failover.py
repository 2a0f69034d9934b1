"""clusterctl failover on the lab: real nginx on the first host, simulator replicas on all three.

A template ``fo`` of four TP-2 replicas of a tiny model (VLLM_SIM_TIME_SCALE=0) over the three
hosts, deployed with ``clusterctl deploy``; the gateway installed with ``clusterctl gateway
deploy``.  Two replicas lose a GPU (the lab's ``gpu-lost`` fault): doctor marks both TP groups
UNAVAILABLE (``status`` and a plain ``gateway sync`` see it too).  With ``--max-share 0.25`` (one of four per run) failover moves the first, leaves the
second alone (over the cap), keeps the operator's cordon and adds its own on the lost GPU's whole host
(a lost GPU's action is node-level); a second run moves the other one off its host.  Only
``clusterctl-fo-*`` units, the ``fo-tiny`` model and nginx are touched; all are removed at the end,
the faults healed.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from clusterctl.lab.hardware import faults as hw_faults

from support.deploy_lab import remove_deployed, tiny_entry, tiny_model
from support.http import http

REPO = Path(__file__).resolve().parents[2]
GW_PORT = 8080
TEMPLATE = {
    "model": "fo-tiny",
    "engine": "vllm-0.11",
    "replicas": 4,
    "tp": 2,
    "port_base": 8600,
    "args": {"max-model-len": 2048},
    "env": {"VLLM_SIM_TIME_SCALE": "0"},
}


class Scene:
    def __init__(self, lab: Any, root: Path, model_dir: Path) -> None:
        self.lab, self.root = lab, root
        self.inv_path, self.state_dir = root / "inventory.yaml", root / "state"
        # Replicas on all three hosts (nginx shares the first): a lost GPU's node-level action rules its whole
        # host out, and with two lost GPUs on two hosts the move needs a third.
        self.gw_host, self.workers = lab.names[0], lab.names[:3]
        doc = yaml.safe_load(Path(lab.inventory).read_text())
        doc["models"] = {"fo-tiny": tiny_entry(model_dir, "/models/fo-tiny", served_name="fo-tiny")}
        doc["templates"] = {"fo": {**TEMPLATE, "hosts": ",".join(self.workers)}}
        doc.pop("instances", None)
        doc["gateway"] = {
            "hosts": self.gw_host,
            "port": GW_PORT,
            "max_conns": 8,
            "sync_interval_s": 1,
            "read_timeout_s": 600,
            "auth": "none",
        }
        self.inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.url = f"http://{lab.host(self.gw_host).address}:{GW_PORT}"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO), "CLUSTERCTL_STATE_DIR": str(self.state_dir)}
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
            timeout=600,
            env=env,
        )

    def placements(self) -> dict[str, tuple[str, list[int], int]]:
        doc = json.loads((self.state_dir / "placements.json").read_text())
        return {n: (p["host"], p["gpus"], p["port"]) for n, p in doc["templates"].get("fo", {}).items()}

    def cordons(self) -> dict[str, dict[str, str]]:
        path = self.state_dir / "cordons.json"
        return json.loads(path.read_text())["cordons"] if path.exists() else {}

    def answered_by(self, n: int = 40) -> collections.Counter[str]:
        """Which instance answered each of ``n`` session-less completions through the gateway."""
        got: collections.Counter[str] = collections.Counter()
        for _ in range(n):
            import urllib.request

            req = urllib.request.Request(
                self.url + "/v1/completions",
                headers={"Content-Type": "application/json"},
                data=json.dumps({"model": "fo-tiny", "prompt": "hi", "max_tokens": 1}).encode(),
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200
                got[r.headers.get("X-Gateway-Instance", "")] += 1
        return got

    def cleanup(self) -> None:
        remove_deployed(
            self.lab,
            "clusterctl-fo-*.service",
            "/etc/clusterctl/instances/fo-*.env "
            "/var/lib/clusterctl/deploy/previous/fo-* /models/fo-tiny /models/.versions/fo-tiny",
            hosts=self.workers,
        )
        self.lab.run(self.gw_host, "systemctl disable --now nginx.service", timeout=60)


@pytest.fixture(scope="module")
def scene(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    assert len(lab.names) >= 3, "the failover test needs 3 lab hosts"
    root = tmp_path_factory.mktemp("failover")
    model_dir = tiny_model(root)
    s = Scene(lab, root, model_dir)
    s.cleanup()
    try:
        res = s.cli("deploy", "--instances", "fo-*", "--gate-timeout", "60")
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        res = s.cli("gateway", "deploy", s.gw_host)
        assert res.returncode == 0, res.stdout + res.stderr
        yield s
    finally:
        for host in s.workers:
            hw_faults.heal(lab.host_dir(host))
        s.cleanup()


def test_failover_moves_one_unavailable_replica_within_the_cap_and_keeps_cordons(scene: Scene) -> None:
    before = scene.placements()
    assert sorted(before) == ["fo-1", "fo-2", "fo-3", "fo-4"]
    # The operator cordons a spare GPU on each worker: failover must not use it, nor lift it.
    for w in scene.workers:
        assert scene.cli("cordon", f"{w}:4", "--reason", "operator: fan noise").returncode == 0
    operator = scene.cordons()
    assert scene.cli("failover", "--json").returncode == 0  # nothing UNAVAILABLE yet: exit 0, nothing done
    assert scene.placements() == before

    for name in ("fo-1", "fo-2"):
        host, gpus, _ = before[name]
        hw_faults.inject(scene.lab.host_dir(host), "gpu-lost", gpu=gpus[1], log=False)
    # TP health is part of every status row and every plain gateway sync: both are UNAVAILABLE in
    # status although they still answer /health, and the sync takes them out; the healthy two keep serving.
    res = scene.cli("status", "--window", "0", "--json")
    assert res.returncode == 2, res.stdout + res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)["instances"]}
    assert all(
        rows[n]["tp_group"].startswith("UNAVAILABLE") and rows[n]["severity"] == "CRIT" for n in ("fo-1", "fo-2")
    ), rows
    assert rows["fo-3"]["tp_group"] == "OK" and rows["fo-3"]["severity"] == "OK"
    res = scene.cli("gateway", "sync", "--window", "0", "--force", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert set(scene.answered_by()) == {"fo-3", "fo-4"}

    plan = scene.cli("failover", "--plan", "--json")
    assert plan.returncode == 1, plan.stdout + plan.stderr
    p = json.loads(plan.stdout)
    assert sorted(p["unavailable"]) == ["fo-1", "fo-2"] and p["cap"] == 1 and p["over_cap"] == ["fo-2"]
    assert [m["instance"] for m in p["moves"]] == ["fo-1"] and scene.placements() == before  # --plan changed nothing

    res = scene.cli("failover", "--max-share", "0.25", "--gate-timeout", "60", "--drain-timeout", "10", "--json")
    assert res.returncode == 1, res.stdout[-4000:] + res.stderr[-4000:]  # 1: fo-2 is over the cap
    out = json.loads(res.stdout)
    assert out["moved"] == {"fo-1": None} and out["over_cap"] == ["fo-2"], out
    after = scene.placements()
    old_host, old_gpus, _ = before["fo-1"]
    new_host, new_gpus, new_port = after["fo-1"]
    assert not (new_host == old_host and set(new_gpus) & set(old_gpus))  # off the failed group
    assert 4 not in new_gpus  # not on the operator's cordon
    assert {n: after[n] for n in ("fo-2", "fo-3", "fo-4")} == {n: before[n] for n in ("fo-2", "fo-3", "fo-4")}
    cordons = scene.cordons()
    assert {k: cordons[k] for k in operator} == operator  # the operator's cordons untouched
    # A lost GPU's action is node-level ("drain the node and power-cycle it"): the whole host is cordoned
    # and the group left it, not re-placed on two other GPUs of the node to be drained.
    assert new_host != old_host
    assert cordons[old_host]["reason"].startswith("failover: gpu.lost")
    assert "(node-level: drain the node" in cordons[old_host]["reason"]
    # fo-2 is over the cap and stays where it is, but its host is ruled out as a target too.
    assert set(cordons) == set(operator) | {old_host, before["fo-2"][0]}
    assert new_host != before["fo-2"][0]

    # The moved replica runs at its new place, passes the gates and receives traffic again; fo-2 stays out.
    status, _ = http(f"http://{scene.lab.host(new_host).address}:{new_port}/health")
    assert status == 200
    old_unit = scene.lab.run(old_host, "systemctl is-active clusterctl-fo-1.service || true").stdout.strip()
    if new_host != old_host:
        assert old_unit in ("inactive", "unknown", "failed"), old_unit
    seen = scene.answered_by()
    assert set(seen) == {"fo-1", "fo-3", "fo-4"}, seen

    # A second run: fo-1 is healthy now, fo-2 is the only one left and within the cap.  Where fo-1's old
    # host is another one, the operator power-cycled it (faults healed) and uncordons it.  fo-2's lost GPU
    # is node-level too: it must move off its host: removed there, started on the other.
    host2 = before["fo-2"][0]
    if old_host != host2:
        hw_faults.heal(scene.lab.host_dir(old_host))
        assert scene.cli("uncordon", old_host).returncode == 0
    operator = scene.cordons()
    res = scene.cli("failover", "--gate-timeout", "60", "--drain-timeout", "10", "--json")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert json.loads(res.stdout)["moved"] == {"fo-2": None}
    moved_to = scene.placements()["fo-2"][0]
    assert moved_to != host2 and host2 in scene.cordons()
    gone = scene.lab.run(host2, "test -e /etc/systemd/system/clusterctl-fo-2.service && echo present || echo gone")
    assert gone.stdout.strip() == "gone"
    assert set(scene.answered_by()) == {"fo-1", "fo-2", "fo-3", "fo-4"}
    assert {k: scene.cordons()[k] for k in operator} == operator
