"""Release gates in the rollout (``deploy --gate drift|bench:REF``, ``--record-baseline``).

The engine runs over fake hosts (FakeTransport, as test_engine.py); health
gates are passed by a stub, and the release gates run for real against
simulator processes on 127.0.0.1 (--time-scale 0, batch noise off): each
inventory instance's port is a simulator, unquantized ("previous version")
or with broken quantization (a drifting canary).
"""

from __future__ import annotations

import re

import json
from pathlib import Path
from typing import Any, Sequence

import pytest

from clusterctl.deploy.rollout import audit, gates
from clusterctl.deploy.rollout.engine import DeployOptions
from clusterctl.deploy.rollout.release_gates import ReleaseDeploy, ReleaseGates, parse_gates, record_previous
from clusterctl.deploy.rollout.batches import parse_serial
from clusterctl.errors import ClusterctlError
from clusterctl.fleet import Fleet
from clusterctl.fleet.transport import FakeReply
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Host
from clusterctl.lab.vllm_sim import synth
from clusterctl.lab.vllm_sim.serve import free_port
from unit.deploy.test_engine import FakeCluster as EngineCluster
from unit.vllm_sim.conftest import host, nvml_lib, start_sim  # noqa: F401  (fixtures)


INVENTORY_TEXT = """\
version: 1
defaults:
  gpus: {{count: 1, model: H100-SXM5-80GB, memory_gib: 79.6, interconnect: nvlink}}
hosts:
  h01: {{address: 127.0.0.1}}
  h02: {{address: 127.0.0.1}}
engines:
  e: {{path: /opt/vllm/bin/vllm, version: 0.11.0}}
models:
  tiny: {{path: /models/tiny}}
  other: {{path: /models/other}}
instances:
  i1: {{model: tiny, engine: e, placement: 'h01:0', port: {p1}}}
  i2: {{model: {model2}, engine: e, placement: 'h02:0', port: {p2}}}
"""


def inventory(p1: int, p2: int, model2: str = "tiny") -> Any:
    return load_inventory_text(INVENTORY_TEXT.format(p1=p1, p2=p2, model2=model2), "inv.yaml")


class FakeCluster(EngineCluster):
    """test_engine's fake hosts; ``running`` instances are read back as active with an old digest
    (so this deploy 'changes' them)."""

    def __init__(self, running: Sequence[str] = ()):
        super().__init__()
        self.running = set(running)

    def handle(self, host: Host, command: str, stdin: bytes | None) -> FakeReply:
        reply = super().handle(host, command, stdin)
        name = {"h01": "i1", "h02": "i2"}[host.name]
        if self.jobs[-1][1]["op"] != "read" or name not in self.running:
            return reply
        out = json.loads(reply.stdout)
        out["instances"] = {
            name: {
                "unit_text": "old",
                "digest": "old",
                "env_hashes": {},
                "env_present": True,
                "active": "active",
                "sub": "running",
                "restarts": 0,
                "main_pid": 1,
                "enabled": True,
                "started_mono": 0,
                "x": {},
            }
        }
        return FakeReply(0, json.dumps(out) + "\n")


class Gated(ReleaseDeploy):
    def preflight(self, fleet: Any, plan: Any) -> Any:
        if self.release.record_baseline:
            self._record(plan, self.release.record_baseline)
        return None


