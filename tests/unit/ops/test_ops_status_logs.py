"""The status, logs and placement workflows called directly, as the CLI calls them (no typer):
what they select, the errors they raise, and the --watch loop's refreshes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from clusterctl.diagnose.findings import Severity
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.loader import load_inventory
from clusterctl.inventory.model import Inventory
from clusterctl.ops import logs, placement, status

INVENTORY = """\
version: 1
defaults:
  gpus: {count: 2, model: H100-80GB, memory_gib: 80}
hosts:
  gpu[01-03]:
    address: 10.0.0.[1-3]
engines:
  vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}
models:
  qwen:
    path: /models/qwen
    arch: {layers: 64, hidden_size: 5120, attention_heads: 64, kv_heads: 8, head_dim: 128,
           vocab: 151936, params: 32762123264, dtype: bfloat16}
instances:
  qwen-a: {model: qwen, engine: vllm, placement: "gpu01:[0-1]", port: 8000}
  qwen-b: {model: qwen, engine: vllm, placement: "gpu02:[0-1]", port: 8000}
"""


@pytest.fixture
def inv(tmp_path: Path) -> Inventory:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return load_inventory(str(path))


def test_status_selects_the_instances_hosts_or_every_host(inv: Inventory, tmp_path: Path) -> None:
    some = status.select(status.StatusRequest(inv, tmp_path / "deploy", "qwen-b"))
    assert list(some.instances) == ["qwen-b"] and some.hosts == ["gpu02"]
    every = status.select(status.StatusRequest(inv, tmp_path / "deploy", None))
    assert list(every.instances) == ["qwen-a", "qwen-b"] and every.hosts == ["gpu01", "gpu02", "gpu03"]
    with pytest.raises(ClusterctlError, match="pattern 'nope' selects no instance of the inventory"):
        status.select(status.StatusRequest(inv, tmp_path / "deploy", "nope"))
    action = status.select_for_action(status.StatusRequest(inv, tmp_path / "deploy", "qwen-*,!qwen-a"))
    assert [i.name for i in action.instances] == ["qwen-b"] and action.hosts == ["gpu02"]
    assert set(action.wanted) == {"qwen-a", "qwen-b"}


def test_watch_hands_each_refresh_its_code_and_keeps_the_last_on_ctrl_c() -> None:
    rounds = [[SimpleNamespace(severity=Severity.WARN)], [SimpleNamespace(severity=Severity.CRIT)]]
    seen: list[int] = []
    slept: list[float] = []

    def collect() -> list:
        if not rounds:
            raise KeyboardInterrupt
        return rounds.pop(0)

    code = status.watch(
        collect, interval=5, count=None, on_refresh=lambda rows, took, c: seen.append(c), sleep=slept.append
    )
    assert seen == [1, 2] and code == 2  # Ctrl-C in the third collection: the second's code
    assert len(slept) == 2 and all(0 < s <= 5 for s in slept)
    assert status.watch(lambda: [], interval=0, count=1, on_refresh=lambda *a: None) == 0


def test_logs_plan_reads_units_and_kernels_and_names_what_selects_nothing(inv: Inventory, tmp_path: Path) -> None:
    opts = logs.options(kernel=True)
    plan = logs.plan(logs.LogsRequest(inv, tmp_path / "deploy", ["qwen-a", "gpu03"], opts))
    assert plan.hosts == ["gpu01", "gpu03"] and plan.fanout is None
    assert plan.queries["gpu01"].units == {"clusterctl-qwen-a.service": "qwen-a"} and plan.queries["gpu01"].kernel
    assert plan.queries["gpu03"].units == {} and plan.queries["gpu03"].kernel
    assert plan.label_width == len("gpu01/qwen-a") and opts.line_count == 200
    assert logs.options(follow=True).line_count == 10 and logs.options(since="10m").line_count is None
    with pytest.raises(ClusterctlError, match="'gpu9' names no instance, and as a host pattern: unknown host"):
        logs.plan(logs.LogsRequest(inv, tmp_path / "deploy", ["gpu9"], opts))
    with pytest.raises(ClusterctlError, match="--since"):
        logs.options(since="yesterday-ish")
    follow = logs.plan(logs.LogsRequest(inv, tmp_path / "deploy", ["all"], logs.options(follow=True)))
    assert follow.fanout == 3  # one connection per host at once


def test_placement_cordons_then_shows_and_refuses_an_unknown_host(inv: Inventory, tmp_path: Path) -> None:
    req = placement.PlacementRequest(tmp_path / "deploy", inv)
    done = placement.cordon(req, "gpu01:1", "  XID 79  ")
    assert done.target == "gpu01:1" and done.new and done.entry.reason == "XID 79" and done.staying == []
    assert [c["target"] for c in placement.cordons(placement.PlacementRequest(tmp_path / "deploy"))] == ["gpu01:1"]
    shown = placement.show(req)
    assert [(r["replica"], r["host"], r["status"]) for r in shown.rows] == [
        ("qwen-a", "gpu01", "explicit"),
        ("qwen-b", "gpu02", "explicit"),
    ]
    assert shown.code == 0
    gone = placement.uncordon(req, "gpu01:1")
    assert gone.removed is not None and gone.left == []
    with pytest.raises(ClusterctlError, match="host 'gpu9' is not in the inventory"):
        placement.cordon(req, "gpu9", "x")
