"""``nodes: N`` templates: placement chooses N hosts of one GPU model (RDMA, one leaf, spread), one stage of
``tp`` GPUs on each; impossible templates are ``file:line`` errors; the state keeps the stages."""

from __future__ import annotations

from typing import Any

import pytest

from clusterctl.deploy.placement.place import desired_instances, reschedule
from clusterctl.deploy.state import DeployState, StateError, StateStore
from clusterctl.errors import InventoryError
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.multinode import hosts_in_order, replicas_that_fit

from .placement_helpers import cordoned

HEAD = """\
version: 1
defaults:
  ssh: {user: root}
  gpus: {count: 4, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}
  nics:
    - {netdev: eth0, role: management}
    - {netdev: eth2, role: data, rdma_device: mlx5_0, port: 1}
fabric: {kind: roce, roce_dscp: 26}
engines:
  v33: {path: /opt/vllm-0.33/bin/vllm, version: "0.33.0"}
  v11: {path: /opt/vllm-0.11/bin/vllm, version: "0.11.0"}
  cpu: {path: /opt/vllm-cpu/bin/vllm, version: "0.32.0", device: cpu}
models:
  m: {path: /models/m}
"""

#: a1 a2 on leaf A; b1 b2 b3 on leaf B; l1 l2 another GPU model on leaf A
HOSTS = """\
groups:
  leafA: {hosts: "a[1-2],l[1-2]", labels: {leaf: A}}
  leafB: {hosts: "b[1-3]", labels: {leaf: B}}
hosts:
  a[1-2]: {address: "10.0.1.[1-2]"}
  b[1-3]: {address: "10.0.2.[1-3]"}
  l[1-2]: {address: "10.0.3.[1-2]", gpus: {count: 4, model: L40S, memory_gib: 48, interconnect: pcie}}
"""


def _inv(templates: str, hosts: str = HOSTS) -> Any:
    return load_inventory_text(HEAD + hosts + "templates:\n" + templates, "site.yaml")


def _stages(res: Any, name: str) -> list[tuple[str, tuple[int, ...]]]:
    inst = res.instances[name]
    return [(h, tuple(g.index for g in inst.placement if g.host == h)) for h in hosts_in_order(inst)]


def test_a_replica_spans_n_hosts_under_one_leaf_with_tp_gpus_each() -> None:
    inv = _inv(
        '  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 3, hosts: "a[1-2],b[1-3]", port_base: 8000}\n'
    )
    res = desired_instances(inv, DeployState())
    assert res.new == ["big-1"] and not res.unplaced
    # leaf A has only two hosts: the three stages go under leaf B, the head first in inventory order
    assert _stages(res, "big-1") == [("b1", (0, 1)), ("b2", (0, 1)), ("b3", (0, 1))]
    inst = res.instances["big-1"]
    assert inst.port == 8000 and inst.template == "big" and inst.tp_size == 6
    p = res.state.placements["big"]["big-1"]
    assert p.hosts == ("b1", "b2", "b3") and p.workers == (("b2", (0, 1)), ("b3", (0, 1)))
    assert "leaf B" in res.spans["big-1"] and "b1 GPUs 0,1 (head)" in res.spans["big-1"]


def test_replicas_spread_over_leaves_and_hosts_before_doubling_up() -> None:
    inv = _inv(
        '  big: {model: m, engine: v33, replicas: 3, tp: 2, nodes: 2, hosts: "a[1-2],b[1-3]", port_base: 8000}\n'
    )
    res = desired_instances(inv, DeployState())
    stages = {n: _stages(res, n) for n in ("big-1", "big-2", "big-3")}
    for s in stages.values():  # each replica under one leaf
        assert len({h[0] for h, _ in s}) == 1
    used = [h for s in stages.values() for h, _ in s]
    # five hosts, six stages: only one host holds two (on other GPUs), none three
    assert len(set(used)) == 5 and max(used.count(h) for h in used) == 2
    twice = next(h for h in used if used.count(h) == 2)
    gpus = [g for s in stages.values() for h, g in s if h == twice]
    assert sorted(gpus) == [(0, 1), (2, 3)]
    # every replica's port is free on all its hosts
    ports = {(h, res.instances[n].port) for n, s in stages.items() for h, _ in s}
    assert len(ports) == 6


