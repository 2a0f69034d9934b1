"""Failover's decision: the cap, what moves where, what is only marked down, which GPUs get cordoned."""

from __future__ import annotations

import pytest

from clusterctl.deploy.placement.place import desired_instances
from clusterctl.deploy.state import DeployState
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.gateway.failover_plan import cap_for, plan_failover

from tests.unit.deploy.placement_helpers import cordoned, inventory

POOL = ("pool", 4, 2, "h[1-2]", 8000)


def _lost(host: str, gpu: int) -> Finding:
    return Finding("gpu.lost", Severity.CRIT, host, f"gpu:{gpu}", "GPU has fallen off the bus (NVML: GPU is lost)")


def _placed(hosts: dict[str, int], templates=(POOL,), instances=None, state: DeployState | None = None):
    inv = inventory(hosts, templates, instances)
    res = desired_instances(inv, state or DeployState())
    return inv, res.instances, res.state


@pytest.mark.parametrize(
    "total, share, cap", [(4, 0.25, 1), (3, 0.25, 0), (8, 0.25, 2), (10, 0.1, 1), (10, 1.0, 10), (5, 0.0, 0)]
)
def test_the_cap_is_the_share_of_all_instances_rounded_down(total: int, share: float, cap: int) -> None:
    assert cap_for(total, share) == cap


def test_a_replica_on_a_lost_gpu_moves_off_both_its_gpus_and_the_lost_one_is_cordoned() -> None:
    inv, instances, state = _placed({"h1": 8, "h2": 8})
    where = state.placements["pool"]["pool-1"]
    plan = plan_failover(
        instances,
        {"pool-1": "UNAVAILABLE"},
        state,
        inv,
        max_share=0.25,
        gpu_findings=[_lost(where.host, where.gpus[1]), _lost("h2", 7)],
        who="t@x",
        when="now",
    )
    [move] = plan.moves
    assert move.instance == "pool-1" and move.old == where
    assert not set(move.new.gpus) & set(where.gpus) or move.new.host != where.host
    # Only the failed member of the group taken out; the other host's lost GPU is not this run's business.
    assert list(plan.cordons) == [f"{where.host}:{where.gpus[1]}"]
    assert plan.cordons[f"{where.host}:{where.gpus[1]}"].reason.startswith("failover: gpu.lost: GPU has fallen")
    assert plan.taken_out == ["pool-1"] and not plan.over_cap and not plan.fixed
    # The others stay where they are.
    assert {n: p for n, p in plan.placement.state.placements["pool"].items() if n != "pool-1"} == {
        n: p for n, p in state.placements["pool"].items() if n != "pool-1"
    }


def test_over_the_cap_instances_are_listed_and_left_alone() -> None:
    inv, instances, state = _placed({"h1": 8, "h2": 8})
    bad = {"pool-3": "UNAVAILABLE", "pool-1": "UNAVAILABLE", "pool-2": "UNAVAILABLE"}
    plan = plan_failover(instances, bad, state, inv, max_share=0.5)  # 4 instances: 2 per run
    assert [m.instance for m in plan.moves] == ["pool-1", "pool-2"]
    assert plan.over_cap == ["pool-3"]
    zero = plan_failover(instances, bad, state, inv, max_share=0.1)
    assert zero.cap == 0 and not zero.moves and zero.over_cap == ["pool-1", "pool-2", "pool-3"]
    assert not zero.cordons and zero.placement is None


def test_an_explicit_instance_is_marked_down_not_moved_and_counts_against_the_cap() -> None:
    inv, instances, state = _placed({"h1": 8, "h2": 8}, instances={"fixed": ("h1", [6, 7], 9000)})
    plan = plan_failover(
        instances,
        {"fixed": "UNAVAILABLE", "pool-2": "UNAVAILABLE"},
        state,
        inv,
        max_share=0.2,
        gpu_findings=[_lost("h1", 7)],
    )
    assert plan.cap == 1 and plan.fixed == ["fixed"] and not plan.moves and plan.over_cap == ["pool-2"]
    assert plan.taken_out == ["fixed"] and list(plan.cordons) == ["h1:7"]


def test_an_operators_cordon_is_kept_as_it_is_and_never_lifted() -> None:
    inv, instances, state = _placed({"h1": 8, "h2": 8})
    where = state.placements["pool"]["pool-1"]
    state = cordoned(f"{where.host}:{where.gpus[0]}", "h2:6", state=state)
    plan = plan_failover(
        instances,
        {"pool-1": "UNAVAILABLE"},
        state,
        inv,
        max_share=0.25,
        gpu_findings=[_lost(where.host, where.gpus[0])],
    )
    assert not plan.cordons  # already cordoned by the operator: not replaced
    new_state = plan.placement.state
    assert new_state.cordons == state.cordons  # placement copies them, adds and removes none
    assert "h2" != plan.moves[0].new.host or 6 not in plan.moves[0].new.gpus  # and avoids the operator's one


