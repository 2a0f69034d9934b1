"""Deciding the gateway's server states and when sync reloads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.errors import ConfigError
from clusterctl.gateway import state as gwstate
from clusterctl.gateway import sync as gwsync
from clusterctl.gateway.deploy import GatewayHostResult
from clusterctl.gateway.hook import Hook
from clusterctl.gateway.render import ServerState
from clusterctl.gateway.sync import Observed, decide, sync_gateway, tp_unavailable
from clusterctl.inventory.model import Inventory

SERVING = {n: Observed("serving", 0.0) for n in ("q1", "q2", "q3", "l1")}


def test_decide_marks_down_what_must_not_get_traffic(inv: Inventory) -> None:
    observed = {**SERVING, "q2": Observed("unhealthy", 1.0, healthy=False), "l1": Observed("serving", 0.35)}
    states = decide(inv, inv.instances, observed, marked_down={"q3": {"reason": "drain"}}, unavailable={"q1"})
    assert states["q1"] == ServerState(True, 1, "TP group UNAVAILABLE")
    assert states["q2"] == ServerState(True, 1, "unhealthy")
    assert states["q3"] == ServerState(True, 1, "marked down: drain")
    assert states["l1"] == ServerState(False, 60)  # 100 x (1 - 0.35) in steps of 10


def test_a_unit_that_is_down_is_down_at_the_gateway_with_its_reason(inv: Inventory) -> None:
    observed = {
        **SERVING,
        "q1": Observed("failed", reason="unit failed (failed): the process exited with status 1"),
        "q2": Observed("stopped"),
    }
    states = decide(inv, inv.instances, observed)
    assert states["q1"] == ServerState(True, 1, "failed: unit failed (failed): the process exited with status 1")
    assert states["q2"] == ServerState(True, 1, "stopped")


def test_decide_weights_by_throughput_only_for_mixed_gpu_models(inv: Inventory) -> None:
    observed = {**SERVING, "q1": Observed("serving", 0.0, 500.0), "q2": Observed("serving", 0.0, 1000.0)}
    assert decide(inv, inv.instances, observed)["q1"].weight == 100  # same GPU model: no capacity term
    inv.hosts["gpu01"].gpus.model = "L40S"
    states = decide(inv, inv.instances, observed)
    assert (states["q1"].weight, states["q2"].weight) == (50, 100)


def test_missing_status_and_full_load(inv: Inventory) -> None:
    states = decide(inv, inv.instances, {"q1": Observed("serving", 1.0)})
    assert states["q1"] == ServerState(False, 1)  # loaded, still serving: least weight, not down
    assert states["q2"] == ServerState(True, 1, "no status")


def test_tp_unavailable_reads_only_crit_tp_group_findings() -> None:
    f = [
        Finding("tp.group", Severity.CRIT, "gpu01", "tp-group:q1", "UNAVAILABLE", "", {}),
        Finding("tp.group", Severity.WARN, "gpu01", "tp-group:l1", "DEGRADED", "", {}),
        Finding("gpu.xid", Severity.CRIT, "gpu01", "gpu:0", "xid", "", {}),
    ]
    assert tp_unavailable(f) == {"q1"}


class _Applied:
    def __init__(self, ok: bool = True) -> None:
        self.calls: list[str] = []
        self.ok = ok

    def __call__(self, fleet: Any, rendered: Any, *, port: int, hosts: list[str]) -> list[GatewayHostResult]:
        self.calls.append(rendered.digest)
        return [
            GatewayHostResult(h, self.ok, True, True, "reloaded", None if self.ok else "nginx -t: boom") for h in hosts
        ]


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> _Applied:
    monkeypatch.setenv("GW_TEST_KEY", "sk-unit")
    a = _Applied()
    monkeypatch.setattr(gwsync, "apply_gateway", a)
    return a


def test_sync_reloads_on_change_only_and_once_per_interval(inv: Inventory, tmp_path: Path, applied: _Applied) -> None:
    assert inv.gateway is not None
    inv.gateway.dispatch = "least_conn"  # weights and health in the config: a reload per change
    clock = [1000.0]
    up = decide(inv, inv.instances, SERVING)
    r = sync_gateway(inv, None, inv.instances, up, state_dir=tmp_path, now=lambda: clock[0])
    assert r.changed and r.skipped is None and len(applied.calls) == 1
    clock[0] += 1
    assert sync_gateway(inv, None, inv.instances, up, state_dir=tmp_path, now=lambda: clock[0]).skipped == "unchanged"
    down = {**up, "q1": ServerState(True, 1, "stopped")}
    r = sync_gateway(inv, None, inv.instances, down, state_dir=tmp_path, now=lambda: clock[0])
    assert r.skipped == "interval" and r.next_allowed_s == pytest.approx(4.0) and len(applied.calls) == 1
    assert gwstate.load(tmp_path).servers["q1"].down  # decided states are kept for the hook
    r = sync_gateway(inv, None, inv.instances, down, state_dir=tmp_path, force=True, now=lambda: clock[0])
    assert r.skipped is None and len(applied.calls) == 2
    assert sync_gateway(inv, None, inv.instances, up, state_dir=tmp_path, dry_run=True).skipped == "dry-run"
    assert len(applied.calls) == 2


def test_failed_apply_is_retried_next_time(inv: Inventory, tmp_path: Path, applied: _Applied) -> None:
    applied.ok = False
    up = decide(inv, inv.instances, SERVING)
    assert not sync_gateway(inv, None, inv.instances, up, state_dir=tmp_path).ok
    applied.ok = True
    r = sync_gateway(inv, None, inv.instances, up, state_dir=tmp_path)
    assert r.ok and r.skipped is None and len(applied.calls) == 2


class _Fleet:
    def __enter__(self) -> "_Fleet":
        return self

    def __exit__(self, *a: object) -> None:
        pass


def test_hook_marks_down_and_up_at_once(inv: Inventory, tmp_path: Path, applied: _Applied) -> None:
    hook = Hook(inv, tmp_path, lambda: dict(inv.instances), _Fleet)
    hook.mark_down("q1", "drain")
    st = gwstate.load(tmp_path)
    assert "q1" in st.marked_down and st.servers["q1"].down and "by" in st.marked_down["q1"]
    assert gwstate.marked_down(tmp_path) == {"q1": "drain"}
    hook.mark_up("q1")
    st = gwstate.load(tmp_path)
    assert st.marked_down == {} and not st.servers["q1"].down
    assert len(applied.calls) == 2 and applied.calls[0] != applied.calls[1]  # both forced past the interval


def test_hook_raises_when_a_gateway_host_fails(inv: Inventory, tmp_path: Path, applied: _Applied) -> None:
    applied.ok = False
    with pytest.raises(Exception, match="nginx -t: boom"):
        Hook(inv, tmp_path, lambda: dict(inv.instances), _Fleet).mark_down("q1")


def test_corrupt_state_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "gateway.json").write_text("{not json")
    with pytest.raises(ConfigError, match="gateway.json"):
        gwstate.load(tmp_path)
    (tmp_path / "gateway.json").write_text(json.dumps({"servers": {"q1": {"weight": 3}}}))
    with pytest.raises(ConfigError, match="not in the expected form"):
        gwstate.load(tmp_path)


def test_least_score_health_and_load_go_as_scores_without_reload(
    inv: Inventory, tmp_path: Path, applied: _Applied, monkeypatch: pytest.MonkeyPatch
) -> None:
    pushed: list[dict[str, Any]] = []

    def push(fleet: Any, rendered: Any, scores: dict[str, Any], *, port: int, hosts: list[str]) -> list[Any]:
        pushed.append(scores)
        return [GatewayHostResult(h, True, action="scores") for h in hosts]

    monkeypatch.setattr(gwsync, "push_scores", push)
    assert inv.gateway is not None
    inv.gateway.dispatch = "least_score"
    busy = {n: Observed("serving", 0.5, None, True, running=6, waiting=2, kv_usage=0.3, seats=8) for n in inv.instances}
    up = decide(inv, inv.instances, busy)
    r = sync_gateway(inv, None, inv.instances, up, state_dir=tmp_path, observed=busy)
    assert r.ok and len(applied.calls) == 1 and len(pushed) == 1
    assert pushed[0]["instances"]["q1"] == {"down": False, "load": 0.3, "step": 0.125, "cap": 1.0}  # 1 / 8 seats
    # q1 stops serving, q2's TP group fails: scores only, the config (and so nginx) unchanged
    worse = {**busy, "q1": Observed("stopped", None, None, False)}
    servers = decide(inv, inv.instances, worse, unavailable={"q2"})
    r = sync_gateway(inv, None, inv.instances, servers, state_dir=tmp_path, observed=worse)
    assert r.skipped == "unchanged" and len(applied.calls) == 1 and len(pushed) == 2
    assert pushed[1]["instances"]["q1"]["down"] and pushed[1]["instances"]["q2"]["down"]
    # a drain's mark-down is in the config (a reload), and not a down score
    drained = decide(inv, inv.instances, busy, marked_down={"q1": {"reason": "drain"}})
    r = sync_gateway(inv, None, inv.instances, drained, state_dir=tmp_path, observed=busy, force=True)
    assert r.skipped is None and len(applied.calls) == 2 and not pushed[2]["instances"]["q1"]["down"]


def test_dispatch_scores_weigh_capacity_and_kv(inv: Inventory) -> None:
    from clusterctl.gateway.sync import dispatch_scores

    obs = {
        "q1": Observed("serving", 0.1, 100.0, True, running=2, waiting=0, kv_usage=0.9, seats=4),
        "q2": Observed("serving", 0.1, 50.0, True, running=2, waiting=0, kv_usage=0.1, seats=4),
    }
    sc = dispatch_scores(inv, {n: inv.instances[n] for n in obs}, obs, {}, 5.0)["instances"]
    assert (sc["q1"]["load"], sc["q1"]["step"], sc["q2"]["cap"]) == (0.9, 0.25, 1.0)  # same GPU model: cap 1
    inv.hosts["gpu02"].gpus.model = "L40S"  # mixed GPU models: q2 runs at half q1's measured peak
    sc = dispatch_scores(inv, {n: inv.instances[n] for n in obs}, obs, {}, 5.0)["instances"]
    assert (sc["q2"]["cap"], sc["q2"]["step"], sc["q1"]["cap"]) == (0.5, 0.25, 1.0)


def _pool_inventory() -> Inventory:
    """The unit inventory with ``l1`` replaced by a 1P:1D pool ``lpool`` whose router is on gw01."""
    from clusterctl.inventory.loader import load_inventory_text

    from .conftest import INVENTORY

    text = INVENTORY.replace(
        "  l1: {model: llama, engine: vllm, placement: ['gpu01:[2-3]'], port: 8003}\n",
        "  lp: {model: llama, engine: vllm, placement: ['gpu01:2'], port: 8003, role: prefill}\n"
        "  ld: {model: llama, engine: vllm, placement: ['gpu02:2'], port: 8003, role: decode}\n"
        "pd_pools:\n  lpool: {model: llama, router: {host: gw01, port: 8300}}\n",
    )
    return load_inventory_text(text, "inv.yaml")


def test_hook_marks_a_pools_router_down_in_the_config(tmp_path: Path, applied: _Applied) -> None:
    # a drain of router-P (deploy/rollout/routerdrain.py): the gateway's only server of the pool's model goes down
    pinv = _pool_inventory()
    hook = Hook(pinv, tmp_path, lambda: dict(pinv.instances), _Fleet)
    hook.mark_down("router-lpool", "drain")
    assert gwstate.load(tmp_path).servers["router-lpool"] == ServerState(True, 1, "marked down: drain")
    hook.mark_up("router-lpool")
    assert not gwstate.load(tmp_path).servers["router-lpool"].down


def test_a_sync_while_a_pools_router_is_drained_keeps_it_down(tmp_path: Path, applied: _Applied) -> None:
    # deploy drains router-P before it restarts it (routerdrain.py); a `gateway sync` meanwhile (what the CLI
    # does: decide from the instances sync measures, the router is none of them) must not put it back
    pinv = _pool_inventory()
    serving = {n: Observed("serving", 0.0, 100.0, True) for n in pinv.instances}

    def sync() -> gwsync.SyncResult:
        marked = gwstate.load(tmp_path).marked_down
        servers = decide(pinv, pinv.instances, serving, marked_down=marked)
        return sync_gateway(pinv, None, pinv.instances, servers, state_dir=tmp_path, force=True)

    hook = Hook(pinv, tmp_path, lambda: dict(pinv.instances), _Fleet)
    hook.mark_down("router-lpool", "drain")
    drained = applied.calls[-1]
    r = sync()
    assert r.servers["router-lpool"] == ServerState(True, 1, "marked down: drain")
    assert r.skipped == "unchanged" and applied.calls[-1] == drained  # no reload that re-ups the router
    hook.mark_up("router-lpool")
    r = sync()
    assert "router-lpool" not in r.servers and r.skipped == "unchanged"  # up, as the mark-up left it
    assert applied.calls[-1] != drained