def test_the_same_gpu_model_always_even_across_leaves() -> None:
    # leaf A has a1 (H100) and l1 l2 (L40S); a replica of 3 must not mix models: it takes a1 and two of b
    inv = _inv('  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 3, hosts: "a1,b[1-2],l[1-2]"}\n')
    res = desired_instances(inv, DeployState())
    assert [h for h, _ in _stages(res, "big-1")] == ["a1", "b1", "b2"]
    assert "across leaves A, B" in res.spans["big-1"]


def test_rdma_hosts_come_before_a_closer_leaf_without_rdma() -> None:
    hosts = HOSTS.replace(
        '  a[1-2]: {address: "10.0.1.[1-2]"}', '  a[1-2]: {address: "10.0.1.[1-2]", nics: [{netdev: eth2, role: data}]}'
    )
    inv = _inv('  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 2, hosts: "a1,a2,b1,b3"}\n', hosts)
    res = desired_instances(inv, DeployState())
    assert [h for h, _ in _stages(res, "big-1")] == ["b1", "b3"]
    assert "RDMA on every host" in res.spans["big-1"]


def test_the_stages_and_port_are_kept_and_survive_the_state_file(tmp_path: Any) -> None:
    inv = _inv('  big: {model: m, engine: v33, replicas: 2, tp: 2, nodes: 2, hosts: "b[1-3]", port_base: 9000}\n')
    first = desired_instances(inv, DeployState())
    store = StateStore(tmp_path)
    store.save_placements(first.state.placements)
    again = desired_instances(inv, store.load())
    assert not again.new and not again.moved and not again.changed
    assert {n: _stages(again, n) for n in again.instances} == {n: _stages(first, n) for n in first.instances}
    assert '"workers"' in (tmp_path / "placements.json").read_text()


def test_a_state_file_whose_worker_stage_has_the_wrong_gpu_count_is_an_error(tmp_path: Any) -> None:
    (tmp_path / "placements.json").write_text(
        '{"version": 1, "templates": {"big": {"big-1": {"host": "b1", '
        '"gpus": [0, 1], "port": 8000, "workers": [{"host": "b2", "gpus": [0]}]}}}}'
    )
    with pytest.raises(StateError, match=r"big-1.workers\[1\].gpus: expected 2 GPU indexes"):
        StateStore(tmp_path).load()


def test_a_cordoned_stage_host_keeps_the_replica_but_reschedule_moves_the_whole_replica() -> None:
    inv = _inv('  big: {model: m, engine: v33, replicas: 1, tp: 4, nodes: 2, hosts: "a[1-2],b[1-3]"}\n')
    first = desired_instances(inv, DeployState())
    old = _stages(first, "big-1")
    state = cordoned(old[1][0], state=first.state.copy())
    stay = desired_instances(inv, state)
    assert _stages(stay, "big-1") == old and "big-1" in stay.on_cordoned
    moved = reschedule(inv, state, ["big-1"])
    new = _stages(moved, "big-1")
    assert moved.moved == {"big-1": "moved on request"} and not moved.not_moved
    assert len(new) == 2 and old[1][0] not in [h for h, _ in new]
    assert not {(h, g) for h, gs in new for g in gs} & {(h, g) for h, gs in old for g in gs}
    assert "big-1" in moved.spans


def test_a_replica_that_has_no_n_hosts_left_is_unplaced_with_the_reason() -> None:
    inv = _inv('  big: {model: m, engine: v33, replicas: 1, tp: 4, nodes: 2, hosts: "b[1-2]"}\n')
    res = desired_instances(inv, cordoned("b2"))
    assert "big-1" in res.unplaced and "needs 4 on each of 2 hosts" in res.unplaced["big-1"]
    assert "cordoned hosts: b2" in res.unplaced["big-1"]


