"""Autoscale of a ``nodes: N`` template (docs/autoscale.md): scale out and in by whole replicas, each placed on
N hosts of one GPU model by the nodes placement (deploy/placement/nodes.py), within the policy's hosts; a
failed scale-out forgets every stage it recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clusterctl.autoscale import run
from clusterctl.deploy.state import StateStore
from clusterctl.inventory.loader import load_inventory_text

from .test_run import Fake, _signals, make_fleet, scale_in_round

INV = """\
version: 1
defaults:
  gpus: {count: 2, model: H100, memory_gib: 80, interconnect: nvlink}
hosts: {"g[01-07]": {address: "10.0.0.[11-17]"}}
engines: {v33: {path: /opt/v/bin/vllm, version: 0.33.0}}
models: {m8: {path: /models/m8}}
gateway: {hosts: g07, auth: none}
templates:
  big: {model: m8, engine: v33, replicas: 1, tp: 2, nodes: 2, hosts: "g[01-07]", autoscale: {min: 1, max: 4,
        hosts: "g[01-06]", scale_out_after_s: 0, scale_in_after_s: 0, cooldown_out_s: 0, cooldown_in_s: 0,
        max_step: 3}}
"""


def _stages(inst: Any) -> list[tuple[str, tuple[int, ...]]]:
    hosts = list(dict.fromkeys(g.host for g in inst.placement))
    return [(h, tuple(g.index for g in inst.placement if g.host == h)) for h in hosts]


def test_scale_out_adds_whole_replicas_on_two_hosts_each_within_the_policy(tmp_path: Path) -> None:
    inv = load_inventory_text(INV, "inv.yaml")
    pol = inv.templates["big"].autoscale
    sp = run.plan_out(inv, StateStore(tmp_path).load(), "big", pol, 4)
    # g01-g06 allowed (g07 is the gateway's, outside the policy): 6 hosts x 2 GPUs hold 3 replicas of 2 x TP 2
    assert sp is not None and sp.after == 3 and sp.added == ["big-1", "big-2", "big-3"]
    used = [s for n in sp.added for s in _stages(sp.result.instances[n])]
    assert len(used) == 6 and {h for h, _ in used} == {f"g0{i}" for i in range(1, 7)}
    assert all(gpus == (0, 1) for _, gpus in used)


def test_a_scale_out_records_every_stage_and_a_failed_one_forgets_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = load_inventory_text(INV, "inv.yaml")
    pol = inv.templates["big"].autoscale
    fake = Fake(monkeypatch, tmp_path)
    _signals(monkeypatch, 0.95)
    out = run.decide_template(inv, tmp_path, make_fleet, "big", pol, now=lambda: 1000.0)
    assert (out.decision.action, out.outcome, out.added) == ("out", "ok", ["big-2"]), out.detail
    place = StateStore(tmp_path).load().placements["big"]["big-2"]
    assert len(place.stages) == 2 and len(set(place.hosts)) == 2
    assert [c[0] for c in fake.calls] == ["lock", "down", "deploy", "up", "sync", "release"]
    locked = set(fake.calls[0][1])
    assert set(place.hosts) <= locked  # the new replica's every host is locked, not only its head's
    assert out.detail is not None and " + ".join(place.hosts) in out.detail  # where it went: every stage

    failing = Fake(monkeypatch, tmp_path, gates_ok=False)
    out = run.decide_template(inv, tmp_path, make_fleet, "big", pol, now=lambda: 2000.0)
    assert out.outcome == "failed" and out.added == ["big-3"]
    st = StateStore(tmp_path).load()
    assert st.replicas["big"] == 2 and set(st.placements["big"]) == {"big-1", "big-2"}
    assert not failing.marks


def test_scale_in_removes_whole_replicas_through_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = load_inventory_text(INV, "inv.yaml")
    fake, out = scale_in_round(inv, tmp_path, monkeypatch, "big", 2)
    assert (out.decision.action, out.outcome, out.removed) == ("in", "ok", ["big-2"]), out.detail
    # the engine's rollout of the count in force (1): it drains big-2 through its head and removes its units
    # on both hosts (the worker's named too: the engine only adds the workers of replicas it keeps)
    assert fake.calls[1][:3] == ("deploy", ["big-1", "big-2", "big-2-node1"], 1)