@pytest.fixture(autouse=True)
def health_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The standard gate passes at once (it is tested in test_gates.py)."""

    def passed(targets: Sequence[gates.GateTarget], **kw: Any) -> list[gates.GateResult]:
        return [gates.GateResult(t.instance, t.host, True, "completion", "stub", 0.0) for t in targets]

    monkeypatch.setattr(gates, "wait_gates", passed)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("release")
    synth.write_model("tiny", root / "tiny", sparse=False)
    return root / "tiny"


@pytest.fixture
def serve(start_sim, host: Path, tiny: Path):  # noqa: F811
    """``serve(broken=False)`` starts a simulator serving "tiny" (on GPU 0, then 1); returns its port."""
    started: list[int] = []

    def start(broken: bool = False) -> int:
        env = {"VLLM_SIM_BATCH_NOISE": "0", **({"VLLM_SIM_BROKEN_QUANTIZATION": "1"} if broken else {})}
        s = start_sim(
            host, tiny, "--served-model-name", "tiny", "--max-model-len", "4096", env=env, gpus=str(len(started))
        )
        started.append(s.port)
        assert s.wait_for("Application startup complete.", 60), s.log
        return int(s.port)

    return start


def deploy(tmp_path: Path, cluster: FakeCluster, p1: int, p2: int, release: ReleaseGates) -> Any:
    inv = inventory(p1, p2)
    d = Gated(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=cluster.transport),
        str(tmp_path / "deploy"),
        DeployOptions(serial=parse_serial("1,100%")),
        release=release,
    )
    return d.run()


def test_gate_values_parse_and_bad_ones_name_the_value() -> None:
    g = parse_gates(["drift", "bench:i2"], bench_tolerance=0.2)
    assert (g.drift_baseline, g.bench_reference, g.bench_tolerance) == ("previous", "i2", 0.2)
    assert parse_gates(["drift:ref-1"]).drift_baseline == "ref-1"
    assert not parse_gates([]).any and parse_gates([], record_baseline="previous").any
    for bad, words in [
        (["speed"], "expected drift"),
        (["bench"], "needs a reference"),
        (["drift", "drift:x"], "already given"),
        (["drift:../x"], "name is letters"),
        (["bench:https://h:8000"], "no https"),
        (["bench:http://h:8000/v2"], "no path"),
    ]:
        with pytest.raises(ClusterctlError, match=words) as e:
            parse_gates(bad)
        assert bad[-1].split(":", 1)[-1] in str(e.value)
    with pytest.raises(ClusterctlError, match="record-baseline|name is letters"):
        parse_gates([], record_baseline="a b")


def test_a_drifting_canary_fails_the_drift_gate_is_rolled_back_and_stops_the_rollout(tmp_path: Path, serve) -> None:
    good, broken = serve(), serve(broken=True)
    record_previous(f"http://127.0.0.1:{good}", None, "previous", tmp_path / "st")
    c = FakeCluster()
    rep = deploy(tmp_path, c, broken, good, ReleaseGates("previous", state_dir=tmp_path / "st"))
    assert rep.result == "rolled_back"
    assert c.ops("apply") == ["h01"] and c.ops("rollback") == ["h01"]
    assert {h: o.status for h, o in rep.hosts.items()} == {"h01": "rolled_back", "h02": "not_reached"}
    [health, drift] = rep.hosts["h01"].gates
    assert health.ok and drift.step == "drift" and not drift.ok
    assert "drifted from baseline 'previous'" in drift.reason and "i1" in (rep.hosts["h01"].error or "")
    rec = audit.read(tmp_path / "deploy")[-1]
    assert rec["result"] == "rolled_back" and "h01 (i1: outputs drifted from baseline" in rec["detail"]


def test_outputs_that_match_the_baseline_pass_and_the_rollout_goes_on(tmp_path: Path, serve) -> None:
    p1, p2 = serve(), serve()
    record_previous(f"http://127.0.0.1:{p1}", None, "previous", tmp_path / "st")
    c = FakeCluster()
    rep = deploy(tmp_path, c, p1, p2, ReleaseGates("previous", state_dir=tmp_path / "st"))
    assert rep.result == "ok" and sorted(c.ops("apply")) == ["h01", "h02"] and c.ops("rollback") == []
    for h in ("h01", "h02"):
        assert [(g.step, g.ok) for g in rep.hosts[h].gates] == [("completion", True), ("drift", True)]


def test_a_missing_baseline_fails_the_gate_closed(tmp_path: Path, serve) -> None:
    p = serve()
    rep = deploy(tmp_path, FakeCluster(), p, p, ReleaseGates("previous", state_dir=tmp_path / "st"))
    assert rep.result == "rolled_back" and "could not run" in rep.hosts["h01"].gates[-1].reason


def test_record_baseline_reads_the_running_version_before_anything_is_applied(tmp_path: Path, serve) -> None:
    p1, p2 = serve(), serve()
    c = FakeCluster(running=["i1", "i2"])
    seen: list[tuple[str, list[str]]] = []

    def rec(url: str, key: str | None, name: str) -> str:
        seen.append((url, c.ops("apply")))
        return record_previous(url, key, name, tmp_path / "st")

    inv = inventory(p1, p2)
    d = Gated(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=c.transport),
        str(tmp_path / "deploy"),
        DeployOptions(serial=parse_serial("1,100%")),
        release=ReleaseGates("previous", record_baseline="previous", state_dir=tmp_path / "st"),
        recorder=rec,
    )
    rep = d.run()
    assert seen == [(f"http://127.0.0.1:{p1}", [])]  # one instance, before any apply
    assert (tmp_path / "st" / "drift" / "baselines" / "previous.json").is_file()
    assert rep.result == "ok" and all(g.ok for h in rep.hosts.values() for g in h.gates)


def test_record_baseline_refuses_a_deploy_that_changes_several_models(tmp_path: Path) -> None:
    c = FakeCluster(running=["i1", "i2"])
    inv = inventory(1, 2, model2="other")
    d = Gated(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=c.transport),
        str(tmp_path / "deploy"),
        DeployOptions(),
        release=ReleaseGates(record_baseline="previous"),
        recorder=lambda u, k, n: pytest.fail("nothing may be recorded"),
    )
    with pytest.raises(ClusterctlError, match="2 models .*--instances"):
        d.run()
    assert c.ops("apply") == []


def test_an_unreachable_bench_reference_fails_the_canary_closed(tmp_path: Path, serve) -> None:
    p = serve()
    c = FakeCluster()
    rep = deploy(tmp_path, c, p, p, ReleaseGates(bench_reference=f"http://127.0.0.1:{free_port()}"))
    assert rep.result == "rolled_back" and c.ops("apply") == ["h01"]
    [_, bench] = rep.hosts["h01"].gates
    assert bench.step == "bench" and not bench.ok and re.search(r"canary 0, reference [1-9]\d*\b", bench.reason)


def test_an_inconclusive_bench_gate_keeps_the_canary_and_pauses_the_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Untrusted or too noisy numbers are no regression (the canary is not rolled back) and no pass (the
    rollout does not go on): the batch keeps the change, later hosts are untouched, the result is paused."""
    from clusterctl.bench.gate import GateOutcome
    from clusterctl.drift import release

    why = "bench gate inconclusive: the load generator's numbers cannot be trusted; give it a core of its own"
    monkeypatch.setattr(release, "bench_gate", lambda *a, **kw: GateOutcome(False, why, inconclusive=True))
    c = FakeCluster()
    rep = deploy(tmp_path, c, 8001, 8002, ReleaseGates(bench_reference=f"http://127.0.0.1:{free_port()}"))
    assert rep.result == "paused" and not rep.ok
    assert c.ops("apply") == ["h01"] and c.ops("rollback") == []
    assert (rep.hosts["h01"].status, rep.hosts["h02"].status) == ("held", "not_reached")
    assert rep.hosts["h01"].error == f"i1: {why}" and "paused" in (rep.hosts["h02"].error or "")
    [_, bench] = rep.hosts["h01"].gates
    assert (bench.step, bench.ok, bench.inconclusive) == ("bench", False, True)
    assert bench.to_dict()["inconclusive"] is True


