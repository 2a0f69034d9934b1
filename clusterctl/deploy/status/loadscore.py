"""The load score of a vLLM instance: one number in [0, 1], lower is freer.

The field report's dispatch signal (``../shared/requirements.md``): KV-cache
usage and queued requests weighted high, generation throughput over the last
10 s medium, health decisive.  ``clusterctl status`` shows it and the gateway
weights least-connections upstreams with it.  The formula::

    score = 1.0                                   when the instance is not healthy
                                                  or no metric could be read
    score = 0.4 * kv + 0.4 * queue + 0.2 * busy   otherwise, where

    kv    = vllm:kv_cache_usage_perc                         (0..1, as vLLM reports it)
    queue = min(1, vllm:num_requests_waiting / queue_cap)    queue_cap = the instance's
            --max-num-seqs when known, else 128 (llm-d's load-aware threshold):
            a queue as long as a whole batch of seats is a full queue
    busy  = min(1, tokens_per_s / capacity_tokens_per_s)     generation tokens per second
            over the window (``vllm:generation_tokens_total`` difference / seconds)
            relative to the instance's capacity: its highest observed rate (kept by
            ``clusterctl.deploy.status.peaks``) or a configured figure

A term whose input is unknown (no second sample, no capacity yet) adds 0;
:func:`components` says which terms were known.  Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Weights of the three terms (sum 1): KV and queue high, throughput medium.
W_KV = 0.4
W_QUEUE = 0.4
W_BUSY = 0.2
#: Waiting requests that count as a full queue when --max-num-seqs is unknown.
DEFAULT_QUEUE_CAP = 128
#: The score of an instance that must not receive traffic.
DO_NOT_SEND = 1.0


@dataclass(frozen=True)
class InstanceLoad:
    """What the score is computed from, for one instance at one time.

    ``kv_usage``: 0..1.  ``running``/``waiting``: request counts.
    ``tokens_per_s``: generation tokens per second over the scrape window
    (``None`` with a single sample).  ``queue_cap``: the instance's
    ``--max-num-seqs`` if known.  ``capacity_tokens_per_s``: its peak or
    configured generation rate (``None``: unknown).
    """

    healthy: bool
    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    tokens_per_s: float | None = None
    queue_cap: int | None = None
    capacity_tokens_per_s: float | None = None


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


def components(sample: InstanceLoad) -> dict[str, float | None]:
    """The three terms in [0, 1] before weighting (``None``: input unknown)."""
    cap = sample.queue_cap if sample.queue_cap and sample.queue_cap > 0 else DEFAULT_QUEUE_CAP
    busy: float | None = None
    if sample.tokens_per_s is not None and sample.capacity_tokens_per_s:
        busy = _clamp(sample.tokens_per_s / sample.capacity_tokens_per_s)
    return {
        "kv": None if sample.kv_usage is None else _clamp(sample.kv_usage),
        "queue": None if sample.waiting is None else _clamp(sample.waiting / cap),
        "busy": busy,
    }


def load_score(sample: InstanceLoad) -> float:
    """The load score in [0, 1] (module docstring): 1.0 = do not send."""
    if not sample.healthy or (sample.kv_usage is None and sample.waiting is None):
        return DO_NOT_SEND
    c = components(sample)
    score = W_KV * (c["kv"] or 0.0) + W_QUEUE * (c["queue"] or 0.0) + W_BUSY * (c["busy"] or 0.0)
    return round(_clamp(score), 4)
