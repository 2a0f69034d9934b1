"""A deterministic toy language model with quantization error and batch-composition noise.

The next-token distribution is a function of (seed, context): :data:`CANDIDATES`
words from :data:`engine.WORDS` with logits drawn from a hash of the context
(roughly normal, scale 2, so the gap between the two best candidates is
sometimes small, as in a real model).  On top of these logits:

- quantization error: a deterministic perturbation per (context, word) with
  standard deviation :data:`QUANT_SIGMA` of the method (fp8 0.01, int8 0.02,
  awq/gptq int4 0.1, ``broken`` 3.0; 16-token greedy outputs then differ from
  the unquantized ones for about 8 %, 19 %, 62 % and 100 % of prompts), the same on every instance with that
  setting, so quantized instances drift from an unquantized one measurably
  while two instances with the same setting agree;
- batch noise: a perturbation of standard deviation :data:`BATCH_SIGMA` keyed
  by the batch size of the step that produced the token (as reduction order
  in batched kernels changes with the batch in real vLLM; about 1 % of
  16-token greedy outputs change between batch 1 and batch 8); ``noise=False``
  turns it off.

Temperature 0 is greedy; otherwise ``random.Random(seed, context)`` samples.
The returned logprobs are the log-softmax of the perturbed logits (what the
"engine" computed).  ``leak`` makes the next tokens copy another prompt's text
(the cross-session KV-reuse fault).
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
from dataclasses import dataclass

from .engine import WORDS

CANDIDATES = 20
QUANT_SIGMA = {None: 0.0, "fp8": 0.01, "int8": 0.02, "int4": 0.1, "broken": 3.0}
BATCH_SIGMA = 0.003
#: EOS probability per generated token (never before the first token or with ignore_eos).
EOS_P = 1 / 48


def quant_key(method: str | None, broken: bool = False) -> str | None:
    """The error class of a ``--quantization`` method (unknown methods count as int8)."""
    if broken:
        return "broken"
    if method is None:
        return None
    m = method.lower()
    if "fp8" in m:
        return "fp8"
    if m in ("awq", "gptq", "awq_marlin", "gptq_marlin", "gptq_marlin_24", "moe_wna16", "bitsandbytes"):
        return "int4"
    return "int8"


def _normals(key: bytes, n: int) -> list[float]:
    """n roughly standard-normal numbers from a hash (sum of 4 uniforms, centred and scaled)."""
    out: list[float] = []
    block = 0
    while len(out) < n:
        h = hashlib.blake2b(key + block.to_bytes(2, "little"), digest_size=64).digest()
        for i in range(0, 64, 8):
            u = struct.unpack_from("<4H", h, i)
            out.append((sum(u) / 65535.0 - 2.0) * math.sqrt(3.0))
        block += 1
    return out[:n]


@dataclass
class Step:
    """One generated token: the word, its logprob, and the top alternatives (best first)."""

    word: str
    logprob: float
    top: list[tuple[str, float]]
    eos: bool


class ToyLM:
    """``next(context, ...)`` gives the next token; the model's state is only its settings."""

    def __init__(self, quantization: str | None = None, broken: bool = False, noise: bool = True) -> None:
        self.quant = quant_key(quantization, broken)
        self.sigma = QUANT_SIGMA[self.quant]
        self.noise = noise

    def logits(self, ctx: bytes, batch: int = 1) -> list[tuple[str, float]]:
        """Candidate words and their (perturbed) logits, best first."""
        h = hashlib.sha256(b"cand" + ctx).digest()
        words: list[str] = []
        for b in h + hashlib.sha256(b"cand2" + ctx).digest():
            w = WORDS[b % len(WORDS)]
            if w not in words:
                words.append(w)
            if len(words) == CANDIDATES:
                break
        base = _normals(b"logit" + ctx, len(words))
        out = [2.0 * x for x in base]
        if self.sigma:
            q = _normals(b"quant" + self.quant.encode() + ctx, len(words))  # type: ignore[union-attr]
            out = [x + self.sigma * e for x, e in zip(out, q)]
        if self.noise and batch > 1:
            e = _normals(b"batch" + batch.to_bytes(4, "little") + ctx, len(words))
            out = [x + BATCH_SIGMA * v for x, v in zip(out, e)]
        pairs = sorted(zip(words, out), key=lambda p: -p[1])
        z = max(x for _w, x in pairs)
        lse = z + math.log(sum(math.exp(x - z) for _w, x in pairs))
        return [(w, x - lse) for w, x in pairs]

    def next(self, ctx: bytes, temperature: float, rng: random.Random, batch: int = 1) -> Step:
        """The next token after the context digest ``ctx`` (see :func:`context`)."""
        dist = self.logits(ctx, batch)
        if temperature <= 0:
            choice = dist[0]
        else:
            choice = rng.choices(dist, [math.exp(lp / temperature) for _w, lp in dist])[0]
        eos = hashlib.sha256(b"eos" + ctx).digest()[0] < 256 * EOS_P
        return Step(choice[0], choice[1], dist, eos)


def context(seed: int | None, prompt: str) -> bytes:
    """The digest a sequence starts from."""
    return hashlib.sha256(f"{seed}|{prompt}".encode()).digest()


def advance(ctx: bytes, word: str) -> bytes:
    """The digest after appending ``word``."""
    return hashlib.sha256(ctx + word.encode()).digest()
