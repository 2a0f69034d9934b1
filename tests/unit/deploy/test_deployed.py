"""Doctor, report and file_sd see template replicas once placement has recorded them."""

from __future__ import annotations

from clusterctl.deploy.placement.deployed import with_replicas
from clusterctl.deploy.placement.place import desired_instances
from clusterctl.deploy.state import DeployState, StateStore
from unit.deploy.placement_helpers import inventory

HOSTS = {"gpu01": 8, "gpu02": 8}


def test_recorded_replicas_join_the_explicit_instances_and_unplaced_ones_do_not(tmp_path) -> None:
    inv = inventory(HOSTS, [("pool", 2, 2, "all", 8000)], {"solo": ("gpu02", [7], 9000)})
    first = desired_instances(inv, DeployState())
    StateStore(tmp_path).save_placements(first.state.placements)
    seen = with_replicas(inv, tmp_path)
    assert sorted(seen.instances) == ["pool-1", "pool-2", "solo"]
    assert seen.instances["pool-1"].placement == first.instances["pool-1"].placement
    assert sorted(inv.instances) == ["solo"]  # the loaded inventory is not changed
    bigger = inventory(HOSTS, [("pool", 3, 2, "all", 8000)], {"solo": ("gpu02", [7], 9000)})
    assert sorted(with_replicas(bigger, tmp_path).instances) == ["pool-1", "pool-2", "solo"]  # pool-3: never deployed


def test_no_templates_or_an_unreadable_state_leave_the_inventory_as_it_is(tmp_path) -> None:
    plain = inventory(HOSTS, [], {"solo": ("gpu01", [0], 9000)})
    assert with_replicas(plain, tmp_path) is plain
    inv = inventory(HOSTS, [("pool", 1, 1, "all", 8000)])
    (tmp_path / "placements.json").write_text("{not json")
    seen = with_replicas(inv, tmp_path)
    assert seen.instances == {} and any("template replicas left out" in w for w in seen.warnings)