def test_a_host_wide_finding_cordons_the_host_and_the_replica_leaves_it() -> None:
    inv, instances, state = _placed({"h1": 8, "h2": 8})
    where = state.placements["pool"]["pool-1"]
    nvml = Finding("gpu.nvml", Severity.CRIT, where.host, "host", "NVML cannot be initialised")
    plan = plan_failover(instances, {"pool-1": "UNAVAILABLE"}, state, inv, max_share=0.25, gpu_findings=[nvml])
    assert list(plan.cordons) == [where.host]
    assert plan.moves[0].new.host != where.host


def test_no_room_means_marked_down_and_not_moved() -> None:
    inv, instances, state = _placed({"h1": 4, "h2": 4})  # 4 replicas of TP 2 fill both hosts
    plan = plan_failover(instances, {"pool-2": "UNAVAILABLE"}, state, inv, max_share=0.25)
    assert not plan.moves and "not enough free uncordoned GPUs" in plan.no_room["pool-2"]
    assert plan.taken_out == ["pool-2"]


def test_nothing_unavailable_is_nothing_to_do() -> None:
    inv, instances, state = _placed({"h1": 8, "h2": 8})
    plan = plan_failover(instances, {"gone": "UNAVAILABLE"}, state, inv, max_share=1.0)
    assert plan.nothing and not plan.taken_out and plan.to_json()["moves"] == []


def test_a_node_level_action_cordons_the_whole_host_and_the_group_leaves_it() -> None:
    # gpu.lost's own action (diagnose/gpu.py) and XID 79's bucket (checks/xid.yaml) both say "drain the node".
    inv, instances, state = _placed({"h1": 8, "h2": 8})
    where = state.placements["pool"]["pool-1"]
    lost = Finding(
        "gpu.lost",
        Severity.CRIT,
        where.host,
        f"gpu:{where.gpus[1]}",
        "GPU has fallen off the bus (NVML: GPU is lost)",
        action="drain the node and power-cycle it; replace the GPU if it happens again",
    )
    plan = plan_failover(instances, {"pool-1": "UNAVAILABLE"}, state, inv, max_share=0.25, gpu_findings=[lost])
    assert list(plan.cordons) == [where.host]
    reason = plan.cordons[where.host].reason
    assert reason.startswith(
        f"failover: gpu.lost: GPU has fallen off the bus (NVML: GPU is lost) on GPU {where.gpus[1]}"
    )
    assert "(node-level: drain the node and power-cycle it" in reason
    [move] = plan.moves
    assert move.new.host != where.host  # not two other GPUs of the node doctor says to drain


def test_a_gpu_level_action_cordons_only_that_gpu() -> None:
    inv, instances, state = _placed({"h1": 8, "h2": 8})
    where = state.placements["pool"]["pool-1"]
    xid = Finding(
        "gpu.xid",
        Severity.CRIT,
        where.host,
        f"gpu:{where.gpus[0]}",
        "XID 48 (DBE)",
        action="drain the GPU, reset it, then check remapped rows / SRAM threshold; replace if the DBE recurs",
    )
    plan = plan_failover(instances, {"pool-1": "UNAVAILABLE"}, state, inv, max_share=0.25, gpu_findings=[xid])
    assert list(plan.cordons) == [f"{where.host}:{where.gpus[0]}"]


def test_avoid_host_is_cordoned_with_the_operators_reason_and_not_placed_on() -> None:
    inv, instances, state = _placed({"h1": 8, "h2": 8, "h3": 8})
    where = state.placements["pool"]["pool-1"]
    other = next(h for h in ("h1", "h2", "h3") if h != where.host)
    plan = plan_failover(
        instances,
        {"pool-1": "UNAVAILABLE"},
        state,
        inv,
        max_share=0.25,
        gpu_findings=[_lost(where.host, where.gpus[0])],
        avoid_hosts=[other],
    )
    assert plan.cordons[other].reason == "failover: --avoid-host (operator)"
    [move] = plan.moves
    assert move.new.host != other
    # Nothing to take out: --avoid-host cordons nothing either.
    assert not plan_failover(instances, {}, state, inv, max_share=0.25, avoid_hosts=[other]).cordons


def test_a_node_level_finding_of_an_instance_over_the_cap_still_rules_its_host_out() -> None:
    inv, instances, state = _placed({"h1": 4, "h2": 4, "h3": 8}, templates=(("pool", 4, 2, "h[1-3]", 8000),))
    a, b = state.placements["pool"]["pool-1"], state.placements["pool"]["pool-2"]
    node = "drain the node and power-cycle it; replace the GPU if it happens again"
    lost = [
        Finding("gpu.lost", Severity.CRIT, p.host, f"gpu:{p.gpus[1]}", "GPU has fallen off the bus", action=node)
        for p in (a, b)
    ]
    plan = plan_failover(
        instances, {"pool-1": "UNAVAILABLE", "pool-2": "UNAVAILABLE"}, state, inv, max_share=0.25, gpu_findings=lost
    )
    assert a.host != b.host  # h1 and h2 hold two replicas each; h3 is free
    assert plan.over_cap == ["pool-2"] and set(plan.cordons) == {a.host, b.host}
    [move] = plan.moves
    assert move.new.host not in (a.host, b.host)
