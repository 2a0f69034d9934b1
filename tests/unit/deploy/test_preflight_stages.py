"""Pre-flight of a multi-node replica, pipeline stage by stage (docs/multinode.md, docs/deploy-preflight.md).

Each stage is a row of its own (the member's unit name, its host), checked with the single-host
semantics over that host's GPUs, with the stage's layers (vLLM's split, ``get_pp_indices`` of the
0.32 wheel), weights (embedding on the first stage, LM head on the last) and KV cache.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from clusterctl.deploy.preflight import memory as M
from clusterctl.deploy.preflight import stages as pp
from clusterctl.deploy.preflight.checks import GpuProc, check_instances
from clusterctl.diagnose.findings import Severity
from clusterctl.inventory.model import GpuRef, GpuSpec, Host, Instance, Model
from unit.deploy.preflight_helpers import host, inventory, make_sparse


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_sparse("llama-3-70b", tmp_path_factory.mktemp("m") / "llama")


def _inv() -> Any:
    inv = inventory()
    inv.hosts["gpu02"] = Host("gpu02", "10.0.0.2", gpus=GpuSpec(8, "H100-SXM5-80GB", 80, "nvlink"))
    inv.models["llama"] = Model("llama", "/models/llama")
    return inv


def _replica(tp: int = 1, port: int = 8000, **args: Any) -> Instance:
    """``big``: GPUs 0..tp-1 of gpu01 (the head) and of gpu02 (rank 1), vLLM 0.33."""
    return Instance(
        name="big",
        model="llama",
        engine="vllm-0.33",
        port=port,
        placement=tuple(GpuRef(h, i) for h in ("gpu01", "gpu02") for i in range(tp)),
        args={k.replace("_", "-"): v for k, v in args.items()},
    )


def _hosts(doc: dict[str, Any] | None, **kw: Any) -> dict[str, Any]:
    one = host({"/models/llama": doc} if doc else {})
    two = replace(host({"/models/llama": doc} if doc else {}, **kw), name="gpu02")
    return {"gpu01": one, "gpu02": two}


@pytest.mark.parametrize(
    "layers, pp_size, want",
    [
        (80, 2, [40, 40]),
        (80, 3, [27, 27, 26]),
        (61, 4, [15, 15, 16, 15]),
        (64, 4, [16, 16, 16, 16]),
        (62, 4, [15, 16, 16, 15]),
        (63, 4, [16, 16, 16, 15]),
    ],
)
def test_layers_split_as_vllm_does(layers: int, pp_size: int, want: list[int]) -> None:
    # vLLM get_pp_indices: the left-over layers go to the stages before the last (partitions[-2], [-3], ...)
    assert pp.partition(layers, pp_size) == want
    st = pp.stages(layers, pp_size, 4)
    assert [s.first_layer for s in st] == [sum(want[:i]) for i in range(pp_size)] and st[0].world == 4 * pp_size


def test_the_partition_override_is_vllms_and_checked_like_vllm() -> None:
    assert pp.partition(80, 2, "30,50") == [30, 50]
    for bad in ("30,40", "80", "a,b"):
        with pytest.raises(ValueError, match="VLLM_PP_LAYER_PARTITION"):
            pp.partition(80, 2, bad)


def test_each_stage_is_a_row_on_its_own_host_with_its_share_of_the_weights(llama: dict[str, Any]) -> None:
    rep = check_instances(_inv(), {"big": _replica(max_model_len=8192)}, _hosts(llama))
    head, worker = rep.rows
    assert (head.instance, head.host, head.replica) == ("big", "gpu01", "big")
    assert (worker.instance, worker.host, worker.replica) == ("big-node1", "gpu02", "big")
    assert head.stage == "pipeline stage 0 of 2: layers 0-39 of 80"
    assert worker.stage == "pipeline stage 1 of 2: layers 40-79 of 80"
    assert head.budget is not None and worker.budget is not None
    # 131.42 GiB over two stages of one GPU: half the layers each, the embedding on the first and the
    # LM head on the second (the same size): 65.71 GiB, what TP 2 on one host gives per rank too
    assert [round(M.gib(r.budget.ranks[0].weights), 2) for r in rep.rows if r.budget] == [65.71, 65.71]
    # KV per token of a stage: its 40 layers (2 x 8 kv heads x 128 x 2 B), half the model's
    assert head.budget.kv_bytes_per_token == worker.budget.kv_bytes_per_token == 40 * 2 * 8 * 128 * 2
    # the last stage also computes the logits (1024 seqs x 128256 x 4 B), the head has the rank-0 extra
    logits = 1024 * 128256 * 4
    gap = head.budget.ranks[0].available_kv - worker.budget.ranks[0].available_kv
    assert gap == logits - M.RANK0_EXTRA
    # both ranks of the world carry NCCL's buffers although TP is 1 on each host
    assert worker.budget.ranks[0].non_torch == M.NON_TORCH_BASE + M.NCCL_OVERHEAD
    # the replica's predicted KV size is the smaller stage's, reported under its name on the head's host
    assert rep.predictions() == {"big": ("gpu01", worker.budget.kv_tokens)}
    assert worker.budget.kv_tokens < head.budget.kv_tokens
    assert rep.to_json()["instances"][1]["stage"] == worker.stage


def test_a_stage_that_cannot_hold_one_request_refuses_the_replica_naming_its_host(llama: dict[str, Any]) -> None:
    # util 0.89: 8192 tokens x 160 KiB = 1.25 GiB of KV cache per stage; 1.04 GiB left on the head's
    # GPU, 0.62 GiB on the last stage's (the logits); 0.9 fits both, the last within the margin only
    rep = check_instances(_inv(), {"big": _replica(gpu_memory_utilization=0.89)}, _hosts(llama))
    assert rep.refused == ["big"]
    for row, avail, fit_len, fit_util in zip(rep.rows, ("1.04", "0.62"), (3520, 768), (0.9, 0.91)):
        [p] = [p for p in row.problems if p.severity == Severity.CRIT]
        assert p.check == "memory.kv" and f"needs 1.25 GiB of KV cache per GPU, {avail} GiB available" in p.message
        assert p.fit["max_model_len"] == fit_len and p.fit["gpu_memory_utilization"] == fit_util
    assert [f.host for f in rep.findings()] == ["gpu01", "gpu02"]
    ok = check_instances(_inv(), {"big": _replica(gpu_memory_utilization=0.91)}, _hosts(llama))
    assert ok.ok and not [p for r in ok.rows for p in r.problems]


def test_tp_within_each_host_splits_each_stage(llama: dict[str, Any]) -> None:
    rep = check_instances(_inv(), {"big": _replica(tp=2)}, _hosts(llama))
    assert rep.ok, [p.message for r in rep.rows for p in r.problems]
    assert [len(r.budget.ranks) for r in rep.rows if r.budget] == [2, 2]
    assert [round(M.gib(r.budget.ranks[0].weights), 2) for r in rep.rows if r.budget] == [32.85, 32.85]


def test_memory_held_on_the_worker_host_refuses_that_stage_only(llama: dict[str, Any]) -> None:
    held = {0: [GpuProc(pid=777, name="python3", used=40 * M.GiB, unit=None)]}
    rep = check_instances(_inv(), {"big": _replica(max_model_len=4096)}, _hosts(llama, procs=held))
    head, worker = rep.rows
    assert head.ok and not worker.ok and rep.refused == ["big"]
    [p] = [p for p in worker.problems if p.severity == Severity.CRIT]
    assert p.check == "gpu.free" and "pid 777 python3" in p.message


def test_the_model_missing_on_the_worker_host_is_said_on_that_host(llama: dict[str, Any]) -> None:
    hosts = _hosts(llama)
    hosts["gpu02"] = replace(hosts["gpu02"], models={})
    rep = check_instances(_inv(), {"big": _replica(max_model_len=4096)}, hosts)
    head, worker = rep.rows
    assert not [p for p in head.problems if p.check.startswith("model.")]
    assert [p.check for p in worker.problems] == ["model.unknown_arch"] and "gpu02" in worker.problems[0].message


def test_a_bad_partition_override_is_refused_and_the_port_is_checked_on_the_head_only(llama: dict[str, Any]) -> None:
    inst = replace(_replica(max_model_len=4096), env={"VLLM_PP_LAYER_PARTITION": "10,10"})
    rep = check_instances(
        _inv(), {"big": inst}, _hosts(llama, ss="LISTEN 0 4096 0.0.0.0:8000 0.0.0.0:* users:((\"nginx\",pid=9,fd=6))\n")
    )
    assert all("VLLM_PP_LAYER_PARTITION='10,10'" in r.problems[-1].message for r in rep.rows)
    assert not [p for p in rep.rows[1].problems if p.check == "port.taken"]  # headless: no API port


def test_a_replica_the_inventory_cannot_run_stays_one_crit_row(llama: dict[str, Any]) -> None:
    inst = replace(_replica(), placement=(GpuRef("gpu01", 0), GpuRef("gpu01", 1), GpuRef("gpu02", 0)))
    [row] = check_instances(_inv(), {"big": inst}, _hosts(llama)).rows
    assert [p.check for p in row.problems] == ["tp.hosts"]


def test_deploy_checks_a_replica_when_only_a_worker_unit_changes(tmp_path: Path, monkeypatch) -> None:
    from clusterctl.deploy.preflight import checks as pf
    from clusterctl.deploy.rollout.engine import Deploy, DeployOptions

    inv = _inv()
    inv.instances["big"] = _replica()
    seen: dict[str, Any] = {}

    def fake(inv_: Any, starting: Any, fleet: Any, **kw: Any) -> Any:
        seen.update(starting)
        return SimpleNamespace(ok=True, rows=[])

    monkeypatch.setattr(pf, "run_preflight", fake)
    d = Deploy(inv, list(inv.hosts.values()), lambda hs: None, str(tmp_path), DeployOptions())
    d.instances = dict(inv.instances)
    events: list[str] = []
    d.on_event = lambda *a, **k: events.append(str(a))
    plan = SimpleNamespace(
        hosts=[
            SimpleNamespace(host="gpu01", items=[SimpleNamespace(instance="big", action="keep")]),
            SimpleNamespace(host="gpu02", items=[SimpleNamespace(instance="big-node1", action="changed")]),
        ]
    )
    d.preflight(None, plan)
    assert list(seen) == ["big"] and not [e for e in events if "does not check" in e]
