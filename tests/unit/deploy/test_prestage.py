"""``deploy --prestage``: the next version staged (not switched) and warmed on every target host
before the first batch stops anything; the batches then only switch.

Hosts are FakeTransport hosts that keep a model link per host: a staging job with
``switch`` points it at the version, one without leaves it; each job is recorded in
order, so "before the first batch" is checked on the real sequence of node jobs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

import pytest

from clusterctl.cli.main import app
from clusterctl.deploy.rollout.engine import Deploy, DeployOptions
from clusterctl.deploy.rollout.gates import GateResult
from clusterctl.deploy.rollout.batches import parse_serial
from clusterctl.fleet import Fleet
from clusterctl.fleet.transport import FakeReply, FakeTransport
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Host

N = 6


def inventory(src: Path) -> str:
    return f"""\
version: 1
defaults:
  gpus: {{count: 1, model: H100-SXM5-80GB, memory_gib: 79.6, interconnect: nvlink}}
hosts:
  h[1-{N}]: {{address: '10.0.0.[1-{N}]'}}
engines:
  e: {{path: /opt/vllm/bin/vllm, version: 0.11.0}}
models:
  m: {{path: /models/m, source: {src}, version: v2}}
instances:
""" + "".join(f"  i{n}: {{model: m, engine: e, placement: 'h{n}:0', port: 8000}}\n" for n in range(1, N + 1))


class StagingCluster:
    """Every host serves v1 of m; ``stage`` jobs stage v2 (switching the link only when asked);
    ``fail_stage`` hosts fail their first staging job."""

    def __init__(self, fail_stage: Sequence[str] = ()):
        self.fail_stage = set(fail_stage)
        self.link = {f"h{n}": "v1" for n in range(1, N + 1)}
        self.have: dict[str, set[str]] = {h: {"v1"} for h in self.link}
        self.jobs: list[tuple[str, dict[str, Any]]] = []
        self.transport = FakeTransport(self.handle)

    def handle(self, host: Host, command: str, stdin: bytes | None) -> FakeReply:
        shipped = re.search(r" [0-9a-f]{64} (?:pipe|store)=([0-9]+) ", command)
        if shipped and stdin:  # the node program travels before the job (staging's relay: always)
            stdin = stdin[int(shipped.group(1)) :]
        job = json.loads((stdin or b"{}").split(b"\n", 1)[0])
        self.jobs.append((host.name, job))
        op = job["op"]
        if op == "read":
            v = self.link[host.name]
            out: dict[str, Any] = {
                "ok": True,
                "instances": {},
                "lock": None,
                "previous": [],
                "models": {
                    "/models/m": {
                        "path": "/models/m",
                        "exists": True,
                        "verified": True,
                        "version": v,
                        "target": f".versions/m/{v}",
                    }
                },
            }
        elif op == "stage":
            if host.name in self.fail_stage:
                self.fail_stage.discard(host.name)
                out = {"ok": False, "kind": "fetch", "error": "HTTP 503 from the source"}
            else:
                present = "v2" in self.have[host.name]
                self.have[host.name].add("v2")
                if job.get("switch", True):
                    self.link[host.name] = "v2"
                out = {
                    "ok": True,
                    "version": "v2",
                    "already_present": present,
                    # the node's residency count after the warm-up: here the budget's share of 4 MiB
                    "warm": {"read_bytes": job.get("warm_budget"), "resident": job.get("warm_budget"), "bytes": 4 << 20}
                    if job.get("warm")
                    else None,
                }
        elif op == "apply":  # a relink with a version: the node's check, then the switch
            bad = [m for m in job.get("relink", []) if m["target"].rsplit("/", 1)[-1] not in self.have[host.name]]
            if bad:
                out = {
                    "ok": False,
                    "kind": "relink",
                    "error": f"{bad[0]['path']}: target {bad[0]['target']} is missing",
                }
            else:
                for m in job.get("relink", []):
                    self.link[host.name] = m["target"].rsplit("/", 1)[-1]
                out = {"ok": True, "errors": {}}
        elif op == "rollback":
            out = {"ok": True, "restored": [], "removed": job["instances"], "missing": []}
        else:
            out = {"ok": True, "recovered": None}
        return FakeReply(0, json.dumps(out) + "\n")

    def ops(self, op: str) -> list[tuple[int, str, dict[str, Any]]]:
        return [(k, h, j) for k, (h, j) in enumerate(self.jobs) if j["op"] == op]


class ScriptedDeploy(Deploy):
    def preflight(self, fleet: Any, plan: Any) -> Any:
        return None

    def gate(self, fleet: Any, names: Sequence[str]) -> list[GateResult]:
        return [GateResult(n, self.rendered[n].host, True, "completion", "scripted", 0.0) for n in names]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"w" * 4096)
    return src


def deploy(tmp_path: Path, source: Path, cluster: StagingCluster, **opts: Any) -> Any:
    inv = load_inventory_text(inventory(source), "inv.yaml")
    events: list[Any] = []
    d = ScriptedDeploy(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=cluster.transport),
        str(tmp_path / "state"),
        DeployOptions(serial=parse_serial("1,50%"), **opts),
        on_event=events.append,
    )
    rep = d.run()
    return rep, events


def test_prestage_stages_and_warms_every_host_before_the_first_batch_then_batches_only_switch(
    tmp_path: Path, source: Path
) -> None:
    c = StagingCluster()
    rep, events = deploy(tmp_path, source, c, prestage=True, warm_budget=1 << 20)
    assert rep.result == "ok" and [len(b) for b in rep.batches] == [1, 3, 2]
    stages, applies = c.ops("stage"), c.ops("apply")
    first_apply = min(k for k, _, _ in applies)
    # every target host staged without switching and warmed within the budget, before anything is applied
    assert sorted(h for _, h, _ in stages) == sorted(c.link) and max(k for k, _, _ in stages) < first_apply
    assert all(j["switch"] is False and j["warm"] is True and j["warm_budget"] == 1 << 20 for _, _, j in stages)
    # the batches run no staging run: each host's apply switches the link to the verified version
    assert len(stages) == N
    for _, h, j in applies:
        assert j["relink"] == [{"path": "/models/m", "target": ".versions/m/v2", "version": "v2"}], (h, j)
    assert sorted(e.host for e in events if e.kind == "host" and e.message.startswith("switch m to v2")) == sorted(
        c.link
    )
    assert set(c.link.values()) == {"v2"}
    assert sorted(rep.prestage["hosts"]) == sorted(c.link)
    assert all(v == {"m": "staged"} for v in rep.prestage["hosts"].values())
    assert rep.to_dict()["prestage"]["hosts"]["h1"] == {"m": "staged"}
    # what each node counted in its page cache after the warm-up, per host and model
    assert rep.prestage["resident"] == {h: {"m": 0.25} for h in c.link}


def test_a_prestaged_version_gone_before_its_batch_fails_the_apply_loudly(tmp_path: Path, source: Path) -> None:
    c = StagingCluster()
    real = c.handle

    def vanish(host: Host, command: str, stdin: bytes | None) -> FakeReply:
        reply = real(host, command, stdin)
        if host.name == "h1" and [j for h, j in c.jobs if h == "h1"][-1]["op"] == "stage":
            c.have["h1"].discard("v2")  # staged and verified, then removed behind the deploy's back
        return reply

    c.transport = FakeTransport(vanish)
    rep, _ = deploy(tmp_path, source, c, prestage=True)
    assert rep.result == "rolled_back" and rep.hosts["h1"].status == "rolled_back", rep.to_dict()["hosts"]
    assert "target .versions/m/v2 is missing" in (rep.hosts["h1"].error or "")
    assert c.link["h1"] == "v1" and c.ops("stage")[-1][2]["switch"] is False  # no staging run hid it


def test_without_prestage_each_batch_stages_only_its_own_hosts_and_switches(tmp_path: Path, source: Path) -> None:
    c = StagingCluster()
    rep, _ = deploy(tmp_path, source, c)
    assert rep.result == "ok" and rep.prestage is None
    stages, applies = c.ops("stage"), c.ops("apply")
    assert all(j.get("switch", True) is True for _, _, j in stages)
    # the second batch's hosts were not staged before the canary was applied
    canary_apply = applies[0][0]
    assert [h for k, h, _ in stages if k < canary_apply] == [rep.batches[0][0]]


def test_a_host_whose_prestage_failed_is_staged_again_by_its_batch(tmp_path: Path, source: Path) -> None:
    c = StagingCluster(fail_stage=["h4"])
    rep, events = deploy(tmp_path, source, c, prestage=True)
    assert rep.result == "ok"
    assert rep.prestage["hosts"]["h4"]["m"].startswith("failed") and "503" in rep.prestage["hosts"]["h4"]["m"]
    assert any(e.kind == "warn" and "h4" in e.message for e in events)
    h4 = [j for _, h, j in c.ops("stage") if h == "h4"]
    assert [j["switch"] for j in h4] == [False, True] and c.link["h4"] == "v2"
    # the hosts whose pre-stage passed are switched by their apply, h4's staging run switched it
    assert sorted(h for _, h, j in c.ops("apply") if j.get("relink")) == [h for h in sorted(c.link) if h != "h4"]


def test_prestage_with_nothing_to_stage_stages_nothing(tmp_path: Path, source: Path) -> None:
    c = StagingCluster()
    for h in c.link:
        c.link[h] = "v2"
    rep, _ = deploy(tmp_path, source, c, prestage=True)
    assert c.ops("stage") == [] and rep.prestage == {"hosts": {}, "seconds": {}, "resident": {}}


def test_cli_refuses_a_warm_budget_without_prestage_and_a_bad_size() -> None:
    from typer.testing import CliRunner

    r = CliRunner().invoke(app, ["deploy", "--warm-budget", "8G", "-i", "/nonexistent.yaml"])
    assert r.exit_code == 3 and "--warm-budget goes with --prestage" in r.output
