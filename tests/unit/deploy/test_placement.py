"""Placement of template replicas: stable, cordon-aware, topology-aware, port per host slot."""

from __future__ import annotations

from collections import Counter

import pytest

from clusterctl.deploy.placement.place import (
    PlacementError,
    best_group,
    desired_instances,
    replica_number,
    reschedule,
)
from clusterctl.deploy.state import DeployState

from .placement_helpers import cordoned, inventory, topology, where

FOUR_BY_EIGHT = {f"gpu0{i}": 8 for i in range(1, 5)}
POOL = ("pool", 8, 2, "gpu[01-04]", 8000)


def test_eight_replicas_of_tp2_spread_over_four_hosts_of_eight_gpus() -> None:
    res = desired_instances(inventory(FOUR_BY_EIGHT, [POOL]), DeployState())
    assert res.new == [f"pool-{n}" for n in range(1, 9)]
    assert not res.unplaced and not res.moved and not res.removed
    got = where(res)
    assert Counter(h for h, _, _ in got.values()) == {h: 2 for h in FOUR_BY_EIGHT}
    assert got["pool-1"] == ("gpu01", (0, 1), 8000)
    assert got["pool-5"] == ("gpu01", (2, 3), 8001)
    assert all(inst.template == "pool" and inst.tp_size == 2 for inst in res.instances.values())


def test_a_second_run_on_the_saved_state_changes_nothing() -> None:
    inv = inventory(FOUR_BY_EIGHT, [POOL])
    first = desired_instances(inv, DeployState())
    again = desired_instances(inv, first.state)
    assert where(again) == where(first)
    assert not again.changed and again.state.placements == first.state.placements


def test_adding_a_host_moves_nothing() -> None:
    first = desired_instances(inventory(FOUR_BY_EIGHT, [POOL]), DeployState())
    grown = desired_instances(
        inventory({**FOUR_BY_EIGHT, "gpu05": 8}, [("pool", 8, 2, "gpu[01-05]", 8000)]), first.state
    )
    assert where(grown) == where(first)
    assert not grown.new and not grown.moved


@pytest.mark.parametrize("before, after", [(8, 12), (2, 3), (1, 16)])
def test_scale_up_adds_only_new_replicas(before: int, after: int) -> None:
    first = desired_instances(inventory(FOUR_BY_EIGHT, [("pool", before, 2, "gpu[01-04]", 8000)]), DeployState())
    state = first.state.copy()
    state.replicas["pool"] = after
    up = desired_instances(inventory(FOUR_BY_EIGHT, [("pool", before, 2, "gpu[01-04]", 8000)]), state)
    assert up.new == [f"pool-{n}" for n in range(before + 1, after + 1)]
    old = where(first)
    assert {n: p for n, p in where(up).items() if n in old} == old


@pytest.mark.parametrize("before, after", [(8, 5), (8, 0), (3, 1)])
def test_scale_down_removes_the_highest_numbered_replicas(before: int, after: int) -> None:
    inv = inventory(FOUR_BY_EIGHT, [("pool", before, 2, "gpu[01-04]", 8000)])
    first = desired_instances(inv, DeployState())
    state = first.state.copy()
    state.replicas["pool"] = after
    down = desired_instances(inv, state)
    assert down.removed == [f"pool-{n}" for n in range(after + 1, before + 1)]
    assert where(down) == {n: p for n, p in where(first).items() if (replica_number("pool", n) or 0) <= after}
    assert "pool" not in down.state.placements if after == 0 else len(down.state.placements["pool"]) == after


def test_new_replicas_avoid_cordoned_gpus_and_hosts_and_never_uncordon_them() -> None:
    inv = inventory({"a": 4, "b": 4}, [("pool", 3, 2, "a,b", 8000)])
    state = cordoned("a:1", "b")
    res = desired_instances(inv, state)
    assert where(res)["pool-1"][:2] == ("a", (2, 3))
    assert set(res.unplaced) == {"pool-2", "pool-3"}
    assert "cordoned hosts: b" in res.unplaced["pool-2"]
    assert set(res.state.cordons) == {"a:1", "b"}


def test_an_existing_replica_on_a_gpu_cordoned_later_stays_and_is_reported() -> None:
    inv = inventory({"a": 4}, [("pool", 2, 2, "a", 8000)])
    first = desired_instances(inv, DeployState())
    state = cordoned("a:0", state=first.state.copy())
    again = desired_instances(inv, state)
    assert where(again) == where(first)
    assert set(again.on_cordoned) == {"pool-1"}
    assert "a:0 cordoned by ops@here" in again.on_cordoned["pool-1"]


