"""Pre-flight's memory prediction against vLLM's logged numbers (docs/vllm-simulator.md table).

The samples in tests/fixtures/vllm/ are real vLLM 0.11 logs on H100s:
Qwen3-8B at util 0.25 fails with 2.87 GiB of KV memory and an estimated
maximum length of 20880; Qwen3-32B TP=2 at 0.9 logs 37.97/38.04 GiB and
311,040/311,616 tokens.  The weights are read from sparse checkpoints'
safetensors headers by the node reader, as on a host.
"""

from __future__ import annotations

from typing import Any

import pytest

from clusterctl.deploy.preflight import memory as M
from clusterctl.deploy.preflight.checks import check_instances
from clusterctl.diagnose.findings import Severity
from clusterctl.inventory.model import Model
from unit.deploy.preflight_helpers import H100, H100_TOTAL, host, instance, inventory, make_sparse


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("models")
    return {
        "/models/qwen3-8b": make_sparse("Qwen3-8B", root / "qwen3-8b"),
        "/models/qwen3-32b": make_sparse("Qwen3-32B", root / "qwen3-32b"),
    }


def _budget(doc: dict[str, Any], tp: int, version: str = "0.11.0", **flags: Any) -> M.Budget:
    shape = M.ModelShape.from_config(doc["config"])
    rules = M.rules_for(version)
    seqs, tokens = rules.scheduler_defaults(H100, H100_TOTAL)
    s = M.Settings(
        util=flags.pop("util", rules.default_util),
        max_model_len=flags.pop("mml", shape.max_position),
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        **flags,
    )
    return M.predict(shape, M.WeightSizes.from_json(doc["weights"]), s, [H100_TOTAL] * tp, rules)


def test_node_reader_sums_the_real_tensor_sizes(models: dict[str, dict[str, Any]]) -> None:
    q8 = models["/models/qwen3-8b"]
    assert q8["bytes"] == 16_381_470_720 == M.WeightSizes.from_json(q8["weights"]).total
    assert q8["files"] == 5 and q8["dtypes"] == {"BF16": 16_381_470_720}
    assert [r for r, _ in q8["weights"]["vocab"]] == [151936, 151936]


@pytest.mark.parametrize("model,tp,logged_gib", [("/models/qwen3-8b", 1, 15.2683), ("/models/qwen3-32b", 2, 30.5172)])
def test_weights_per_gpu_match_vllm_model_loading_line(
    models: dict[str, dict[str, Any]], model: str, tp: int, logged_gib: float
) -> None:
    b = _budget(models[model], tp)
    assert abs(M.gib(b.ranks[0].weights) - logged_gib) / logged_gib < 0.002


def test_qwen3_8b_at_quarter_util_matches_the_failure_sample(models: dict[str, dict[str, Any]]) -> None:
    b = _budget(models["/models/qwen3-8b"], 1, util=0.25, mml=40960)
    assert round(M.gib(b.ranks[0].available_kv), 2) == 2.87
    assert round(M.gib(b.needed_kv), 2) == 5.62 or round(M.gib(b.needed_kv), 3) == 5.625
    assert b.kv_bytes_per_token == 147_456
    assert b.max_len_for(b.worst.available_kv) == 20880


def test_qwen3_32b_tp2_matches_the_success_sample(models: dict[str, dict[str, Any]]) -> None:
    b = _budget(models["/models/qwen3-32b"], 2, util=0.9, mml=32768)
    assert [round(M.gib(r.available_kv), 2) for r in b.ranks] == [37.97, 38.04]
    assert [r.num_blocks * 16 for r in b.ranks] == [311_040, 311_616]
    assert b.kv_tokens == 311_040 and b.ranks[0].num_blocks == 19440
    assert round(b.max_concurrency(), 2) == 9.49


