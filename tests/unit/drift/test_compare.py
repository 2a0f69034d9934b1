"""Comparison metrics, thresholds and prompt-set errors on hand-made outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.drift import compare, prompts, store
from clusterctl.drift.client import Output
from clusterctl.errors import ClusterctlError, ConfigError

TOP = {"a": -0.1, "b": -2.5, "c": -4.0}


def out(tokens: str, top: dict[str, float] | None = None) -> Output:
    t = tokens.split()
    return Output(" ".join(t), t, [dict(top or TOP) for _ in t])


def test_identical_outputs_are_exact_with_zero_kl() -> None:
    d = compare.diff("p", out("a a a"), out("a a a"))
    assert d.exact and d.first_divergence is None and d.vllm_rule and d.agreement == 1.0 and d.kl == 0.0


def test_first_divergence_and_vllm_rule_both_ways() -> None:
    d = compare.diff("p", out("a a b a"), out("a a a a"))
    assert not d.exact and d.first_divergence == 2 and d.agreement == 0.5
    assert d.vllm_rule and (d.baseline_token, d.new_token) == ("b", "a")
    narrow = Output("a a z", ["a", "a", "z"], [TOP, TOP, {"z": -0.1, "a": -3.0}])
    d2 = compare.diff("p", out("a a b"), narrow)  # z is not in the baseline's top-k
    assert d2.first_divergence == 2 and not d2.vllm_rule


def test_kl_grows_with_a_shifted_distribution_and_missing_tokens_take_the_floor() -> None:
    near = compare.diff("p", out("a a", TOP), out("a a", {"a": -0.12, "b": -2.4, "c": -4.0}))
    far = compare.diff("p", out("a a", TOP), out("a a", {"a": -1.0, "b": -0.6, "d": -3.0}))
    assert 0 < near.kl < 0.001 < far.kl


def test_a_length_only_difference_is_not_exact_but_passes_vllms_rule() -> None:
    # vLLM's check_logprobs_close walks zip(ids_0, ids_1): a prefix never reaches a mismatch, so it passes.
    d = compare.diff("p", out("a a a"), out("a a"))
    assert d.first_divergence == 2 and d.length_only and d.vllm_rule and not d.exact
    assert compare.diff("p", out("a a"), out("a a a")).vllm_rule


def ids(text: str, toks: list[int], top: list[dict[int, float]]) -> Output:
    offsets = [0, 1, 2][: len(toks)]
    return Output(
        text,
        [f"token_id:{t}" for t in toks],
        [{f"token_id:{k}": v for k, v in p.items()} for p in top],
        by_id=True,
        offsets=offsets,
    )


def test_tokens_are_compared_by_id_not_by_their_text() -> None:
    # Two ids that decode to the same text (a byte-fallback pair, a duplicate vocabulary entry): the same
    # string, but a different token; by id it is a divergence, judged by vLLM's rule on ids.
    top = [{1: -0.1, 2: -0.2, 9: -3.0}] * 3
    d = compare.diff("p", ids("abc", [1, 1, 1], top), ids("abc", [1, 2, 1], top))
    assert not d.exact and d.first_divergence == 1 and d.vllm_rule
    assert (d.baseline_id, d.new_id) == ("token_id:1", "token_id:2") and d.baseline_token == d.new_token == "b"
    narrow = [{1: -0.1, 9: -3.0}] * 3  # the baseline's top-k lacks id 2
    assert not compare.diff("p", ids("abc", [1, 1, 1], narrow), ids("abc", [1, 2, 1], top)).vllm_rule
    with pytest.raises(ValueError, match="token ids"):
        compare.diff("p", ids("abc", [1, 1, 1], top), out("a b c"))


def test_thresholds_judge_and_calibrate() -> None:
    t = compare.Thresholds()
    s = compare.summarize([compare.diff("1", out("a a"), out("a a")), compare.diff("2", out("a b"), out("a a"))])
    assert s["exact_match"] == 0.5
    assert t.judge(s) == ["exact match 50% < 90%"]
    loose = t.calibrated({"exact_match": 0.7, "vllm_rule_pass": 1.0, "mean_kl": 0.02})
    assert loose.min_exact_match == pytest.approx(0.4) and loose.max_mean_kl == pytest.approx(0.04)
    assert t.calibrated({"exact_match": 1.0, "vllm_rule_pass": 1.0, "mean_kl": 0.0}) == t  # never tighter


def test_bad_threshold_and_prompt_files_name_file_and_line(tmp_path: Path) -> None:
    y = tmp_path / "d.yaml"
    y.write_text("default:\n  min_exact_match: 0.9\n  max_kl: 3\n")
    with pytest.raises(ConfigError, match=r"d.yaml:3: max_kl"):
        compare.load_thresholds(y, None)
    j = tmp_path / "p.jsonl"
    j.write_text('{"id": "a", "prompt": "x"}\n\n{"prompt": 3}\n{bad\n{"id": "a", "prompt": "y"}\n')
    with pytest.raises(ConfigError) as e:
        prompts.load(j)
    msg = str(e.value)
    assert "p.jsonl:3: needs a non-empty string 'prompt'" in msg and "p.jsonl:4: not JSON" in msg
    assert "p.jsonl:5: duplicate id 'a'" in msg


def test_shipped_prompt_set_covers_the_four_kinds() -> None:
    ps = prompts.load(Path(__file__).resolve().parents[3] / "checks" / "drift" / "basic.jsonl")
    assert {p.category for p in ps} == {"facts", "arithmetic", "code", "long-context"}
    assert max(len(p.prompt.split()) for p in ps) > 1000


def test_baseline_names_and_missing_baselines(tmp_path: Path) -> None:
    with pytest.raises(ClusterctlError, match="name is letters"):
        store.load("../etc/passwd", tmp_path)
    with pytest.raises(ClusterctlError, match="no baseline 'previous'"):
        store.load("previous", tmp_path)