def test_topology_prefers_a_pair_on_one_pcie_switch_over_one_across_sockets() -> None:
    # GPUs 0 and 1 sit on different sockets; 0 shares a switch with 4, 1 with 5.
    topo = topology(switches=[[0, 4], [1, 5], [2, 6], [3, 7]], sockets=[[0, 2, 4, 6], [1, 3, 5, 7]])
    inv = inventory({"a": 8}, [("pool", 4, 2, "a", 8000)])
    res = desired_instances(inv, DeployState(), topology={"a": topo})
    assert sorted(g for _, g, _ in where(res).values()) == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_topology_prefers_the_same_socket_when_no_switch_pair_is_left() -> None:
    topo = topology(switches=[], sockets=[[0, 2], [1, 3]])
    assert best_group([0, 1, 2, 3], 2, topo) == (0, 2)
    assert best_group([0, 1, 3], 2, topo) == (1, 3)


@pytest.mark.parametrize(
    "free, tp, want",
    [
        ([0, 1, 2, 3], 2, (0, 1)),
        ([1, 2, 3, 5, 6], 3, (1, 2, 3)),
        ([0, 2, 3, 7], 2, (2, 3)),
        ([0, 3], 3, None),
        ([0, 1, 2, 4], 1, (4,)),  # best fit: the lone GPU, keeping 0-2 whole
        ([0, 1, 2, 3, 5, 6], 2, (5, 6)),
        ([0, 1, 2, 3, 5, 6], 3, (0, 1, 2)),
    ],
)
def test_without_topology_contiguous_indexes_are_chosen(free: list[int], tp: int, want: tuple[int, ...] | None) -> None:
    assert best_group(free, tp) == want


def test_not_enough_gpus_leaves_replicas_unplaced_with_the_reason() -> None:
    inv = inventory({"a": 4, "b": 2}, [("pool", 4, 2, "a,b", 8000)], {"x": ("b", [0], 9000)})
    res = desired_instances(inv, DeployState())
    assert res.new == ["pool-1", "pool-2"] and list(res.unplaced) == ["pool-3", "pool-4"]
    reason = res.unplaced["pool-4"]
    assert "not enough free uncordoned GPUs" in reason and "needs 2 on one host" in reason
    assert "b 1" in reason and "pool-4" not in res.instances


def test_explicit_instances_gpus_and_ports_are_not_used() -> None:
    inv = inventory({"a": 4}, [("pool", 1, 2, "a", 8000)], {"x": ("a", [0, 1], 8000)})
    res = desired_instances(inv, DeployState())
    assert where(res) == {"x": ("a", (0, 1), 8000), "pool-1": ("a", (2, 3), 8001)}


def test_an_explicit_instance_added_on_a_replicas_gpus_moves_the_replica() -> None:
    first = desired_instances(inventory({"a": 4}, [("pool", 1, 2, "a", 8000)]), DeployState())
    assert where(first)["pool-1"] == ("a", (0, 1), 8000)
    inv = inventory({"a": 4}, [("pool", 1, 2, "a", 8000)], {"x": ("a", [1], 9000)})
    res = desired_instances(inv, first.state)
    assert where(res)["pool-1"] == ("a", (2, 3), 8000)
    assert "GPU a:1 is now used by x" in res.moved["pool-1"]


def test_ports_are_unique_per_host_across_templates_and_instances() -> None:
    inv = inventory({"a": 8, "b": 8}, [("p", 4, 1, "a,b", 8000), ("q", 4, 1, "a,b", 8000)], {"x": ("a", [7], 8001)})
    res = desired_instances(inv, DeployState())
    per_host: dict[str, list[int]] = {}
    for host, _, port in where(res).values():
        per_host.setdefault(host, []).append(port)
    assert all(len(ports) == len(set(ports)) for ports in per_host.values())
    assert sorted(per_host["a"]) == [8000, 8001, 8002, 8003, 8004]


def test_templates_keep_their_replicas_before_another_template_places_new_ones() -> None:
    inv = inventory({"a": 4}, [("p", 1, 2, "a", 8000), ("q", 1, 2, "a", 8100)])
    first = desired_instances(inventory({"a": 4}, [("q", 1, 2, "a", 8100)]), DeployState())
    res = desired_instances(inv, first.state)
    assert where(res)["q-1"] == where(first)["q-1"] == ("a", (0, 1), 8100)
    assert where(res)["p-1"] == ("a", (2, 3), 8000)


def test_a_template_removed_from_the_inventory_removes_its_replicas() -> None:
    first = desired_instances(inventory({"a": 4}, [("p", 2, 1, "a", 8000)]), DeployState())
    res = desired_instances(inventory({"a": 4}), first.state)
    assert res.removed == ["p-1", "p-2"] and not res.state.placements


def test_a_host_leaving_the_pattern_moves_its_replicas() -> None:
    first = desired_instances(inventory({"a": 2, "b": 2}, [("p", 2, 1, "a,b", 8000)]), DeployState())
    assert where(first)["p-2"][0] == "b"
    res = desired_instances(inventory({"a": 2, "b": 2}, [("p", 2, 1, "a", 8000)]), first.state)
    assert where(res)["p-2"] == ("a", (1,), 8001)
    assert "no longer matches" in res.moved["p-2"]


