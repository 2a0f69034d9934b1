"""Request handling behind an interface: what the HTTP layer asks of "the engine".

The server runs :class:`batching.StepEngine` (continuous batching, latency
profiles, the toy language model of ``toylm``, faults).  :class:`ImmediateEngine`
(each request generated at once by :class:`HashLM`, no timing) remains for
callers that need no timing model.  The HTTP server only uses :class:`Engine`;
an engine with ``records_metrics = True`` observes the request metrics itself.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Iterator, Protocol

_TOKEN_RE = re.compile(r" ?[A-Za-z]+| ?\d| ?[^\sA-Za-z\d]|\s+")
_WORDS = (
    " the of and to in is was for on that with as it by at from his an were are which this be"
    " or has had not but first one their its new after who they have her she two been other when"
    " there all during into school time may years more most only over city some world would where"
    " later up such used many can state about national out known university united then made"
    " cluster model token memory network server request cache layer batch engine node rack"
    " latency fabric switch queue tensor kernel stream prefix block vector value signal"
    " . , ; : ' -"
).split(" ")
WORDS = tuple(w if w in ".,;:'-" else " " + w for w in _WORDS if w)
MAX_TOP = 20


def tokenize(text: str) -> list[str]:
    """Split text into word-ish tokens (leading space kept, as BPE vocabularies do)."""
    return _TOKEN_RE.findall(text)


def token_id(tok: str, vocab: int) -> int:
    return zlib.crc32(tok.encode()) % vocab


@dataclass
class GenRequest:
    """One sequence to generate.  ``logprobs``: number of top alternatives (None = none)."""

    prompt: str
    prompt_tokens: list[str]
    max_tokens: int
    temperature: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None
    ignore_eos: bool = False
    arrival: float = field(default_factory=time.monotonic)
    session: str = ""  # who sent it (OpenAI ``user``); "" = a session of its own
    remote_kv: bool = False  # the prompt's KV was pulled from a prefill instance (disaggregation)
    kv_wait_s: float = 0.0  # simulated seconds that pull took before the request reached the engine


@dataclass
class TokenEvent:
    """One generated token; ``finish_reason`` is set on the last one ("stop" | "length")."""

    text: str
    token_id: int
    logprob: float
    top: list[tuple[str, float]]
    finish_reason: str | None = None
    stop_reason: str | None = None


@dataclass
class EngineStats:
    running: int
    waiting: int
    kv_usage: float  # 0..1


class EngineDead(Exception):
    """The engine died while (or before) serving a request: the front end answers 500."""


class Engine(Protocol):
    """What the server needs from an engine."""

    def generate(self, req: GenRequest) -> Iterator[TokenEvent]:
        """Yield the tokens of ``req`` as they are produced (the last one has a finish_reason)."""
        ...

    def stats(self) -> EngineStats: ...

    def is_dead(self) -> bool: ...


class HashLM:
    """A deterministic toy language model.

    The next-token distribution is a function of (seed, prompt, tokens so far):
    MAX_TOP candidates from :data:`WORDS` with hash-derived logits.  With
    temperature 0 it is greedy; otherwise it samples with ``random.Random(seed)``
    (a random seed when none is given).  EOS ends a sequence with probability
    6/256 per token (never before the first token or with ``ignore_eos``).
    """

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def _dist(self, key: bytes) -> list[tuple[str, float]]:
        h = hashlib.sha256(key).digest()
        idx = []
        for b in h:
            w = WORDS[b % len(WORDS)]
            if w not in idx:
                idx.append(w)
            if len(idx) == MAX_TOP:
                break
        logits = [-(i * 0.7) - (h[(i * 7) % 32] / 255.0) for i in range(len(idx))]
        z = math.log(sum(math.exp(x) for x in logits))
        return [(w, x - z) for w, x in zip(idx, logits)]

    def run(self, req: GenRequest) -> Iterator[TokenEvent]:
        rng = random.Random(req.seed if req.seed is not None else random.getrandbits(64))
        ctx = hashlib.sha256(f"{req.seed}|{req.prompt}".encode()).digest()
        text = ""
        for i in range(req.max_tokens):
            dist = self._dist(ctx + i.to_bytes(4, "little"))
            if req.temperature <= 0:
                choice = dist[0]
            else:
                weights = [math.exp(lp / req.temperature) for _w, lp in dist]
                choice = rng.choices(dist, weights)[0]
            top = dist[: req.logprobs] if req.logprobs else []
            if req.logprobs is not None and choice not in top:
                top = [choice, *top]  # vLLM: the sampled token plus the top-N
            tok = choice[0]
            text += tok
            ev = TokenEvent(tok, token_id(tok, self.vocab), choice[1], top)
            hit = next((s for s in req.stop if s and s in text), None)
            eos = not req.ignore_eos and i > 0 and ctx[0] < 6  # ~1/43 per token
            if hit is not None:
                cut = text.index(hit)
                ev.text = tok[: max(0, len(tok) - (len(text) - cut))]
                ev.finish_reason, ev.stop_reason = "stop", hit
            elif eos:
                ev.finish_reason = "stop"
            elif i == req.max_tokens - 1:
                ev.finish_reason = "length"
            ctx = hashlib.sha256(ctx + tok.encode()).digest()
            yield ev
            if ev.finish_reason:
                return


class ImmediateEngine:
    """Generates each request at once (no batching, no timing model); counts running requests."""

    def __init__(self, vocab: int, kv_tokens: int) -> None:
        self.lm = HashLM(vocab)
        self.kv_tokens = max(1, kv_tokens)
        self._lock = threading.Lock()
        self._running = 0
        self._used_tokens = 0
        self.dead = False

    def generate(self, req: GenRequest) -> Iterator[TokenEvent]:
        n = len(req.prompt_tokens)
        with self._lock:
            self._running += 1
            self._used_tokens += n
        try:
            for ev in self.lm.run(req):
                with self._lock:
                    self._used_tokens += 1
                    n += 1
                yield ev
        finally:
            with self._lock:
                self._running -= 1
                self._used_tokens -= n

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(self._running, 0, min(1.0, self._used_tokens / self.kv_tokens))

    def is_dead(self) -> bool:
        return self.dead
