"""An operator's day on the lab: every path that drains an instance puts it back at the gateway.

Real nginx on the first host in front of a template ``op`` of two TP-1 replicas of a tiny model
(``VLLM_SIM_TIME_SCALE=0``) on the second and third hosts.  The operator's sequence, each step
through the command line, and after each the gateway's view: no instance left marked down by a
drain, and every replica answering requests sent to the gateway:

1. deploy, gateway deploy;
2. a one-flag change deployed (both replicas drained, restarted, gated);
3. ``rollback`` of that change;
4. ``restart`` of one replica;
5. ``scale`` up (a new replica) and back down (the removed one's drain mark is gone too);
   TP 1 -> 2 -> 1 without ``--force`` (pre-flight over the state after the plan's removals);
6. a change whose engine cannot start: the deploy gate names the journal's first error, the
   batch is rolled back, and the restored replica is back at the gateway;
7. ``start`` of a unit systemd gave up on (failed): its failed state is cleared; while its model
   is missing the error is the journal's first error, once it is back the replica serves;
8. ``deploy --surge-strict --instances op-1`` of a one-flag change while three clients send
   completions through the gateway without pause: the new version serves as ``op-1.surge`` on a
   spare GPU before the old ``op-1`` is restarted, no request fails, and nothing of the surge unit
   is left (one replica: the other's surge would only repeat it, at CI's cost).

Only ``clusterctl-op-*`` units, the ``op-tiny`` model and nginx are touched, all removed at the end.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from support.deploy_lab import remove_deployed, tiny_entry, tiny_model

REPO = Path(__file__).resolve().parents[2]
GW_PORT = 8080
TEMPLATE = {
    "model": "op-tiny",
    "engine": "vllm-0.11",
    "replicas": 2,
    "tp": 1,
    "port_base": 8700,
    "args": {"max-model-len": 2048, "max-num-seqs": 32},
    "env": {"VLLM_SIM_TIME_SCALE": "0"},
}


class Scene:
    def __init__(self, lab: Any, root: Path, model_dir: Path) -> None:
        self.lab, self.root = lab, root
        self.inv_path, self.state_dir = root / "inventory.yaml", root / "state"
        self.gw_host, self.workers = lab.names[0], lab.names[1:3]
        self.doc = yaml.safe_load(Path(lab.inventory).read_text())
        self.doc["models"] = {"op-tiny": tiny_entry(model_dir, "/models/op-tiny", served_name="op-tiny")}
        self.doc.pop("instances", None)
        self.doc["gateway"] = {
            "hosts": self.gw_host,
            "port": GW_PORT,
            "max_conns": 8,
            "sync_interval_s": 1,
            "auth": "none",
        }
        self.write_template()
        self.url = f"http://{lab.host(self.gw_host).address}:{GW_PORT}"

    def write_template(self, tp: int = 1, **args: Any) -> None:
        tpl = {**TEMPLATE, "hosts": ",".join(self.workers), "tp": tp}
        tpl["args"] = {**TEMPLATE["args"], **args}
        self.doc["templates"] = {"op": tpl}
        self.inv_path.write_text(yaml.safe_dump(self.doc, sort_keys=False))

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

    def ok(self, *args: str, rc: int = 0) -> subprocess.CompletedProcess[str]:
        res = self.cli(*args)
        assert res.returncode == rc, f"{args}: rc {res.returncode}\n" + res.stdout[-3000:] + res.stderr[-3000:]
        return res

    def placements(self) -> dict[str, tuple[str, list[int], int]]:
        doc = json.loads((self.state_dir / "placements.json").read_text())
        return {n: (p["host"], p["gpus"], p["port"]) for n, p in doc["templates"].get("op", {}).items()}

    def marked_down(self) -> dict[str, Any]:
        path = self.state_dir / "gateway.json"
        return json.loads(path.read_text()).get("marked_down", {}) if path.exists() else {}

    def answered_by(self, n: int = 24) -> collections.Counter[str]:
        """Which instance answered each of ``n`` session-less completions through the gateway."""
        got: collections.Counter[str] = collections.Counter()
        for _ in range(n):
            req = urllib.request.Request(
                self.url + "/v1/completions",
                headers={"Content-Type": "application/json"},
                data=json.dumps({"model": "op-tiny", "prompt": "hi", "max_tokens": 1}).encode(),
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200
                got[r.headers.get("X-Gateway-Instance", "")] += 1
        return got

    def assert_all_back(self, names: set[str]) -> None:
        """The gateway's view: nothing marked down, and every one of ``names`` gets traffic."""
        assert self.marked_down() == {}, self.marked_down()
        assert set(self.answered_by()) == names

    def host_of(self, name: str) -> str:
        return self.placements()[name][0]

    def cleanup(self) -> None:
        remove_deployed(
            self.lab,
            "clusterctl-op-*.service",
            "/etc/clusterctl/instances/op-*.env "
            "/var/lib/clusterctl/deploy/previous/op-* /models/op-tiny /models/.versions/op-tiny "
            "/models/op-tiny.away",
            hosts=self.workers,
        )
        self.lab.run(self.gw_host, "systemctl disable --now nginx.service", timeout=60)