def test_changing_nodes_places_the_replica_again() -> None:
    two = _inv('  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 2, hosts: "b[1-3]"}\n')
    three = _inv('  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 3, hosts: "b[1-3]"}\n')
    res = desired_instances(three, desired_instances(two, DeployState()).state)
    assert res.moved == {"big-1": "nodes changed from 2 to 3"} and len(_stages(res, "big-1")) == 3


@pytest.mark.parametrize(
    "template, line, message",
    [
        (
            '  big: {model: m, engine: v33, replicas: 2, tp: 4, nodes: 3, hosts: "a[1-2],b[1-3]"}\n',
            23,
            r"templates.big: nodes 3: 2 replica\(s\) of 3 hosts x TP 4 do not fit: .*room for 1 .*H100-SXM5-80GB: 5 host",
        ),
        (
            '  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 3, hosts: "a1,l[1-2]"}\n',
            23,
            r"nodes 3: 1 replica\(s\) .* room for 0 .*L40S: 2 host",
        ),
        (
            '  big: {model: m, engine: v11, replicas: 1, tp: 2, nodes: 2, hosts: "b[1-3]"}\n',
            23,
            r"vLLM 0.11.0: --nnodes \(multi-node without Ray\) needs >= 0.11.1",
        ),
        ('  big: {model: m, engine: cpu, replicas: 1, tp: 1, nodes: 2, hosts: "b[1-3]"}\n', 23, r"runs on CPUs"),
        (
            '  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 2, hosts: "b[1-3]", role: prefill}\n',
            23,
            r"role prefill",
        ),
        (
            '  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 2, hosts: "b[1-3]", args: {nnodes: 2}}\n',
            23,
            r"args set nnodes",
        ),
        (
            '  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 2, hosts: "b[1-3]", port_base: 50000}\n',
            23,
            r"port_base 50000 leaves no master port",
        ),
        ('  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 0, hosts: "b[1-3]"}\n', 23, r"templates.big.nodes"),
    ],
)
def test_impossible_templates_are_errors_at_their_line(template: str, line: int, message: str) -> None:
    with pytest.raises(InventoryError) as e:
        _inv(template)
    text = str(e.value)
    assert f"site.yaml:{line}" in text, text
    assert any(__import__("re").search(message, ln) for ln in text.splitlines()), text


@pytest.mark.parametrize(
    "slots, nodes, fit",
    [
        ({"a": 1, "b": 1, "c": 1}, 3, 1),
        ({"a": 4, "b": 1}, 2, 1),
        ({"a": 2, "b": 2, "c": 2}, 2, 3),
        ({"a": 9}, 2, 0),
        ({"a": 2, "b": 2, "c": 1}, 3, 1),
        ({}, 2, 0),
    ],
)
def test_replicas_that_fit_counts_distinct_hosts_per_replica(slots: dict[str, int], nodes: int, fit: int) -> None:
    assert replicas_that_fit(slots, nodes) == fit


def test_autoscale_on_a_template_across_hosts_is_accepted() -> None:
    # it scales by whole replicas, each placed by the nodes placement (tests/unit/autoscale/test_run_nodes.py)
    inv = _inv(
        '  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 2, hosts: "b[1-3]",\n'
        '        autoscale: {min: 1, max: 2, signal: queue, high: 4, low: 1}}\n'
    )
    assert inv.templates["big"].autoscale is not None and inv.templates["big"].nodes == 2


