"""The toy language model: determinism, sampling, quantization drift, batch noise."""

from __future__ import annotations

import random

from clusterctl.lab.vllm_sim.toylm import ToyLM, advance, context, quant_key

PROMPTS = [f"prompt number {i} about the cluster" for i in range(200)]


def greedy(lm: ToyLM, prompt: str, n: int = 16, batch: int = 1, seed: int = 0) -> list[tuple[str, float]]:
    ctx, rng, out = context(seed, prompt), random.Random(0), []
    for _ in range(n):
        st = lm.next(ctx, 0.0, rng, batch)
        out.append((st.word, st.logprob))
        ctx = advance(ctx, st.word)
    return out


def differing(a: ToyLM, b: ToyLM, batch_b: int = 1) -> int:
    """Prompts whose greedy output text differs."""
    return sum([w for w, _ in greedy(a, p)] != [w for w, _ in greedy(b, p, batch=batch_b)] for p in PROMPTS)


def test_greedy_is_deterministic_in_tokens_and_logprobs() -> None:
    assert greedy(ToyLM(), "hello") == greedy(ToyLM(), "hello")
    assert greedy(ToyLM(), "hello") != greedy(ToyLM(), "hello", seed=1)
    lps = [lp for _w, lp in greedy(ToyLM(), "hello")]
    assert all(lp <= 0 for lp in lps)


def test_sampling_at_temperature_depends_on_the_rng() -> None:
    lm = ToyLM()
    ctx = context(0, "sample me")

    def draw(seed: int) -> list[str]:
        rng = random.Random(seed)
        return [lm.next(ctx, 1.0, rng).word for _ in range(30)]

    assert draw(1) == draw(1)
    assert draw(1) != draw(2)
    assert len(set(draw(3))) > 1


def test_two_unquantized_instances_agree_and_quantized_ones_drift_by_method() -> None:
    base = ToyLM(noise=False)
    assert differing(base, ToyLM(noise=False)) == 0
    assert all(greedy(base, p) == greedy(ToyLM(noise=False), p) for p in PROMPTS[:20])  # logprobs too
    fp8 = differing(base, ToyLM("fp8", noise=False))
    awq = differing(base, ToyLM("awq", noise=False))
    broken = differing(base, ToyLM(None, broken=True, noise=False))
    assert 0 < fp8 < awq < broken
    assert broken > 0.9 * len(PROMPTS)
    # the same quantization on two instances gives the same outputs
    assert differing(ToyLM("awq", noise=False), ToyLM("awq", noise=False)) == 0


def test_batch_noise_changes_few_greedy_outputs_and_can_be_turned_off() -> None:
    noisy = differing(ToyLM(), ToyLM(), batch_b=8)
    assert 0 < noisy < differing(ToyLM(noise=False), ToyLM("fp8", noise=False))
    assert differing(ToyLM(noise=False), ToyLM(noise=False), batch_b=8) == 0
    assert differing(ToyLM(), ToyLM(), batch_b=1) == 0  # alone, the noise term is absent


def test_quant_keys() -> None:
    assert quant_key(None) is None
    assert quant_key("fp8") == "fp8"
    assert quant_key("gptq_marlin") == "int4"
    assert quant_key("compressed-tensors") == "int8"
    assert quant_key("awq", broken=True) == "broken"