@pytest.fixture(scope="module")
def scene(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    assert len(lab.names) >= 3, "the operations test needs 3 lab hosts"
    root = tmp_path_factory.mktemp("operations")
    s = Scene(lab, root, tiny_model(root))
    s.cleanup()
    try:
        s.ok("deploy", "--instances", "op-*", "--gate-timeout", "60")
        s.ok("gateway", "deploy", s.gw_host)
        yield s
    finally:
        s.cleanup()


def test_every_drain_path_puts_the_instance_back_at_the_gateway(scene: Scene) -> None:
    both = {"op-1", "op-2"}
    scene.assert_all_back(both)

    # A one-flag change: both replicas are drained (marked down), restarted, gated and put back.
    scene.write_template(**{"max-num-seqs": 48})
    out = json.loads(scene.ok("deploy", "--gate-timeout", "60", "--drain-timeout", "10", "--json").stdout)
    # only this test's replicas: other modules' instances on the shared lab may be listed too
    mine = {k: v for k, v in out["gateway"].items() if k in both}
    assert mine == {"op-1": "up at the gateway", "op-2": "up at the gateway"}, out["gateway"]
    scene.assert_all_back(both)

    # The operator rolls that change back: drained, restored, gated, put back.
    out = json.loads(scene.ok("rollback", "--instances", "op-*", "--gate-timeout", "60", "--json").stdout)
    assert sorted(out["drained"]) == ["op-1", "op-2"] and out["result"] == "ok"
    scene.assert_all_back(both)

    scene.ok("restart", "op-1", "--health-timeout", "60")
    scene.assert_all_back(both)

    # Scale up adds a replica; scale down drains and removes it, and leaves no mark behind.
    scene.ok("scale", "op", "--replicas", "3", "--gate-timeout", "60")
    scene.assert_all_back(both | {"op-3"})
    scene.ok("scale", "op", "--replicas", "2", "--gate-timeout", "60", "--drain-timeout", "10")
    scene.assert_all_back(both)

    # TP 1 -> 2 and back re-places the replicas onto GPUs and ports the old units still hold: pre-flight
    # reasons over the state after the plan stops them (no --force needed), and all come back.
    for tp in (2, 1):
        scene.write_template(tp=tp)
        res = scene.ok("deploy", "--gate-timeout", "60", "--drain-timeout", "10", "--json")
        assert json.loads(res.stdout)["result"] == "ok"
        assert all(len(gpus) == tp for _, gpus, _ in scene.placements().values())
        scene.assert_all_back(both)


def test_a_change_that_cannot_start_names_the_first_error_and_the_rollback_puts_it_back(scene: Scene) -> None:
    scene.write_template(**{"gpu-memory-utilization": 1.5})  # pre-flight refuses it: --force past that
    try:
        res = scene.cli("deploy", "--force", "--serial", "1", "--gate-timeout", "60", "--drain-timeout", "10", "--json")
    finally:
        scene.write_template()
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["result"] == "rolled_back"
    failed = [g for h in out["hosts"] for g in h["gates"] if not g["ok"]]
    assert (
        failed
        and "first error in the journal: ValueError: GPU memory utilization must be less than 1.0"
        in failed[0]["reason"]
    ), failed
    # The canary's replica was restored to the working unit, passed its gate and is back.
    scene.assert_all_back({"op-1", "op-2"})


def test_start_clears_a_unit_at_its_start_limit_and_explains_a_failed_start(scene: Scene) -> None:
    host = scene.host_of("op-1")
    unit = "clusterctl-op-1.service"
    scene.ok("stop", "op-1", "--drain-timeout", "5")
    scene.lab.run(host, "mv /models/op-tiny /models/op-tiny.away", timeout=30)
    try:
        # Starts in quick succession until systemd gives up: the unit is failed.
        scene.lab.run(host, f"for i in 1 2 3 4 5 6 7; do systemctl restart {unit}; sleep 0.2; done; true", timeout=120)
        state = scene.lab.run(host, f"systemctl show -p ActiveState,Result {unit}", timeout=30).stdout
        assert "ActiveState=failed" in state, state
        t0 = time.monotonic()
        res = scene.ok("start", "op-1", "--health-timeout", "120", "--json", rc=2)
        [row] = json.loads(res.stdout)["results"]
        assert time.monotonic() - t0 < 60  # not the health timeout: it saw the unit die
        assert "first error in the journal: verify-model: refusing to start: /models/op-tiny" in row["error"], row
        assert "cleared the unit's failed state" in row["notes"]
    finally:
        scene.lab.run(host, "mv /models/op-tiny.away /models/op-tiny", timeout=30)
    # The model is back (systemd may be retrying on its own meanwhile): start brings it back for good.
    res = scene.ok("start", "op-1", "--health-timeout", "60", "--json")
    [row] = json.loads(res.stdout)["results"]
    assert row["ok"] and row["healthy_after_s"] is not None
    scene.assert_all_back({"op-1", "op-2"})


def _complete(url: str) -> tuple[float, bool, str]:
    """One completion through the gateway: (when it ended, ok, the instance that answered or the error)."""
    req = urllib.request.Request(
        url + "/v1/completions",
        headers={"Content-Type": "application/json"},
        data=json.dumps({"model": "op-tiny", "prompt": "hi", "max_tokens": 4}).encode(),
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            ok = r.status == 200 and bool(json.loads(r.read()).get("choices"))
            return time.time(), ok, r.headers.get("X-Gateway-Instance", "")
    except (urllib.error.URLError, OSError, ValueError) as e:
        return time.time(), False, f"{type(e).__name__}: {e}"


def test_a_surge_deploy_fails_no_request_and_the_old_unit_serves_until_the_new_one_passed(scene: Scene) -> None:
    both = {"op-1", "op-2"}
    hosts = {"op-1": scene.host_of("op-1")}
    scene.write_template(**{"max-num-seqs": 40})
    stop, results = threading.Event(), []

    def client() -> None:
        while not stop.is_set():
            results.append(_complete(scene.url))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        res = scene.ok(
            "deploy", "--surge-strict", "--instances", "op-1", "--gate-timeout", "60", "--drain-timeout", "10", "--json"
        )
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        scene.write_template()
    out = json.loads(res.stdout)
    assert out["result"] == "ok" and [(s["instance"], s["outcome"]) for s in out["surge"]] == [("op-1", "done")], out[
        "surge"
    ]
    failed = [r for r in results if not r[1]]
    by = collections.Counter(who for _, ok, who in results if ok)
    assert failed == [] and by["op-1.surge"] > 0, (failed[:5], by)
    for name, host in hosts.items():
        # The old unit stopped when systemd restarted it with the change: the surge served before that,
        # and the old one still answered after the surge was at the gateway (added once it passed its gates).
        shown = scene.lab.run(
            host, f"systemctl show --timestamp=unix -p ExecMainStartTimestamp clusterctl-{name}.service", timeout=30
        ).stdout
        restarted = float(shown.strip().partition("=@")[2])
        first_surge = min(t for t, ok, who in results if ok and who == f"{name}.surge")
        assert first_surge < restarted, (name, first_surge, restarted)
        assert any(first_surge < t < restarted for t, ok, who in results if ok and who == name), (name, by)
        unit = scene.lab.run(host, f"cat /etc/systemd/system/clusterctl-{name}.service", timeout=30).stdout
        assert "--max-num-seqs 40" in unit and f"--port {scene.placements()[name][2]}" in unit
        left = scene.lab.run(
            host,
            f"ls /etc/systemd/system/ /var/lib/clusterctl/deploy/previous/ | grep -c '{name}.surge' || true",
            timeout=30,
        ).stdout.strip()
        assert left == "0", (host, left)
    scene.assert_all_back(both)