def test_an_instance_named_like_a_replica_is_refused() -> None:
    inv = inventory({"a": 4}, [("p", 2, 1, "a", 8000)], {"p-2": ("a", [3], 9000)})
    with pytest.raises(PlacementError, match="p-2.*replica of template p"):
        desired_instances(inv, DeployState())


def test_reschedule_moves_only_the_named_replicas_and_not_back_onto_their_gpus() -> None:
    inv = inventory({"a": 4, "b": 4}, [("p", 2, 2, "a,b", 8000)])
    first = desired_instances(inv, DeployState())
    state = cordoned("a", state=first.state.copy())  # failover cordons the dead host first
    res = reschedule(inv, state, ["p-1"])
    assert where(res)["p-2"] == where(first)["p-2"] == ("b", (0, 1), 8000)
    assert where(res)["p-1"] == ("b", (2, 3), 8001)
    assert res.moved == {"p-1": "moved on request"}


def test_reschedule_never_returns_to_the_gpus_left_even_uncordoned() -> None:
    inv = inventory({"a": 4}, [("p", 1, 2, "a", 8000)])
    first = desired_instances(inv, DeployState())
    res = reschedule(inv, first.state, ["p-1"])
    assert where(res)["p-1"] == ("a", (2, 3), 8000)


def test_reschedule_without_room_keeps_the_replica_and_says_why() -> None:
    inv = inventory({"a": 2}, [("p", 1, 2, "a", 8000)])
    first = desired_instances(inv, DeployState())
    res = reschedule(inv, first.state, ["p-1"])
    assert where(res) == where(first)
    assert "not enough free uncordoned GPUs" in res.not_moved["p-1"]
    assert res.state.placements == first.state.placements


@pytest.mark.parametrize("name, match", [("x", "explicit instance"), ("p-9", "not a placed replica")])
def test_reschedule_refuses_names_that_are_not_placed_replicas(name: str, match: str) -> None:
    inv = inventory({"a": 4}, [("p", 1, 2, "a", 8000)], {"x": ("a", [3], 9000)})
    first = desired_instances(inv, DeployState())
    with pytest.raises(PlacementError, match=match):
        reschedule(inv, first.state, [name])


def test_replicas_carry_the_templates_args_env_and_secrets() -> None:
    from clusterctl.inventory.model import SecretRef

    inv = inventory({"a": 2}, [("p", 2, 1, "a", 8000)])
    tpl = inv.templates["p"]
    tpl.args, tpl.env, tpl.role = {"max-model-len": 4096}, {"VLLM_LOGGING_LEVEL": "INFO"}, "decode"
    tpl.secrets = {"VLLM_API_KEY": SecretRef("env", "API_KEY")}
    res = desired_instances(inv, DeployState())
    for inst in res.instances.values():
        assert (inst.args, inst.env, inst.role) == (tpl.args, tpl.env, "decode")
        assert inst.secrets == tpl.secrets and inst.model == "m" and inst.engine == "e"
    res.instances["p-1"].args["x"] = 1
    assert "x" not in tpl.args and "x" not in res.instances["p-2"].args


def test_topology_is_read_only_for_the_hosts_that_receive_new_replicas() -> None:
    from clusterctl.deploy.placement.topology import place

    asked: list[list[str]] = []
    topo = topology(switches=[[0, 2], [1, 3]], sockets=[[0, 1, 2, 3]])

    def read(hosts: list[str]) -> dict[str, list[dict[str, object]]]:
        asked.append(hosts)
        return {h: topo for h in hosts if h != "c"}

    inv = inventory({"a": 4, "b": 4, "c": 4, "z": 4}, [("p", 2, 2, "a,b,c", 8000)])
    res, missing = place(inv, cordoned("b"), read)
    assert asked == [["a", "c"]] and missing == ["c"]
    assert where(res)["p-1"] == ("a", (0, 2), 8000)
    assert where(res)["p-2"] == ("c", (0, 1), 8000)
    again, _ = place(inv, res.state, read)
    assert len(asked) == 1 and where(again) == where(res)


def test_a_port_base_raised_above_a_kept_port_renumbers_without_moving_gpus() -> None:
    first = desired_instances(inventory({"a": 4}, [("p", 2, 2, "a", 8000)]), DeployState())
    res = desired_instances(inventory({"a": 4}, [("p", 2, 2, "a", 8100)]), first.state)
    assert where(res) == {"p-1": ("a", (0, 1), 8100), "p-2": ("a", (2, 3), 8101)}
    assert not res.new and not res.moved and res.changed


def test_an_explicit_instance_taking_a_kept_port_renumbers_the_replica() -> None:
    first = desired_instances(inventory({"a": 4}, [("p", 1, 2, "a", 8000)]), DeployState())
    res = desired_instances(inventory({"a": 4}, [("p", 1, 2, "a", 8000)], {"x": ("a", [3], 8000)}), first.state)
    assert where(res)["p-1"] == ("a", (0, 1), 8001) and res.changed