def test_a_bench_reference_is_skipped_once_this_run_upgraded_it(tmp_path: Path) -> None:
    inv = inventory(8001, 8002)
    d = ReleaseDeploy(
        inv,
        list(inv.hosts.values()),
        lambda hs: None,
        str(tmp_path),
        DeployOptions(),
        release=ReleaseGates(bench_reference="i2"),
    )
    d.instances = dict(inv.instances)
    canary = gates.GateTarget("i1", "h01", "127.0.0.1", 8001, "tiny")
    ref = d._reference(canary)
    assert ref is not None and (ref.instance, ref.url) == ("i2", "http://127.0.0.1:8002")
    d.applied.add("i2")
    assert d._reference(canary) is None
    d.release = ReleaseGates(bench_reference="nope")
    with pytest.raises(ClusterctlError, match="no such instance"):
        d._reference(canary)


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--gate", "speed"], "--gate 'speed': expected drift, drift:BASELINE or bench:REFERENCE"),
        (["--gate", "bench"], "bench needs a reference"),
        (["--record-baseline", "no/such"], "name is letters"),
        (["--gate", "drift", "--playbook", "pb.yaml"], "do not go with --playbook"),
    ],
)
def test_bad_gate_flags_exit_3_before_any_host_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], msg: str
) -> None:
    from clusterctl.cli.main import main
    from clusterctl.exitcodes import ExitCode

    monkeypatch.setenv("CLUSTERCTL_STATE_DIR", str(tmp_path / "state"))
    p = tmp_path / "inv.yaml"
    p.write_text(INVENTORY_TEXT.format(p1=8001, p2=8002, model2="tiny"))
    assert main(["deploy", "-i", str(p), *args]) == ExitCode.UNKNOWN
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err
