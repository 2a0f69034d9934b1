"""The ``clusterctl bench`` workflow: a :class:`Workload` (the prompts of every level), run level by
level against one endpoint (:func:`run_levels`) or the same prompts against two (:func:`compare_runs`),
each level's report judged for trust (docs/bench.md).

Reports are the feature's dicts (``bench.stats.aggregate`` + the server's timings + ``trust``);
progress of a level's requests goes to the ``progress`` callback the caller gives (a context
manager per level yielding ``on_result``); problems are :class:`~clusterctl.errors.ClusterctlError`.
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Optional

from clusterctl.bench import dataset as ds
from clusterctl.bench import runner, server_metrics, tokens, trust
from clusterctl.bench.compare import compare
from clusterctl.bench.loadgen import RunResult
from clusterctl.bench.plot import bench_svg
from clusterctl.bench.stats import Slo, aggregate
from clusterctl.bench.target import resolve
from clusterctl.config import UserConfig
from clusterctl.deploy.placement.deployed import with_replicas
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.files import write_atomic
from clusterctl.inventory.model import Inventory
from clusterctl.vllmclient import Endpoint, RequestResult

#: One level's prompts, per-prompt output lengths and their sizes (mean words, mean tokens).
Prompts = tuple[list[str], list[Optional[int]], dict[str, Any]]
#: ``progress(label, total)``: a context manager around one level's run yielding ``on_result(r)``.
Progress = Callable[[str, Optional[int]], ContextManager[Callable[[RequestResult], None]]]


def endpoint(target: str, load_inventory: Callable[[], Inventory], load_config: Callable[[], UserConfig]) -> Endpoint:
    """The endpoint of ``target``: a URL (its API key from the environment), or an inventory instance,
    template replicas too where placement recorded them (``http://ADDRESS:PORT`` of its first host,
    its API key); ``load_inventory`` and then ``load_config`` (the state the inventory is read as
    deployed in) are called only for an instance name.  Raises ``ClusterctlError`` on a bad URL, an
    unknown instance or an unreadable secret (``bench.target.resolve``)."""
    return resolve(target, lambda: with_replicas(load_inventory(), cfg=load_config()))


@contextlib.contextmanager
def no_progress(label: str, total: Optional[int]) -> Iterator[Callable[[RequestResult], None]]:
    yield lambda r: None


@dataclass(frozen=True)
class LevelOptions:
    """How each level runs: the served ``model`` (None: the server's), seconds a request may
    stall, Poisson ``request_rate`` (None: all at once), goodput ``slo``, ``server_timings``
    (None: when /metrics answers; True: required; False: not read)."""

    model: Optional[str] = None
    timeout: float = 120.0
    request_rate: Optional[float] = None
    slo: Optional[Slo] = None
    server_timings: Optional[bool] = None


def finite(x: Any) -> Any:
    """``x`` with every NaN or infinite float as None, so the JSON is strict (no NaN/Infinity)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def _scrape(ep: Endpoint, timeout: float) -> dict[str, float] | None:
    try:
        return server_metrics.scrape(ep, min(timeout, 10.0))
    except ClusterctlError:
        return None


class Workload:
    """The prompts of every level: the dataset's (cut or repeated to ``requests``) or synthetic ones of
    ``input_len`` tokens (words without a tokenizer)."""

    def __init__(
        self,
        dataset: Optional[Path],
        requests: Optional[int],
        input_len: int,
        output_len: int,
        seed: int,
        duration: Optional[float],
        progress: Progress = no_progress,
    ) -> None:
        self.input_len, self.output_len, self.seed, self.duration = input_len, output_len, seed, duration
        self.progress = progress
        self.rng = random.Random(seed)
        self.data: Optional[ds.Dataset] = None
        self.tok: Optional[tokens.Tokenizer] = None
        self.warnings: list[str] = []
        if dataset is not None:
            self.data = ds.load(dataset)
        self.requests = requests or (len(self.data.prompts) if self.data else 32)

    def tokenizer(self, ep: Endpoint, model: Optional[str], path: Optional[Path], off: bool, timeout: float) -> None:
        """Pick the token counter: ``path``, else the endpoint's /tokenize, else none (words, with a warning)."""
        if off:
            self.warnings.append("--no-tokenizer: prompts are counted in words, not tokens")
            return
        self.tok = tokens.local(path) if path is not None else tokens.endpoint(ep, model, min(timeout, 10.0))
        if self.tok is None:
            self.warnings.append(
                f"{ep.url}/tokenize does not answer and no --tokenizer was given: prompts are "
                f"{self.input_len} words, not tokens (a real BPE vocabulary often makes 1.5-2 "
                "tokens of a word); the server's own count is in total_input_tokens"
            )

    def describe(self) -> dict[str, Any]:
        unit = "tokens" if self.tok is not None else "words"
        return {
            "input_len": None if self.data else self.input_len,
            "input_len_unit": None if self.data else unit,
            "tokenizer": None if self.tok is None else self.tok.source,
            "warnings": self.warnings,
        }

    def prompts(self) -> Prompts:
        """This level's prompts, per-prompt output lengths (a new synthetic draw per level) and their lengths:
        mean words and mean tokens by the tokenizer (None without one)."""
        if self.data is None:
            built = [tokens.build(self.input_len, self.rng, self.tok) for _ in range(self.requests)]
            ps = [b.text for b in built]
            counts = [b.tokens for b in built if b.tokens is not None]
            lens: list[Optional[int]] = [None] * self.requests
        else:
            n = len(self.data.prompts)
            idx = [i % n for i in range(self.requests)] if self.duration is None else list(range(n))
            ps, lens = [self.data.prompts[i] for i in idx], [self.data.output_lens[i] for i in idx]
            counts = [self.tok.count(p) for p in ps] if self.tok is not None else []
        words = sum(len(p.split()) for p in ps) / max(1, len(ps))
        size = {
            "prompt_words_mean": round(words, 1),
            "prompt_tokens_mean": round(sum(counts) / len(counts), 1) if counts else None,
        }
        return ps, lens, size

    def run(self, ep: Endpoint, level: int, opts: LevelOptions, prompts: Optional[Prompts] = None) -> RunResult:
        ps, lens, _ = prompts or self.prompts()
        with self.progress(f"{ep.url} concurrency {level}", None if self.duration else len(ps)) as on_result:
            return runner.run(
                ep,
                ps,
                level,
                self.output_len,
                output_lens=lens,
                model=opts.model,
                timeout=opts.timeout,
                request_rate=opts.request_rate,
                seed=self.seed,
                duration=self.duration,
                on_result=on_result,
            )

    def level(self, ep: Endpoint, level: int, opts: LevelOptions, prompts: Optional[Prompts] = None) -> dict[str, Any]:
        """One level's report: the run, the server's timings around it (unless turned off) and its trust."""
        prompts = prompts or self.prompts()
        before = _scrape(ep, opts.timeout) if opts.server_timings is not False else None
        if opts.server_timings and before is None:
            raise ClusterctlError(f"--server-timings: {ep.url}/metrics does not answer")
        run = self.run(ep, level, opts, prompts)
        rep = aggregate(run.results, run.duration, level, opts.slo)
        rep.update(prompts[2])
        rep["generator_cpu_percent"] = 100 * run.cpu_s / max(run.duration, 1e-9)
        ttft = tpot = None
        if before is not None:
            after = _scrape(ep, opts.timeout)
            if after is not None:
                ttft = server_metrics.histogram_mean(before, after, "vllm:time_to_first_token_seconds")
                tpot = server_metrics.histogram_mean(before, after, "vllm:request_time_per_output_token_seconds")
        rep["server_ttft_mean_ms"] = None if ttft is None else 1000 * ttft
        rep["server_tpot_mean_ms"] = None if tpot is None else 1000 * tpot
        judged = trust.judge(run, rep, ttft, tpot)
        rep["ttft_error_ms"] = judged.get("ttft_error_ms")
        rep["trust"] = judged
        return rep


def run_levels(work: Workload, ep: Endpoint, levels: list[int], opts: LevelOptions) -> list[dict[str, Any]]:
    """Every level against ``ep``, one report each."""
    return [work.level(ep, level, opts) for level in levels]


def exit_code(reports: list[dict[str, Any]]) -> ExitCode:
    """2 when every request failed, 3 when a level cannot be trusted, 1 when some failed, else 0."""
    failed = sum(r["failed"] for r in reports)
    if failed and not sum(r["completed"] for r in reports):
        return ExitCode.CRIT
    if trust.untrusted(reports):
        return ExitCode.UNKNOWN
    return ExitCode.WARN if failed else ExitCode.OK


@dataclass(frozen=True)
class Compared:
    """Both sides' reports (``reports["a"]``, ``["b"]``), the comparison ``rows`` (``regression``
    None on a level either side cannot trust), the untrusted levels and failed requests."""

    reports: dict[str, list[dict[str, Any]]]
    rows: list[dict[str, Any]]
    bad_levels: set[int]
    failed: int

    @property
    def code(self) -> ExitCode:
        """2 failed requests, 3 untrusted numbers (nothing judged), 1 a regression, else 0."""
        if self.failed:
            return ExitCode.CRIT
        if self.bad_levels:
            return ExitCode.UNKNOWN
        return ExitCode.WARN if any(r["regression"] for r in self.rows) else ExitCode.OK


def compare_runs(
    work: Workload, ep: Endpoint, ep_b: Endpoint, levels: list[int], opts: LevelOptions, tolerance: float
) -> Compared:
    """Same prompts, levels and pacing against both endpoints, A then B per level."""
    reports: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for level in levels:
        prompts = work.prompts()
        for side, target in (("a", ep), ("b", ep_b)):
            reports[side].append(work.level(target, level, opts, prompts))
    rows = compare(reports["a"], reports["b"], tolerance)
    bad_levels = {r["concurrency"] for reps in reports.values() for r in reps if not r["trust"]["trusted"]}
    for r in rows:
        if r["concurrency"] in bad_levels:
            r["regression"] = None  # not judged on untrusted numbers
    failed = sum(r["failed"] for side in reports.values() for r in side)
    return Compared(reports, rows, bad_levels, failed)


def write_plot(path: Path, runs: dict[str, list[dict[str, Any]]]) -> None:
    """The SVG of TTFT and throughput against concurrency, written whole at ``path``."""
    try:
        write_atomic(path, bench_svg(runs))
    except OSError as e:
        raise ClusterctlError(f"--plot {path}: cannot write: {e.strerror or e}") from e