def test_version_rules_change_the_budget(models: dict[str, dict[str, Any]]) -> None:
    doc = models["/models/qwen3-8b"]
    old = _budget(doc, 1, "0.11.0", util=0.9)
    new = _budget(doc, 1, "0.33.0", util=0.9)
    # 0.33 (graphs profiled into the budget since 0.21) leaves less for the KV cache.
    assert old.ranks[0].available_kv - new.ranks[0].available_kv == pytest.approx(old.ranks[0].graphs, abs=1)
    assert M.rules_for("0.33.0").default_util == 0.92 and M.rules_for("0.11.0").default_util == 0.9
    assert M.rules_for("0.33.0").scheduler_defaults("NVIDIA H200", 140 * M.GiB) == (1024, 8192)
    assert M.rules_for("0.33.0").scheduler_defaults("NVIDIA B200", 178 * M.GiB) == (1024, 16384)
    assert M.rules_for("0.11.0").scheduler_defaults("NVIDIA A100-SXM4-80GB", 79 * M.GiB) == (256, 2048)
    eager = _budget(doc, 1, "0.33.0", util=0.9, enforce_eager=True)
    assert eager.ranks[0].graphs == 0 and eager.kv_tokens > new.kv_tokens
    fp8 = _budget(doc, 1, "0.11.0", util=0.9, kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token * 2 == old.kv_bytes_per_token


def test_preflight_refuses_with_the_numbers_and_what_would_fit(models: dict[str, dict[str, Any]]) -> None:
    inv = inventory()
    inst = instance("q8", gpu_memory_utilization=0.25, max_model_len=40960)
    report = check_instances(inv, {"q8": inst}, {"gpu01": host(models)})
    row = report.row("q8")
    assert not report.ok and report.refused == ["q8"]
    [p] = [p for p in row.problems if p.check == "memory.kv"]
    assert p.severity == Severity.CRIT
    assert "5.62 GiB" in p.message and "2.87 GiB available" in p.message and "20880" in p.message
    assert p.numbers["estimated_max_model_len"] == 20880
    # What would fit keeps the 0.5 GiB margin: shorter than vLLM's own estimate, and a utilisation
    # whose prediction really holds one 40960-token request plus the margin.
    assert 16000 < p.fit["max_model_len"] < 20880 and p.fit["max_model_len"] % 16 == 0
    util = p.fit["gpu_memory_utilization"]
    assert util == 0.3  # 5.62 GiB + 0.5 GiB margin needs 0.2911 x 79.15 GiB
    ok = check_instances(
        inv, {"q8": instance("q8", gpu_memory_utilization=util, max_model_len=40960)}, {"gpu01": host(models)}
    )
    assert ok.ok and not ok.row("q8").problems
    below = check_instances(
        inv, {"q8": instance("q8", gpu_memory_utilization=0.29, max_model_len=40960)}, {"gpu01": host(models)}
    )
    assert below.row("q8").problems
    short = check_instances(
        inv,
        {"q8": instance("q8", gpu_memory_utilization=0.25, max_model_len=p.fit["max_model_len"])},
        {"gpu01": host(models)},
    )
    assert short.ok


def test_defaults_come_from_the_engine_version(models: dict[str, dict[str, Any]]) -> None:
    inv = inventory()
    rows = check_instances(
        inv,
        {"a": instance("a", engine="vllm-0.11"), "b": instance("b", gpus=(1,), port=8001, engine="vllm-0.33")},
        {"gpu01": host(models)},
    )
    assert rows.row("a").settings["gpu_memory_utilization"] == 0.9
    assert rows.row("b").settings["gpu_memory_utilization"] == 0.92
    assert rows.row("a").settings["max_model_len"] == 40960
    assert rows.row("a").settings["max_num_batched_tokens"] == 8192
    assert rows.ok


def test_margin_warns_when_the_fit_is_tight(models: dict[str, dict[str, Any]]) -> None:
    # util 0.29 leaves 6.03 GiB for a 5.62 GiB need: vLLM starts, but with less than the margin.
    r = check_instances(
        inventory(), {"q": instance("q", gpu_memory_utilization=0.29, max_model_len=40960)}, {"gpu01": host(models)}
    ).row("q")
    assert r.ok and [(p.check, p.severity) for p in r.problems] == [("memory.margin", Severity.WARN)]
    assert r.problems[0].numbers["available_kv_gib"] == 6.03


def test_no_memory_left_for_the_kv_cache(models: dict[str, dict[str, Any]]) -> None:
    r = check_instances(
        inventory(), {"q": instance("q", model="qwen3-32b", gpu_memory_utilization=0.5)}, {"gpu01": host(models)}
    ).row("q")
    [p] = [p for p in r.problems if p.check == "memory.no_kv"]
    assert "weights 61.0" in p.message and p.fit["gpu_memory_utilization"] is not None


def test_model_not_on_the_host_is_estimated_from_the_inventory_arch(models: dict[str, dict[str, Any]]) -> None:
    inv = inventory()
    with_files = check_instances(
        inv, {"q": instance("q", gpu_memory_utilization=0.9, max_model_len=32768)}, {"gpu01": host(models)}
    ).row("q")
    no_files = check_instances(
        inv, {"q": instance("q", gpu_memory_utilization=0.9, max_model_len=32768)}, {"gpu01": host({})}
    ).row("q")
    assert [p.check for p in no_files.problems] == ["model.not_on_host"]
    assert no_files.weights_source == "inventory"
    assert with_files.budget is not None and no_files.budget is not None
    err = abs(no_files.budget.kv_tokens - with_files.budget.kv_tokens) / with_files.budget.kv_tokens
    assert err < 0.01
    # Without an arch there is nothing to size: a warning saying why, never a refusal.
    r = check_instances(inv, {"q": instance("q", model="qwen3-32b")}, {"gpu01": host({})}).row("q")
    assert [(p.check, p.severity) for p in r.problems] == [("model.unknown_arch", Severity.WARN)] and r.ok


def test_bad_flag_value_is_a_crit_naming_the_flag(models: dict[str, dict[str, Any]]) -> None:
    r = check_instances(inventory(), {"q": instance("q", gpu_memory_utilization=1.2)}, {"gpu01": host(models)}).row("q")
    assert [p.check for p in r.problems] == ["flags"] and "--gpu-memory-utilization" in r.problems[0].message
    r = check_instances(inventory(), {"q": instance("q", max_model_len="64k")}, {"gpu01": host(models)}).row("q")
    assert [p.check for p in r.problems] == ["flags.max_model_len"]


def test_report_json_carries_the_numbers(models: dict[str, dict[str, Any]]) -> None:
    rep = check_instances(
        inventory(), {"q": instance("q", gpu_memory_utilization=0.25, max_model_len=40960)}, {"gpu01": host(models)}
    )
    doc = rep.to_json()
    assert doc["ok"] is False and doc["refused"] == ["q"] and doc["margin_gib"] == 0.5
    inst = doc["instances"][0]
    assert inst["memory"]["ranks"][0]["available_kv_gib"] == 2.87
    assert inst["problems"][0]["severity"] == "CRIT"
    [f] = rep.findings()
    assert f.check == "preflight.memory.kv" and f.subject == "instance:q" and "max_model_len" in f.action


def test_fp8_kv_cache_is_offered_when_it_would_fit(models: dict[str, dict[str, Any]]) -> None:
    r = check_instances(
        inventory(), {"q": instance("q", gpu_memory_utilization=0.27, max_model_len=40960)}, {"gpu01": host(models)}
    ).row("q")
    [p] = r.problems
    assert p.check == "memory.kv" and p.fit["kv_cache_dtype"] == "fp8"
    fp8 = check_instances(
        inventory(),
        {"q": instance("q", gpu_memory_utilization=0.27, max_model_len=40960, kv_cache_dtype="fp8")},
        {"gpu01": host(models)},
    )
    assert fp8.ok and not fp8.row("q").problems
    # At 0.25 even fp8 (2.81 GiB + margin) does not fit in 2.87 GiB: not offered.
    r = check_instances(
        inventory(), {"q": instance("q", gpu_memory_utilization=0.25, max_model_len=40960)}, {"gpu01": host(models)}
    ).row("q")
    assert "kv_cache_dtype" not in r.problems[0].fit


def test_unknown_length_without_config_is_said_not_guessed() -> None:
    r = check_instances(inventory(), {"q": instance("q")}, {"gpu01": host({})}).row("q")
    assert [(p.check, p.severity) for p in r.problems] == [
        ("model.not_on_host", Severity.WARN),
        ("memory.unknown_len", Severity.WARN),
    ]
    assert r.ok and r.budget is not None and r.budget.ranks[0].weights > 15 * M.GiB


def test_llama_70b_needs_tensor_parallelism(tmp_path_factory: pytest.TempPathFactory) -> None:
    doc = make_sparse("llama-3-70b", tmp_path_factory.mktemp("m") / "llama")
    assert round(M.gib(M.WeightSizes.from_json(doc["weights"]).total), 2) == 131.42  # research vllm.md §4.3
    inv = inventory()
    inv.models["llama"] = Model("llama", "/models/llama")
    one = check_instances(inv, {"l": instance("l", model="llama")}, {"gpu01": host({"/models/llama": doc})}).row("l")
    [p] = one.problems
    assert p.check == "memory.weights" and "131.42 GiB per GPU" in p.message
    assert p.fit == {"tensor_parallel_size": 2}
    two = check_instances(
        inv, {"l": instance("l", model="llama", gpus=(0, 1))}, {"gpu01": host({"/models/llama": doc})}
    ).row("l")
    assert two.ok and two.budget is not None and round(M.gib(two.budget.ranks[0].weights), 2) == 65.71
