"""``deploy --surge`` on the lab: requests stream through the gateway while a replica is replaced.

Real nginx on the first lab host in front of one instance ``sg-1`` of the tiny model
(``VLLM_SIM_TIME_SCALE=0``) on GPU 6 of the second host (the lab's hosts have 8 simulated
GPUs, so GPU 7 and others are spare).  Three clients send completions through the gateway
without pause while a one-flag change is deployed with ``--surge``: no request fails,
``sg-1.surge`` answers requests before the old ``sg-1`` is stopped, and the old ``sg-1`` still
answers after ``sg-1.surge`` was added at the gateway (which happens only once it passed its
gates).  Afterwards only ``sg-1`` runs, with the change, on its own GPU and port, and nothing is
left marked down or in ``previous/`` for the surge unit.
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
PORT = 8460


class Scene:
    def __init__(self, lab: Any, root: Path, model_dir: Path) -> None:
        self.lab, self.root, self.model_dir = lab, root, model_dir
        self.inv_path, self.state_dir = root / "inventory.yaml", root / "state"
        self.gw_host, self.host = lab.names[0], lab.names[1]
        self.doc = yaml.safe_load(Path(lab.inventory).read_text())
        self.doc["models"] = {"sg-tiny": tiny_entry(model_dir, "/models/sg-tiny", served_name="sg-tiny")}
        self.doc.pop("instances", None)
        self.doc.pop("templates", None)
        self.doc["gateway"] = {"hosts": self.gw_host, "port": GW_PORT, "max_conns": 8, "sync_interval_s": 1,
                               "auth": "none"}
        self.url = f"http://{lab.host(self.gw_host).address}:{GW_PORT}"
        self.write(2048)

    def write(self, max_model_len: int) -> None:
        self.doc["instances"] = {"sg-1": {"model": "sg-tiny", "engine": "vllm-0.11", "placement": f"{self.host}:6",
                                          "port": PORT, "args": {"max-model-len": max_model_len},
                                          "env": {"VLLM_SIM_TIME_SCALE": "0"}}}
        self.inv_path.write_text(yaml.safe_dump(self.doc, sort_keys=False))

    def ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO), "CLUSTERCTL_STATE_DIR": str(self.state_dir)}
        res = subprocess.run([sys.executable, "-m", "clusterctl.cli.main", *args, "-i", str(self.inv_path),
                              "--state-dir", str(self.state_dir)], capture_output=True, text=True, timeout=600,
                             env=env)
        assert res.returncode == 0, f"{args}: rc {res.returncode}\n" + res.stdout[-3000:] + res.stderr[-3000:]
        return res

    def complete(self) -> tuple[bool, str]:
        """One completion through the gateway: (ok, the instance that answered or the error)."""
        req = urllib.request.Request(self.url + "/v1/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": "sg-tiny", "prompt": "hi", "max_tokens": 4}).encode())
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                body = json.loads(r.read())
                return bool(r.status == 200 and body.get("choices")), r.headers.get("X-Gateway-Instance", "")
        except (urllib.error.URLError, OSError, ValueError) as e:
            return False, f"{type(e).__name__}: {e}"

    def unit_show(self, prop: str, unit: str = "clusterctl-sg-1.service") -> str:
        out = self.lab.run(self.host, f"systemctl show --timestamp=unix -p {prop} {unit}", timeout=30).stdout
        return out.strip().partition("=")[2]

    def cleanup(self) -> None:
        remove_deployed(self.lab, "clusterctl-sg-*.service", "/etc/clusterctl/instances/sg-*.env "
                        "/var/lib/clusterctl/deploy/previous/sg-* /models/sg-tiny /models/.versions/sg-tiny",
                        hosts=[self.host])
        self.lab.run(self.gw_host, "systemctl disable --now nginx.service", timeout=60)


class Clients:
    """``n`` threads sending completions through the gateway back to back: (time, ok, who) per request."""

    def __init__(self, scene: Scene, n: int = 3) -> None:
        self.scene, self.stop = scene, threading.Event()
        self.results: list[tuple[float, bool, str]] = []
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(n)]

    def loop(self) -> None:
        while not self.stop.is_set():
            ok, who = self.scene.complete()
            self.results.append((time.time(), ok, who))

    def __enter__(self) -> "Clients":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


@pytest.fixture(scope="module")
def scene(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    assert len(lab.names) >= 2, "the surge test needs 2 lab hosts"
    root = tmp_path_factory.mktemp("surge")
    s = Scene(lab, root, tiny_model(root))
    s.cleanup()
    try:
        s.ok("deploy", "--instances", "sg-*", "--gate-timeout", "60")
        s.ok("gateway", "deploy", s.gw_host)
        yield s
    finally:
        s.cleanup()


def test_a_surge_deploy_fails_no_request_and_the_old_unit_serves_until_the_new_one_passed(scene: Scene) -> None:
    deadline = time.monotonic() + 60
    while scene.complete() != (True, "sg-1"):  # the gateway serves sg-1 (nginx just started)
        assert time.monotonic() < deadline, scene.complete()
        time.sleep(0.5)
    scene.write(1024)
    with Clients(scene) as clients:
        time.sleep(0.5)
        res = scene.ok("deploy", "--surge-strict", "--instances", "sg-*", "--gate-timeout", "60",
                       "--drain-timeout", "10", "--json")
        time.sleep(0.5)
    out = json.loads(res.stdout)
    [step] = out["surge"]
    assert out["result"] == "ok" and step["outcome"] == "done" and step["surge"] == "sg-1.surge", out["surge"]
    results = clients.results
    failed = [r for r in results if not r[1]]
    by = collections.Counter(who for _, ok, who in results if ok)
    assert failed == [] and by["sg-1.surge"] > 0, (failed[:5], by)
    # The old sg-1 stopped when systemd restarted it with the change: sg-1.surge served before that,
    # and the old sg-1 still answered after sg-1.surge was at the gateway (added only once it passed).
    restarted = float(scene.unit_show("ExecMainStartTimestamp").lstrip("@"))
    first_surge = min(t for t, ok, who in results if ok and who == "sg-1.surge")
    assert first_surge < restarted, (first_surge, restarted)
    assert any(first_surge < t < restarted for t, ok, who in results if ok and who == "sg-1"), by
    # Afterwards: sg-1 alone, with the change, on its own GPU and port; the surge unit left nothing behind.
    unit = scene.lab.run(scene.host, "cat /etc/systemd/system/clusterctl-sg-1.service", timeout=30).stdout
    assert "--max-model-len 1024" in unit and f"--port {PORT}" in unit and "GPUs=6" in unit
    left = scene.lab.run(scene.host, "ls /etc/systemd/system/ /var/lib/clusterctl/deploy/previous/ | grep -c "
                                     "'sg-1.surge' || true", timeout=30).stdout.strip()
    assert left == "0"
    marked = json.loads((scene.state_dir / "gateway.json").read_text()).get("marked_down", {})
    assert marked == {} and {scene.complete() for _ in range(6)} == {(True, "sg-1")}
