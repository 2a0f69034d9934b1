"""``run_failover``'s steps with the hosts replaced: order, what is recorded, what a failed move leaves."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from clusterctl.deploy.rollout import engine, lifecycle
from clusterctl.deploy.rollout.gates import GateResult
from clusterctl.deploy.placement.place import desired_instances
from clusterctl.deploy.rollout.plan import Plan
from clusterctl.deploy.state import StateStore
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.errors import ClusterctlError
from clusterctl.gateway import failover, observe, sync
from clusterctl.gateway import state as gwstate
from clusterctl.gateway.failover import Detection, FailoverOptions, run_failover
from clusterctl.gateway.sync import Observed, SyncResult
from clusterctl.inventory.loader import load_inventory_text

from .conftest import INVENTORY as BASE

#: The gateway tests' hosts and engine; one template instead of explicit instances.
INVENTORY = (
    BASE[: BASE.index("models:")]
    + """\
models:
  qwen: {path: /models/qwen3-8b}
templates:
  pool: {model: qwen, engine: vllm, replicas: 2, tp: 2, hosts: 'gpu[01-02]', port_base: 8001}
gateway:
  hosts: gw01
  port: 8080
"""
)


class Recorder:
    """Stands in for the hosts: records every step in order."""

    def __init__(self, state_dir: Path, deploy_error: str | None = None, gate_ok: bool = True) -> None:
        self.steps: list[str] = []
        self.state_dir, self.deploy_error, self.gate_ok = state_dir, deploy_error, gate_ok
        self.synced: dict[str, Any] = {}

    def mark_down(self, name: str, reason: str = "drain") -> None:
        self.steps.append(f"mark_down {name}")

        def change(st: gwstate.GatewayState) -> None:
            st.marked_down[name] = {"reason": reason}

        gwstate.update(self.state_dir, change)

    def stop(self, inv: Any, fleet: Any, instances: Any, **kw: Any) -> list[Any]:
        self.steps += [f"stop {i.name}" for i in instances]
        return [lifecycle.ActionResult(i.name, i.placement[0].host, "stop", ok=True) for i in instances]

    def deploy(
        self, inv: Any, hosts: Any, make_fleet: Any, state_dir: str, opts: Any, on_event: Any = None, **kw: Any
    ) -> Any:
        rec = self

        class FakeDeploy:
            def run(self) -> engine.DeployReport:
                rec.steps.append(f"deploy {opts.instances}")
                if rec.deploy_error:
                    raise ClusterctlError(rec.deploy_error)
                placed = StateStore(state_dir).load().placements["pool"]
                rep = engine.DeployReport("r1", Plan([]), "ok")
                for name in opts.instances.split(","):
                    host = placed[name].host
                    out = rep.hosts.setdefault(host, engine.HostOutcome(host, "applied", 1))
                    out.gates.append(
                        GateResult(
                            name,
                            host,
                            rec.gate_ok,
                            "completion",
                            "" if rec.gate_ok else "no completion within 60 s",
                            0.1,
                        )
                    )
                return rep

        return FakeDeploy()

    def sync_gateway(self, inv: Any, fleet: Any, instances: Any, servers: Any, **kw: Any) -> SyncResult:
        self.steps.append("sync")
        self.synced = dict(servers)
        return SyncResult("d" * 64, dict(servers), True)


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    inv = load_inventory_text(INVENTORY, "inv.yaml")
    state_dir = tmp_path / "state"
    store = StateStore(state_dir)
    store.save_placements(desired_instances(inv, store.load()).state.placements)
    where = store.load().placements["pool"]["pool-1"]
    lost = Finding("gpu.lost", Severity.CRIT, where.host, f"gpu:{where.gpus[0]}", "GPU has fallen off the bus")
    monkeypatch.setattr(
        failover, "detect", lambda *a, **k: Detection({"pool-1": "UNAVAILABLE: member lost"}, [lost], {})
    )

    def make(rec: Recorder) -> Recorder:
        monkeypatch.setattr(failover, "_hook", lambda *a: rec)
        monkeypatch.setattr(lifecycle, "stop_instances", rec.stop)
        monkeypatch.setattr(engine, "Deploy", rec.deploy)
        monkeypatch.setattr(
            observe,
            "observe",
            lambda inv, instances, *a, **k: ({n: Observed("serving", 0.2) for n in instances}, set()),
        )
        monkeypatch.setattr(sync, "sync_gateway", rec.sync_gateway)
        return rec

    return inv, state_dir, where, make


def _fleet(hosts: Any) -> Any:
    return contextlib.nullcontext()


def test_a_move_cordons_marks_down_stops_rolls_out_and_brings_the_replica_back(setup: Any) -> None:
    inv, state_dir, where, make = setup
    rec = make(Recorder(state_dir))
    rep = run_failover(inv, state_dir, _fleet, FailoverOptions(max_share=0.5))
    assert rep.exit_code == 0 and rep.moved == {"pool-1": None}
    assert rec.steps == ["mark_down pool-1", "stop pool-1", "deploy pool-1", "sync"]
    state = StateStore(state_dir).load()
    assert state.cordons[f"{where.host}:{where.gpus[0]}"].reason == "failover: gpu.lost: GPU has fallen off the bus"
    new = state.placements["pool"]["pool-1"]
    assert not (new.host == where.host and set(new.gpus) & set(where.gpus))
    assert "pool-1" not in gwstate.load(state_dir).marked_down  # marked up again
    assert not rec.synced["pool-1"].down


@pytest.mark.parametrize("deploy_error, gate_ok", [("the deploy lock is held by ops@ctl2", True), (None, False)])
def test_a_failed_move_exits_2_and_the_replica_stays_marked_down(
    setup: Any, deploy_error: str | None, gate_ok: bool
) -> None:
    inv, state_dir, where, make = setup
    rec = make(Recorder(state_dir, deploy_error, gate_ok))
    rep = run_failover(inv, state_dir, _fleet, FailoverOptions(max_share=0.5))
    assert rep.exit_code == 2 and rep.moved["pool-1"] is not None
    assert "pool-1" in gwstate.load(state_dir).marked_down
    assert rec.synced["pool-1"].down  # the sync keeps it out of the gateway


def test_plan_only_and_the_cap_change_nothing(setup: Any) -> None:
    inv, state_dir, where, make = setup
    rec = make(Recorder(state_dir))
    before = StateStore(state_dir).load()
    assert run_failover(inv, state_dir, _fleet, FailoverOptions(plan_only=True)).plan.over_cap == ["pool-1"]
    rep = run_failover(inv, state_dir, _fleet, FailoverOptions(max_share=0.25))  # 2 instances: cap 0
    assert rep.exit_code == 1 and rep.plan.over_cap == ["pool-1"]
    assert rec.steps == [] and StateStore(state_dir).load() == before


def test_detect_reads_the_gpu_pairs_typed_and_a_malformed_gpus_section_gives_no_topology(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inv = load_inventory_text(INVENTORY, filename="t.yaml")
    docs: dict[str, Any] = {
        "gpu01": {"gpus": {"topology": [{"gpus": [0, 1], "level": "NODE"}, {"gpus": ["0", 1]}, "junk"]}},
        "gpu02": {"gpus": ["not", "a", "section"]},  # was AttributeError: 'list' object has no attribute 'get'
        "gpu03": {"schema": 2, "gpus": {"topology": [{"gpus": [0, 1], "level": "NODE"}]}},
    }
    snap = type("Snap", (), {"facts": docs, "missing": {}})()
    monkeypatch.setattr(failover.snapshot, "gather", lambda *a, **k: snap)
    monkeypatch.setattr(failover.bundle, "context", lambda *a, **k: None)
    monkeypatch.setattr(failover, "check_tp_groups", lambda ctx: [])
    monkeypatch.setattr(failover, "run_analyzers", lambda ctx, only: [])
    det = failover.detect(inv, {}, None, ["gpu01", "gpu02"])
    assert det.topology == {"gpu01": [{"gpus": [0, 1], "level": "NODE"}]}
