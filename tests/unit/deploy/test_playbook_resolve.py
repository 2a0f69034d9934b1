"""Which hosts, instances and batches each playbook step covers (pure: a plan in, steps out)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.deploy.rollout.plan import HostPlan, Plan, PlanItem
from clusterctl.deploy.playbooks.load import PlaybookError, parse_playbook
from clusterctl.deploy.playbooks.run import canary_serial, lock_targets, resolve, rollout_batches
from clusterctl.inventory.loader import load_inventory
from clusterctl.inventory.model import Inventory
from tests.unit.deploy.playbook_fakes import HOSTS, inventory_text


@pytest.fixture
def inv(tmp_path: Path) -> Inventory:
    p = tmp_path / "inv.yaml"
    p.write_text(inventory_text())
    return load_inventory(str(p))


def plan(**hosts: list[tuple[str, str]]) -> Plan:
    """``plan(h1=[("a1", "new")], ...)``; hosts not named have nothing to change."""
    return Plan([HostPlan(h, [PlanItem(i, h, a) for i, a in hosts.get(h, [])]) for h in HOSTS])


EVERY = plan(
    h1=[("a1", "unchanged")],
    h2=[("a2", "changed"), ("b2", "new")],
    h3=[("a3", "new")],
    h4=[("b4", "start")],
    h5=[("a5", "remove")],
)


def steps(inv: Inventory, text: str, p: Plan = EVERY, selected: list[str] = HOSTS) -> dict[str, dict]:
    book = parse_playbook(text, "pb.yaml")
    return {
        s.step.name: {"hosts": s.hosts, "instances": s.instances, "batches": s.batches}
        for s in resolve(book, inv, p, selected)
    }


def test_steps_cover_the_hosts_with_changes_narrowed_by_their_patterns(inv: Inventory) -> None:
    got = steps(
        inv,
        """steps:
  - {kind: units}
  - {kind: stage, name: back, hosts: '@back'}
  - {kind: preflight, name: a-only, instances: 'a*'}
  - {kind: gates, name: none, hosts: h1}
""",
    )
    assert got["units"] == {
        "hosts": ["h2", "h3", "h4", "h5"],
        "instances": ["a2", "a3", "a5", "b2", "b4"],
        "batches": [],
    }
    assert got["back"]["hosts"] == ["h3", "h4", "h5"]
    assert got["a-only"] == {"hosts": ["h2", "h3", "h5"], "instances": ["a2", "a3", "a5"], "batches": []}
    assert got["none"]["hosts"] == []  # h1 has nothing to change


def test_canary_then_rollout_batch_as_one_serial_ramp(inv: Inventory) -> None:
    got = steps(inv, "steps:\n  - {kind: canary}\n  - {kind: rollout, serial: '1,25%,100%'}\n")
    assert got["canary"]["batches"] == [["h2"]]
    assert got["canary"]["instances"] == ["a2", "b2"]
    assert got["rollout"]["batches"] == [["h3"], ["h4", "h5"]]
    assert got["rollout"]["instances"] == ["a3", "a5", "b4"]


def test_rollout_without_canary_and_canary_with_its_own_serial(inv: Inventory) -> None:
    assert steps(inv, "steps:\n  - {kind: rollout, serial: 2}\n")["rollout"]["batches"] == [["h2", "h3"], ["h4", "h5"]]
    assert steps(inv, "steps:\n  - {kind: rollout}\n")["rollout"]["batches"] == [["h2", "h3", "h4", "h5"]]
    got = steps(inv, "steps:\n  - {kind: canary, serial: 2}\n  - {kind: rollout, serial: 1}\n")
    assert got["canary"]["batches"] == [["h2", "h3"]]
    assert got["rollout"]["batches"] == [["h4"], ["h5"]]


def test_a_rollout_after_a_scoped_canary_takes_what_the_canary_left(inv: Inventory) -> None:
    got = steps(
        inv,
        """steps:
  - {kind: canary, hosts: '@back'}
  - {kind: rollout, serial: 1}
""",
    )
    assert got["canary"]["batches"] == [["h3"]]  # the first batch of the rollout's serial over @back
    assert got["rollout"]["batches"] == [["h2"], ["h4"], ["h5"]]


def test_exec_steps_run_on_every_selected_host_of_their_pattern_in_batches(inv: Inventory) -> None:
    got = steps(
        inv,
        "steps:\n  - {kind: exec, command: 'true', serial: 2, hosts: 'h[1-3]'}\n",
        selected=["h1", "h2", "h3", "h4"],
    )
    assert got["exec"]["hosts"] == ["h1", "h2", "h3"] and got["exec"]["batches"] == [["h1", "h2"], ["h3"]]
    book = parse_playbook("steps:\n  - {kind: exec, command: 'true', hosts: h1}\n", "pb.yaml")
    assert lock_targets(EVERY, resolve(book, inv, EVERY, HOSTS)) == ["h1", "h2", "h3", "h4", "h5"]


def test_only_selected_hosts_and_readable_ones(inv: Inventory) -> None:
    p = Plan([HostPlan("h1", error="unreachable"), HostPlan("h2", [PlanItem("a2", "h2", "new")])])
    got = steps(inv, "steps:\n  - {kind: rollout}\n", p, selected=["h1", "h2"])
    assert got["rollout"]["batches"] == [["h2"]]


def test_nothing_to_change_means_empty_steps(inv: Inventory) -> None:
    got = steps(inv, "steps:\n  - {kind: canary}\n  - {kind: rollout}\n", plan(h1=[("a1", "unchanged")]))
    assert got["canary"]["batches"] == [] and got["rollout"]["batches"] == []


def test_canary_serial_defaults() -> None:
    book = parse_playbook(
        "steps:\n  - {kind: canary}\n  - {kind: exec, command: x}\n  - {kind: rollout, serial: '3,50%'}\n", "pb.yaml"
    )
    assert canary_serial(book, book.steps[0]) == ["3", "50%"]
    alone = parse_playbook("steps:\n  - {kind: canary}\n", "pb.yaml")
    assert canary_serial(alone, alone.steps[0]) == ["1"]
    assert rollout_batches(["a", "b", "c", "d"], ["1", "25%", "100%"], {"a"}) == [["b"], ["c", "d"]]


def test_an_unknown_group_in_a_step_is_an_error_at_its_line(inv: Inventory) -> None:
    with pytest.raises(PlaybookError, match=r"pb.yaml:4: step 'r': hosts: .*nosuch"):
        steps(inv, "steps:\n  - kind: rollout\n    name: r\n    hosts: '@nosuch'\n")
