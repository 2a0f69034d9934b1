"""Record baselines, check against them and calibrate the noise floor, over HTTP.

Prompts are sent ``parallel`` at a time (each a separate greedy request); an
unreachable endpoint raises :class:`~clusterctl.drift.client.EndpointError`.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from clusterctl.drift import compare
from clusterctl.drift.client import (
    EndpointError,
    Output,
    complete,
    environment,
    too_long,
)
from clusterctl.drift.prompts import Prompt
from clusterctl.drift.store import Baseline
from clusterctl.vllmclient import Endpoint, stream_completion, synthetic_prompt


def outputs(
    ep: Endpoint,
    prompts: Sequence[Prompt],
    k: int,
    seed: int,
    parallel: int = 4,
    timeout: float = 60.0,
    token_ids: bool = True,
    skipped: dict[str, str] | None = None,
) -> dict[str, Output]:
    """Each prompt's greedy output, ``parallel`` at a time; ``timeout`` (s) bounds each request.
    With ``skipped`` (a dict to fill), a prompt the endpoint refuses as longer than its context
    (HTTP 400) is left out and the endpoint's reason recorded there; else that raises."""

    def one(p: Prompt) -> Output | str:
        try:
            return complete(ep, p.prompt, max_tokens=p.max_tokens, k=k, seed=seed, timeout=timeout, token_ids=token_ids)
        except EndpointError as e:
            if skipped is None or not too_long(e):
                raise
            return e.detail

    with ThreadPoolExecutor(max(1, parallel)) as pool:
        got = list(pool.map(one, prompts))
    out: dict[str, Output] = {}
    for p, o in zip(prompts, got):
        if isinstance(o, Output):
            out[p.id] = o
        elif skipped is not None:
            skipped[p.id] = o
    return out


def record(
    ep: Endpoint,
    name: str,
    prompts: Sequence[Prompt],
    *,
    k: int = 8,
    seed: int = 0,
    extra_env: dict[str, Any] | None = None,
    timeout: float = 60.0,
) -> Baseline:
    """A baseline of ``prompts`` from ``ep``; ``extra_env`` (quantization, GPU, TP...) is kept as metadata.

    Prompts the endpoint cannot fit in its context (``max_model_len`` from ``/v1/models``) are
    skipped, each with the endpoint's reason in ``Baseline.skipped``, rather than aborting the run;
    when none fits, it raises."""
    env = {**environment(ep, min(timeout, 10.0)), **(extra_env or {})}
    skipped: dict[str, str] = {}
    outs = outputs(ep, prompts, k, seed, timeout=timeout, skipped=skipped)
    if prompts and not outs:
        raise EndpointError(
            f"{ep.url}: no prompt fits the endpoint's context (max_model_len "
            f"{env.get('max_model_len')}): {next(iter(skipped.values()), '')}"
        )
    return Baseline(name, env, k, seed, {p.id: p.prompt for p in prompts if p.id in outs}, outs, skipped=skipped)


def check(ep: Endpoint, base: Baseline, timeout: float = 60.0) -> list[compare.PromptDiff]:
    """Send the baseline's prompts again (same k, seed, lengths; token ids when the baseline has them) and
    diff each against the recorded output; ``timeout`` (s) bounds each request."""
    prompts = [Prompt(i, base.prompts[i], max(1, len(o.tokens))) for i, o in base.outputs.items()]
    by_id = any(o.by_id for o in base.outputs.values())
    now = outputs(ep, prompts, base.k, base.seed, timeout=timeout, token_ids=by_id)
    try:
        return [compare.diff(p.id, base.outputs[p.id], now[p.id]) for p in prompts]
    except ValueError as e:
        raise EndpointError(
            f"{ep.url}: cannot compare with baseline {base.name!r} ({e}); the baseline has "
            "token ids and the server did not return them (return_tokens_as_token_ids)"
            if by_id
            else f"{ep.url}: cannot compare with baseline {base.name!r} ({e})"
        ) from None


class Background:
    """Other traffic while measuring: ``streams`` threads sending random streamed prompts until stopped."""

    def __init__(self, ep: Endpoint, streams: int, seed: int = 7, timeout: float = 30.0):
        self.ep, self.streams, self._stop, self.timeout = ep, streams, threading.Event(), timeout
        self._rng = random.Random(seed)
        self._threads: list[threading.Thread] = []
        self.sent = 0

    def _loop(self, salt: int) -> None:
        rng = random.Random(salt)
        while not self._stop.is_set():
            stream_completion(
                self.ep,
                {
                    "prompt": synthetic_prompt(rng.randint(8, 64), rng),
                    "max_tokens": 16,
                    "temperature": 0,
                    "ignore_eos": True,
                },
                timeout=self.timeout,
            )
            self.sent += 1

    def __enter__(self) -> "Background":
        for i in range(self.streams):
            t = threading.Thread(target=self._loop, args=(self._rng.randrange(1 << 30),), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)


def calibrate(
    ep: Endpoint,
    prompts: Sequence[Prompt],
    *,
    runs: int = 3,
    k: int = 8,
    seed: int = 0,
    background: int = 4,
    progress: Callable[[int, dict[str, float]], None] | None = None,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """The noise floor: a reference pass alone, then ``runs`` passes under ``background`` streams of other
    traffic, each compared with the reference.  Returns the worst of each metric and every run's summary;
    ``timeout`` (s) bounds each request."""
    ref = outputs(ep, prompts, k, seed, parallel=1, timeout=timeout)
    summaries = []
    with Background(ep, background, timeout=min(timeout, 30.0)):
        for i in range(runs):
            now = outputs(ep, prompts, k, seed, timeout=timeout)
            s = compare.summarize([compare.diff(p.id, ref[p.id], now[p.id]) for p in prompts])
            summaries.append(s)
            if progress:
                progress(i, s)
    floor = {
        "exact_match": min(s["exact_match"] for s in summaries),
        "vllm_rule_pass": min(s["vllm_rule_pass"] for s in summaries),
        "agreement": min(s["agreement"] for s in summaries),
        "mean_kl": max(s["mean_kl"] for s in summaries),
    }
    return {
        "env": environment(ep, min(timeout, 10.0)),
        "runs": summaries,
        "floor": floor,
        "background_streams": background,
        "prompts": len(prompts),
    }