def test_deploy_places_a_template_replica_across_hosts_and_the_plan_says_where(tmp_path: Any) -> None:
    from clusterctl.deploy.rollout.engine import DeployOptions
    from clusterctl.deploy.rollout.batches import parse_serial
    from clusterctl.fleet import Fleet

    from .test_multinode import INV, Cluster, Scripted, _argv, _flag

    inv = load_inventory_text(
        INV.split("instances:")[0] + "templates:\n"
        '  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 2, hosts: "gpu[01-03]",'
        ' port_base: 8100}\n',
        "site.yaml",
    )
    cluster = Cluster()
    d = Scripted(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=cluster.transport),
        str(tmp_path),
        DeployOptions(serial=parse_serial("1")),
    )
    d.gated = []  # the class's list is shared with test_multinode's runs
    rep = d.run()
    assert rep.result == "ok", rep.to_dict()
    plan = rep.plan.to_dict() if rep.plan else {}
    assert plan["placed"] == [
        "replica big-1 placed on 2 hosts: gpu01 GPUs 0,1 (head), gpu02 GPUs 0,1 (rank 1); "
        "port 8100; H100-SXM5-80GB, across leaves gpu01 (no leaf label), gpu02 (no leaf "
        "label), RDMA on every host"
    ]
    assert ["gpu01", "gpu02"] in [sorted(b) for b in rep.batches]
    head, worker = _argv(d.rendered["big-1"].unit_text), _argv(d.rendered["big-1-node1"].unit_text)
    assert _flag(head, "--nnodes") == "2" and _flag(worker, "--node-rank") == "1" and "--headless" in worker
    assert d.gated == ["big-1"]
    saved = StateStore(tmp_path).load().placements["big"]["big-1"]
    assert saved.stages == (("gpu01", (0, 1)), ("gpu02", (0, 1)))


def test_placement_show_and_scale_plan_list_every_stage(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from clusterctl.cli.main import main

    inv = tmp_path / "inv.yaml"
    inv.write_text(
        HEAD + HOSTS + "templates:\n"
        '  big: {model: m, engine: v33, replicas: 1, tp: 2, nodes: 2, hosts: "b[1-3]", port_base: 8000}\n'
    )
    for k, v in {
        "CLUSTERCTL_INVENTORY": str(inv),
        "CLUSTERCTL_SSH_CONFIG": "none",
        "CLUSTERCTL_STATE_DIR": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
    }.items():
        monkeypatch.setenv(k, v)
    assert main(["placement", "show", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (
        row["host"] == "b1"
        and row["gpus"] == [0, 1]
        and row["stages"] == [{"host": "b1", "gpus": [0, 1]}, {"host": "b2", "gpus": [0, 1]}]
    )
    assert main(["scale", "big", "--replicas", "2", "--plan"]) == 0
    # b3 is the only host without a stage: with b1 (first in inventory order: the head) on its other GPUs;
    # port 8000 is taken on b1
    assert "+ big-2  b1 GPUs 2,3 + b3 GPUs 0,1 port 8001" in capsys.readouterr().out


def test_scaling_down_selects_the_removed_replicas_worker_units_too(tmp_path: Any) -> None:
    # the rollout of a scale (clusterctl scale, autoscale) selects instances by name; the engine adds the
    # workers of the replicas it keeps, but a removed replica is no longer desired: its worker unit on the
    # other host was left running (found when autoscale of nodes: N templates came in)
    from clusterctl.deploy.placement.scale import plan_scale, replica_names
    from clusterctl.deploy.rollout.plan import matches

    inv = _inv(
        '  big: {model: m, engine: v33, replicas: 2, tp: 2, nodes: 2, hosts: "a[1-2],b[1-3]", port_base: 8000}\n'
    )
    store = StateStore(tmp_path)
    store.save_placements(desired_instances(inv, store.load()).state.placements)
    sp = plan_scale(inv, store.load(), "big", 1)
    assert sp.removed == ["big-2"] and sp.removed_workers == ["big-2-node1"]
    names = replica_names(sp)
    assert names == ["big-1", "big-2", "big-2-node1"]
    assert matches("big-2-node1", ",".join(names)) and not matches("big-1-node1", ",".join(names))
