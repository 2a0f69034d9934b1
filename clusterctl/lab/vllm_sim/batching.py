"""The step engine: one thread runs :class:`scheduler.Scheduler` steps and waits out their time.

Implements :class:`engine.Engine` for the HTTP server.  A step's duration
comes from the latency profile (simulated seconds at 1x); the engine thread
*waits* ``duration * time_scale`` on a condition (no CPU is burnt), so
several simulators share a small machine without slowing each other.  The
engine keeps a simulated clock: it advances by step durations while busy
(so the simulator's own CPU time never shows in the figures) and, when a
request arrives at an idle engine, catches up with wall clock / scale.  Request metrics
(TTFT, ITL, e2e, queue/prefill/decode times, tokens, preemptions, prefix
cache) are observed on that clock, so they read as at 1x whatever the scale.

Faults (:class:`faults.Faults`) act on the loop: ``hang`` and ``tp_rank_lost``
stop steps from completing while /health stays 200, until
``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` (300 s, scaled) expires and the engine
dies; ``slowdown`` multiplies step times; ``leak`` copies another session's
prompt words into new requests; ``dead`` is the engine death.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Iterator

from .engine import EngineDead, EngineStats, GenRequest, TokenEvent, token_id
from .faults import Faults
from .metrics import Metrics
from .scheduler import Emitted, Scheduler, Seq

EXECUTE_TIMEOUT_S = 300.0
#: A step that starts within this many wall seconds of the previous one's end continues its timeline.
CATCH_UP_S = 0.05
#: The longest an idle engine's first step waits (wall seconds) for requests the HTTP front end accepted
#: during the pickup but is still parsing and tokenizing.
FRONTEND_WAIT_S = 0.5


class StepEngine:
    """Continuous batching behind the :class:`engine.Engine` interface."""

    records_metrics = True  # the server leaves request metrics to the engine

    def __init__(
        self,
        sched: Scheduler,
        *,
        vocab: int,
        scale: float,
        metrics: Metrics | None = None,
        faults: Faults | None = None,
        execute_timeout_s: float = EXECUTE_TIMEOUT_S,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.sched = sched
        self.vocab = vocab
        self.scale = scale
        self.metrics = metrics
        self.faults = faults or Faults()
        self.execute_timeout_s = execute_timeout_s
        self.on_error = on_error or (lambda _msg: None)
        self._cv = threading.Condition()
        self._queues: dict[int, deque[Emitted | None]] = {}
        self._next_id = 0
        self._sim = 0.0
        self._wall0 = time.monotonic()
        #: Requests the front end has accepted but not queued yet: handler thread -> wall time accepted.
        self._arriving: dict[int, float] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="EngineCore", daemon=True)
        self._thread.start()

    # ---- Engine interface
    @property
    def dead(self) -> bool:
        return self.faults.dead

    @dead.setter
    def dead(self, value: bool) -> None:
        with self._cv:
            self.faults.dead = value
            self._cv.notify_all()

    def is_dead(self) -> bool:
        return self.faults.dead

    def stats(self) -> EngineStats:
        with self._cv:
            return EngineStats(len(self.sched.running), len(self.sched.waiting), self.sched.kv_usage)

    def now(self) -> float:
        """The simulated clock (seconds at 1x)."""
        with self._cv:
            return self._sync()

    def arrive(self) -> None:
        """The HTTP front end accepted a generation request in this thread (before parsing and tokenizing
        it): an idle engine's first step waits for it as for the rest of a burst (the pickup)."""
        with self._cv:
            self._arriving[threading.get_ident()] = time.monotonic()

    def arrived(self) -> None:
        """This thread's request is queued, or was refused: nothing to wait for."""
        with self._cv:
            if self._arriving.pop(threading.get_ident(), None) is not None:
                self._cv.notify_all()

    def generate(self, req: GenRequest) -> Iterator[TokenEvent]:
        """Queue ``req`` and yield its tokens as steps produce them; ``EngineDead`` if the engine dies."""
        if self.faults.dead:
            self.arrived()
            raise EngineDead()
        with self._cv:
            self._arriving.pop(threading.get_ident(), None)
            self._next_id += 1
            seq = Seq(
                rid=self._next_id,
                prompt=req.prompt,
                prompt_tokens=list(req.prompt_tokens),
                max_tokens=max(1, req.max_tokens),
                temperature=req.temperature,
                seed=req.seed,
                ignore_eos=req.ignore_eos,
                remote_kv=req.remote_kv,
                arrival=(self._sim if self.sched.has_work() else self._sync()) - req.kv_wait_s,
                session=req.session or f"req-{self._next_id}",
            )
            q: deque[Emitted | None] = deque()
            self._queues[seq.rid] = q
            self.sched.add(seq)
            self._cv.notify_all()
        text = ""
        finished = False
        try:
            while True:
                with self._cv:
                    while not q and not self.faults.dead:
                        self._cv.wait(1.0)
                    if not q:
                        raise EngineDead()
                    em = q.popleft()
                if em is None:
                    raise EngineDead()
                text += em.word
                top = em.top[: req.logprobs] if req.logprobs else []
                if req.logprobs is not None and all(w != em.word for w, _lp in top):
                    top = [(em.word, em.logprob), *top]  # vLLM: the sampled token plus the top-N
                ev = TokenEvent(em.word, token_id(em.word, self.vocab), em.logprob, top, finish_reason=em.finish_reason)
                hit = next((s for s in req.stop if s and s in text), None)
                if hit is not None:
                    cut = text.index(hit)
                    ev.text = em.word[: max(0, len(em.word) - (len(text) - cut))]
                    ev.finish_reason, ev.stop_reason = "stop", hit
                    with self._cv:
                        self.sched.stop_early(seq, self._sim)
                finished = ev.finish_reason is not None
                yield ev
                if finished:
                    return
        finally:
            with self._cv:
                self._queues.pop(seq.rid, None)
                if not finished:
                    self.sched.abort(seq)
                self._observe(seq, "stop" if finished and seq.finish_reason is None else (seq.finish_reason or "abort"))

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(5)

    # ---- the loop
    def _sync(self) -> float:
        """Idle time passes at wall speed / scale (nothing when the scale is 0)."""
        if self.scale > 0:
            self._sim = max(self._sim, (time.monotonic() - self._wall0) / self.scale)
        return self._sim

    def _wait(self, seconds: float) -> None:
        """Wait ``seconds`` of wall time (woken early only by close())."""
        end = time.monotonic() + seconds
        while not self._stop:
            left = end - time.monotonic()
            if left <= 0:
                return
            self._cv.wait(left)

    def _loop(self) -> None:
        deadline = 0.0  # wall time the previous step ended on the timeline
        idle = True
        with self._cv:
            while not self._stop:
                if self.faults.dead:
                    self._fail_all()
                    self._cv.wait(0.5)
                    continue
                if self.faults.stalled():
                    self._hang()
                    continue
                if not self.sched.has_work():
                    idle = True
                    deadline = 0.0  # the next step starts a new timeline (never one that ended before the idle)
                    self._cv.wait(0.5)
                    continue
                pickup = self.sched.profile.t_pickup * self.scale
                if idle and pickup > 0:
                    # The front end hands the first request over; a burst arriving meanwhile shares the step.
                    # So do requests it accepted by then but is still parsing: at 1x on a busy machine the
                    # simulator's own Python front end must not split a burst the real engine batches.
                    self._wait(pickup)
                    until = time.monotonic()
                    give_up = until + FRONTEND_WAIT_S
                    while (
                        not self._stop
                        and any(t <= until for t in self._arriving.values())
                        and time.monotonic() < give_up
                    ):
                        self._cv.wait(give_up - time.monotonic())
                    self._sync()
                idle = False
                self.sched.leak = self.faults.leak
                load = self.sched.step(self._sim)
                if not load.new:
                    self._cv.wait(0.05)
                    continue
                dur = self.sched.duration(load) * self.faults.slowdown
                if self.scale > 0:
                    # Steps end on a timeline: the CPU time spent between steps (planning, handing
                    # out tokens) is taken out of the next wait instead of added to it.
                    now = time.monotonic()
                    start = deadline if now - deadline < CATCH_UP_S else now
                    deadline = start + dur * self.scale
                    self._wait(deadline - now)
                if self.faults.stalled():  # hung inside this step: its tokens never come
                    self._hang()
                    continue
                self._sim += dur
                self._emit(self.sched.finish_step(self._sim), load.tokens)

    def _hang(self) -> None:
        """Steps stop; after the execute timeout the engine dies (a stuck collective)."""
        start = time.monotonic()
        limit = self.execute_timeout_s * self.scale
        while not self._stop and self.faults.stalled() and not self.faults.dead:
            left = start + limit - time.monotonic()
            if left <= 0:
                self.on_error("RPC call to execute_model timed out.")
                self.faults.dead = True
                self._fail_all()
                return
            self._cv.wait(min(left, 0.5))

    def _fail_all(self) -> None:
        for q in self._queues.values():
            q.append(None)
        self._cv.notify_all()

    def _emit(self, emitted: list[Emitted], tokens: int) -> None:
        m = self.metrics
        if m is not None:
            m.observe("vllm:iteration_tokens_total", tokens)
            c = self.sched.counters
            for name, attr in (
                ("prefix_cache_queries", "prefix_queries"),
                ("prefix_cache_hits", "prefix_hits"),
                ("num_preemptions", "preemptions"),
                ("prompt_tokens", "prompt_tokens"),
                ("generation_tokens", "generation_tokens"),
            ):
                value = float(getattr(c, attr))
                m.counters["vllm:" + name] = value
                if "prefix" in name:
                    m.counters["vllm:gpu_" + name] = value
        for em in emitted:
            q = self._queues.get(em.seq.rid)
            if q is not None:
                q.append(em)
            if m is not None and len(em.seq.out) > 1:
                gap = self._sim - (em.seq.last_token or self._sim)
                m.observe("vllm:inter_token_latency_seconds", gap)
                m.observe("vllm:time_per_output_token_seconds", gap)
            em.seq.last_token = self._sim
        self._cv.notify_all()

    def _observe(self, seq: Seq, reason: str) -> None:
        m = self.metrics
        if m is None:
            return
        end = seq.finished if seq.finished is not None else self._sim
        first = seq.first_token
        sched = seq.first_scheduled if seq.first_scheduled is not None else end
        m.finished(reason)
        if first is not None:
            m.observe("vllm:time_to_first_token_seconds", first - seq.arrival)
        n = len(seq.out)
        m.observe("vllm:request_prompt_tokens", len(seq.prompt_tokens))
        m.observe("vllm:request_generation_tokens", n)
        m.observe("vllm:request_params_n", 1)
        m.observe("vllm:request_params_max_tokens", seq.max_tokens)
        m.observe("vllm:request_max_num_generation_tokens", seq.max_tokens)
        m.observe("vllm:e2e_request_latency_seconds", end - seq.arrival)
        m.observe("vllm:request_queue_time_seconds", sched - seq.arrival)
        m.observe("vllm:request_inference_time_seconds", end - sched)
        m.observe("vllm:request_prefill_time_seconds", (first if first is not None else end) - sched)
        m.observe("vllm:request_decode_time_seconds", end - (first if first is not None else end))
        m.observe("vllm:request_num_preemptions", seq.preemptions)
        if n > 1 and first is not None:
            m.observe("vllm:request_time_per_output_token_seconds", (end - first) / (n - 1))
