"""Properties of placement over random fleets, templates, cordons and scale changes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.deploy.placement.place import PlacementResult, desired_instances
from clusterctl.deploy.state import DeployState
from clusterctl.inventory.model import GpuRef

from .placement_helpers import cordoned, inventory, where


@st.composite
def fleets(draw: Any) -> tuple[Any, DeployState, dict[str, int]]:
    counts = draw(st.lists(st.integers(1, 8), min_size=1, max_size=5))
    hosts = {f"h{i}": c for i, c in enumerate(counts)}
    names = list(hosts)
    templates = []
    for t in range(draw(st.integers(1, 3))):
        pattern = ",".join(draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True)))
        templates.append((f"t{t}", draw(st.integers(1, 8)), draw(st.integers(1, 4)), pattern, 8000 + 100 * t))
    instances = {}
    for host in draw(st.lists(st.sampled_from(names), max_size=2, unique=True)):
        instances[f"x-{host}"] = (host, [0], 9000)
    keys = [h for h in names] + [f"{h}:{i}" for h, c in hosts.items() for i in range(c)]
    state = cordoned(*draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)))
    scale = {t[0]: draw(st.integers(0, 10)) for t in templates}
    return inventory(hosts, templates, instances), state, scale


def _check_invariants(res: PlacementResult) -> None:
    owners: dict[GpuRef, str] = {}
    ports: set[tuple[str, int]] = set()
    for name, inst in res.instances.items():
        assert len(inst.hosts) == 1, f"{name} spans hosts {inst.hosts}"
        for ref in inst.placement:
            assert ref not in owners, f"{ref} used by {owners.get(ref)} and {name}"
            owners[ref] = name
        assert (inst.hosts[0], inst.port) not in ports, f"port {inst.port} twice on {inst.hosts[0]}"
        ports.add((inst.hosts[0], inst.port))


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_no_shared_gpu_no_split_tp_group_and_scaling_moves_nothing(
    case: tuple[Any, DeployState, dict[str, int]],
) -> None:
    inv, state, scale = case
    first = desired_instances(inv, state)
    _check_invariants(first)
    for name in first.new:
        inst = first.instances[name]
        assert not any(state.gpu_cordoned(r.host, r.index) for r in inst.placement), name
        assert inst.tp_size == inv.templates[inst.template or ""].tp
    assert set(first.instances) | set(first.unplaced) == set(inv.instances) | {
        f"{t}-{n}" for t, tpl in inv.templates.items() for n in range(1, tpl.replicas + 1)
    }

    scaled_state = first.state.copy()
    scaled_state.replicas.update(scale)
    second = desired_instances(inv, scaled_state)
    _check_invariants(second)
    before, after = where(first), where(second)
    for name, spot in before.items():
        if name in after:
            assert after[name] == spot, f"{name} moved from {spot} to {after[name]}"
        else:
            assert name in second.removed


@settings(max_examples=200, deadline=None)
@given(fleets(), st.data())
def test_reschedule_moves_only_the_named_never_back_or_onto_a_cordon_and_keeps_every_cordon(
    case: tuple[Any, DeployState, dict[str, int]], data: Any
) -> None:
    from clusterctl.deploy.placement.place import reschedule

    inv, state, _ = case
    first = desired_instances(inv, DeployState())
    replicas = sorted(n for n, i in first.instances.items() if i.template)
    if not replicas:
        return
    names = data.draw(st.lists(st.sampled_from(replicas), min_size=1, max_size=3, unique=True))
    placed = first.state.copy()
    placed.cordons = dict(state.cordons)
    res = reschedule(inv, placed, names)
    _check_invariants(res)
    assert res.state.cordons == placed.cordons
    before, after = where(first), where(res)
    for name in replicas:
        if name not in names:
            assert after[name] == before[name], name
    for name in names:
        assert (name in res.moved) != (name in res.not_moved), name
        if name in res.moved:
            host, gpus, _ = after[name]
            old_host, old_gpus, _ = before[name]
            assert not (host == old_host and set(gpus) & set(old_gpus)), name
            assert not any(placed.gpu_cordoned(host, g) for g in gpus), name
        else:
            assert after[name] == before[name]
