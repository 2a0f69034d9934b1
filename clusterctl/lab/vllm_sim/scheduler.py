"""Continuous batching, as vLLM V1's scheduler does it, without threads or clocks.

:meth:`Scheduler.step` plans one engine step and returns its :class:`profiles.StepLoad`;
:meth:`Scheduler.finish_step` applies it (tokens computed, one token sampled
per sequence whose prompt is done).  The caller spends the step's time (the
threaded engine waits it out; :func:`simulate` advances a virtual clock).

Per step, under ``max_num_batched_tokens`` (the token budget) and ``max_num_seqs``:

1. running sequences first, in arrival order: one token each when decoding, the
   next chunk of their prompt otherwise (chunked prefill);
2. a sequence that needs a KV block when none is free preempts the most
   recently admitted running sequence (RECOMPUTE: its blocks are freed, it goes
   back to the front of the queue and recomputes prompt + output later);
   ``num_preemptions`` counts them;
3. then waiting sequences, first come first served, while budget, seats and
   blocks last; with prefix caching a new sequence first takes over the full
   blocks of its prompt that are already cached (hash chain of 16-token
   blocks), and only the rest is computed.

KV blocks hold ``block_size`` tokens; a sequence holds ``cdiv(computed, 16)``
blocks.  Freed blocks of full prompt blocks stay in the prefix cache (evicted
least recently used when a block is needed).
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from .profiles import ModelCost, Profile, StepLoad, step_time
from .toylm import ToyLM, advance, context


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Seq:
    """One request inside the scheduler.  Times are simulated seconds (1x)."""

    rid: int
    prompt: str
    prompt_tokens: list[str]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    arrival: float = 0.0
    session: str = ""
    # state
    computed: int = 0  # tokens whose KV is in the cache
    out: list[str] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    ctx: bytes = b""
    rng: random.Random | None = None
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0
    cached_hits: int = 0
    leak: list[str] = field(default_factory=list)  # words to copy (context-leak fault)
    hashes: list[bytes] = field(default_factory=list)  # prompt block hash chain
    last_token: float | None = None
    remote_kv: bool = False  # prompt KV pulled from a prefill instance: only the last token is computed

    @property
    def known(self) -> int:
        """Tokens the model has to have seen before sampling the next one."""
        return len(self.prompt_tokens) + len(self.out)


@dataclass
class Emitted:
    """A token produced by a step: for the front end."""

    seq: Seq
    word: str
    logprob: float
    top: list[tuple[str, float]]
    finish_reason: str | None


class BlockPool:
    """KV blocks with a prefix cache: free blocks, and cached blocks keyed by prefix hash.

    Block 0 is vLLM V1's null block (``BlockPool.null_block``, taken from the free queue at start
    and never handed out), so ``num_blocks`` logged as ``num_gpu_blocks`` hold one block less;
    usage is counted over the others, as vLLM's ``get_usage`` does."""

    def __init__(self, num_blocks: int, prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.usable = max(0, num_blocks - 1)
        self.prefix_caching = prefix_caching
        self.free: deque[int] = deque(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.hash_of: dict[int, bytes] = {}
        self.by_hash: dict[bytes, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unused, LRU first

    @property
    def available(self) -> int:
        return len(self.free) + len(self.evictable)

    @property
    def used(self) -> int:
        return self.usable - self.available

    def take(self) -> int | None:
        if self.free:
            b = self.free.popleft()
        elif self.evictable:
            b, _ = self.evictable.popitem(last=False)
            self.by_hash.pop(self.hash_of.pop(b), None)
        else:
            return None
        self.ref[b] = 1
        return b

    def lookup(self, hashes: list[bytes]) -> list[int]:
        """Cached blocks for the leading prompt-block hashes (each gets a reference)."""
        got: list[int] = []
        if not self.prefix_caching:
            return got
        for h in hashes:
            b = self.by_hash.get(h)
            if b is None:
                break
            if self.ref[b] == 0:
                self.evictable.pop(b, None)
            self.ref[b] += 1
            got.append(b)
        return got

    def register(self, b: int, h: bytes) -> None:
        """Mark a full prompt block as reusable under hash ``h``."""
        if self.prefix_caching and h not in self.by_hash and b not in self.hash_of:
            self.by_hash[h] = b
            self.hash_of[b] = h

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if b in self.hash_of:
                    self.evictable[b] = None
                else:
                    self.free.append(b)


def block_hashes(tokens: list[str], block_size: int, salt: str = "") -> list[bytes]:
    """The hash chain of the full blocks of ``tokens`` (each depends on all before it)."""
    out: list[bytes] = []
    h = hashlib.sha256(salt.encode()).digest()
    for i in range(len(tokens) // block_size):
        h = hashlib.sha256(h + "\x00".join(tokens[i * block_size : (i + 1) * block_size]).encode()).digest()
        out.append(h)
    return out


@dataclass
class Counters:
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0


class Scheduler:
    """Continuous batching over a :class:`BlockPool`; times come from a latency profile."""

    def __init__(
        self,
        profile: Profile,
        cost: ModelCost,
        lm: ToyLM,
        *,
        num_blocks: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        block_size: int = 16,
        prefix_caching: bool = True,
        full_prompt_admission: bool = True,
    ) -> None:
        self.profile, self.cost, self.lm = profile, cost, lm
        #: Admit a waiting sequence only when all its tokens fit the free blocks, not only its first
        #: chunk (vLLM's ``scheduler_reserve_full_isl``, default on in the 0.32 engine; 0.11 checked
        #: the first chunk only and admitted prompts that were preempted half-way through).
        self.full_prompt_admission = full_prompt_admission
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, prefix_caching)
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.counters = Counters()
        self.slowdown = 1.0
        #: Context-leak fault: when set, an admitted sequence copies words of the previous session's prompt.
        self.leak = False
        self._last_prompt: tuple[str, list[str]] | None = None
        self._plan: list[tuple[Seq, int]] = []

    # ---- queue
    def add(self, seq: Seq) -> None:
        seq.ctx = context(seq.seed, seq.prompt)
        seq.rng = random.Random(
            hashlib.sha256(f"{seq.seed}|{seq.prompt}|rng".encode()).digest()
            if seq.seed is not None
            else random.getrandbits(64)
        )
        self.waiting.append(seq)

    def abort(self, seq: Seq) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
            self.pool.release(seq.blocks)
            seq.blocks = []

    @property
    def kv_usage(self) -> float:
        return self.pool.used / self.pool.usable if self.pool.usable else 0.0

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step
    def _grow(self, seq: Seq, n: int) -> bool:
        need = cdiv(seq.computed + n, self.block_size) - len(seq.blocks)
        if need > self.pool.available:
            return False
        for _ in range(need):
            b = self.pool.take()
            assert b is not None
            seq.blocks.append(b)
        return True

    def _preempt(self, victim: Seq) -> None:
        self.running.remove(victim)
        self.pool.release(victim.blocks)
        victim.blocks = []
        victim.computed = 0
        victim.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(victim)

    def _admit(self, seq: Seq) -> None:
        """Prefix-cache lookup for a sequence entering the running set."""
        toks = seq.prompt_tokens + seq.out
        if not seq.hashes:
            seq.hashes = block_hashes(seq.prompt_tokens, self.block_size)
        hashes = seq.hashes
        hits = self.pool.lookup(hashes)
        # At least one token is computed (the last prompt token yields the first logits).
        while hits and len(hits) * self.block_size >= len(toks):
            self.pool.release([hits.pop()])
        seq.blocks = hits
        seq.computed = len(hits) * self.block_size
        if seq.preemptions == 0:
            self.counters.prefix_queries += len(seq.prompt_tokens)
            self.counters.prefix_hits += seq.computed
            seq.cached_hits = seq.computed
        if seq.remote_kv and seq.preemptions == 0:
            seq.computed = max(seq.computed, len(seq.prompt_tokens) - 1)
        if self.leak and self._last_prompt and self._last_prompt[0] != seq.session and not seq.out:
            seq.leak = [w for w in self._last_prompt[1] if w.strip()][:8]
        if not seq.out:
            self._last_prompt = (seq.session, seq.prompt_tokens)

    def step(self, now: float) -> StepLoad:
        """Plan the next step; returns its load (empty when idle)."""
        budget = self.budget
        plan: list[tuple[Seq, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.known - seq.computed, budget)
            while not self._grow(seq, n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                plan.append((seq, n))
                budget -= n
                i += 1
                continue
            if seq not in self.running:
                break
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            self._admit(seq)
            n = min(seq.known - seq.computed, budget)
            whole = cdiv(seq.known, self.block_size) - len(seq.blocks)
            if (self.full_prompt_admission and whole > self.pool.available) or not self._grow(seq, n):
                self.pool.release(seq.blocks)
                seq.blocks, seq.computed = [], 0
                break
            self.waiting.popleft()
            self.running.append(seq)
            if seq.first_scheduled is None:
                seq.first_scheduled = now
            plan.append((seq, n))
            budget -= n
        self._plan = plan
        return StepLoad(tuple(n for _s, n in plan), tuple(s.computed for s, _n in plan))

    def duration(self, load: StepLoad) -> float:
        """Seconds the step takes at 1x (with the slow-down fault applied)."""
        return step_time(self.profile, self.cost, load) * self.slowdown

    def finish_step(self, now: float) -> list[Emitted]:
        """Apply the planned step at time ``now`` (its end); returns the tokens it produced."""
        out: list[Emitted] = []
        batch = len(self._plan)
        self.counters.steps += 1 if batch else 0
        for seq, n in self._plan:
            before = seq.computed
            seq.computed += n
            plen = len(seq.prompt_tokens)
            if before < plen:
                for bi in range(before // self.block_size, min(seq.computed, plen) // self.block_size):
                    self.pool.register(seq.blocks[bi], seq.hashes[bi])
            if seq.computed < seq.known:
                continue  # still prefilling (or recomputing after a preemption)
            out.append(self._sample(seq, batch, now))
        self._plan = []
        return out

    def _sample(self, seq: Seq, batch: int, now: float) -> Emitted:
        assert seq.rng is not None
        if seq.leak:
            word = seq.leak.pop(0)
            st = self.lm.next(seq.ctx, seq.temperature, seq.rng, batch)
            logprob, top, eos = -0.05, st.top, False
        else:
            st = self.lm.next(seq.ctx, seq.temperature, seq.rng, batch)
            word, logprob, top, eos = st.word, st.logprob, st.top, st.eos
        seq.ctx = advance(seq.ctx, word)
        seq.out.append(word)
        self.counters.generation_tokens += 1
        if seq.first_token is None:
            seq.first_token = now
            self.counters.prompt_tokens += len(seq.prompt_tokens)  # as vLLM: once, cached tokens included
        reason = None
        if eos and not seq.ignore_eos and len(seq.out) > 1:
            reason = "stop"
        elif len(seq.out) >= seq.max_tokens:
            reason = "length"
        if reason:
            self._finish(seq, reason, now)
        return Emitted(seq, word, logprob, top, reason)

    def _finish(self, seq: Seq, reason: str, now: float) -> None:
        seq.finish_reason, seq.finished = reason, now
        if seq in self.running:
            self.running.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []

    def stop_early(self, seq: Seq, now: float) -> None:
        """The front end ended ``seq`` (a stop string matched)."""
        if seq.finished is None:
            self._finish(seq, "stop", now)


def simulate(
    sched: Scheduler, arrivals: Callable[[float, list[Seq]], list[Seq]], until: float, max_steps: int = 2_000_000
) -> float:
    """Run ``sched`` on a virtual clock until ``until`` (simulated seconds); returns the end time.

    ``arrivals(now, finished_this_step)`` returns the sequences that arrive at
    ``now`` (a closed-loop client returns a new request per finished one).
    """
    now = 0.0
    for s in arrivals(now, []):
        sched.add(s)
    idle = True  # the first step after an idle engine starts t_pickup late (the front end's hand-over)
    for _ in range(max_steps):
        if now >= until:
            break
        if idle and sched.has_work():
            now += sched.profile.t_pickup
            idle = False
        load = sched.step(now)
        if not load.new:
            nxt = arrivals(now, [])
            if not nxt:
                break
            for s in nxt:
                sched.add(s)
            continue
        now += sched.duration(load)
        done = [e.seq for e in sched.finish_step(now) if e.finish_reason]
        idle = not sched.has_work()
        for s in arrivals(now, done):
            s.arrival = now
            sched.add(s)
    return now
