"""``clusterctl bench TARGET``: streaming load test with vLLM's latency definitions (docs/bench.md)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Optional

import typer

from clusterctl.cli._common import InventoryOpt, JsonOpt, console, err_console, fail, print_json
from clusterctl.cli._target import TargetArg, endpoint
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

HELP = """Load-test an OpenAI-compatible endpoint with streaming /v1/completions.

TARGET is a URL or an inventory instance (its host address and port, and the
API key its VLLM_API_KEY secret names, else $CLUSTERCTL_API_KEY).

For each concurrency level, REQUESTS synthetic prompts of INPUT_LEN tokens,
counted by the model's tokenizer (--tokenizer PATH, else the endpoint's
/tokenize; words, with a warning, when neither is there), or the prompts of
--dataset FILE (JSONL {"prompt": ..., "output_len": ...}), are
sent with at most that many in flight (all at once, or as Poisson arrivals at
--request-rate per second), each asking for OUTPUT_LEN tokens (ignore_eos);
with --duration S each level runs S seconds instead, cycling the prompts.
Measured as `vllm bench serve` does: TTFT (first chunk with choices), TPOT
excluding the first token, ITL (gaps between chunks), E2E (last chunk with
choices); mean, median, p90, p99 in ms; request, output and total token
throughput; goodput under the SLOs given. --plot FILE writes an SVG of TTFT
and output throughput against concurrency.

Each level is checked for a starved generator: against the server's own
TTFT/TPOT from /metrics when it answers (--no-server-timings to skip), and
from the client alone (event-loop lag, chunks read together, generator CPU).
A flagged level is UNTRUSTED with the measured error (docs/bench.md).

With --compare URL_B the same workload runs against both endpoints, level by
level, and each metric's relative change is shown; worse than --tolerance is a
regression.

Exit status: 0 every request succeeded, 1 some failed, 2 all failed,
3 a level's numbers cannot be trusted, or usage errors. With --compare: 0 no
regression, 1 a regression, 2 failed requests, 3 untrusted or usage errors.

Examples:

  clusterctl bench http://10.77.0.11:8000 --concurrency 1,8,20 --requests 40 --input-len 512 --output-len 128

  clusterctl bench http://10.77.0.11:8000 --compare http://10.77.0.12:8000 -c 1,8 --tolerance 0.15

  clusterctl bench http://127.0.0.1:8000 --concurrency 8 --request-rate 4 --slo-ttft 500 --slo-tpot 50 --json

  clusterctl bench qwen-a -i site.yaml -c 1,8,64,256 --duration 60 --dataset chats.jsonl --plot bench.svg
"""


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"--concurrency: expected numbers separated by commas, not {text!r}")
    if not levels or min(levels) < 1:
        fail(f"--concurrency: every level must be at least 1 ({text!r})")
    return levels


def _ms(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"


def bench(
    target: str = TargetArg,
    concurrency: str = typer.Option("1,8", "--concurrency", "-c", help="Levels, comma-separated."),
    requests: Optional[int] = typer.Option(
        None, "--requests", "-n", min=1, help="Requests per level [default: 32, or the dataset's lines]."
    ),
    duration: Optional[float] = typer.Option(
        None, "--duration", min=0.001, help="Seconds per level (prompts cycled) instead of --requests."
    ),
    dataset: Optional[Path] = typer.Option(
        None, "--dataset", metavar="FILE", help='JSONL prompts: {"prompt": str, "output_len"?: int} a line.'
    ),
    input_len: int = typer.Option(256, "--input-len", min=1, help="Prompt length in tokens."),
    tokenizer: Optional[Path] = typer.Option(
        None, "--tokenizer", metavar="PATH", help="Model dir or tokenizer.json [default: the endpoint's /tokenize]."
    ),
    no_tokenizer: bool = typer.Option(False, "--no-tokenizer", help="Prompts of INPUT_LEN words, not tokens."),
    output_len: int = typer.Option(64, "--output-len", min=1, help="Tokens asked per request."),
    model: Optional[str] = typer.Option(None, "--model", help="Served model name [default: the server's]."),
    slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", min=0, help="Goodput SLO: TTFT ms."),
    slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", min=0, help="Goodput SLO: TPOT ms."),
    slo_e2e: Optional[float] = typer.Option(None, "--slo-e2e", min=0, help="Goodput SLO: E2E ms."),
    request_rate: Optional[float] = typer.Option(
        None, "--request-rate", min=0.001, help="Poisson arrivals, requests/s [default: all at once]."
    ),
    compare_url: Optional[str] = typer.Option(
        None, "--compare", metavar="TARGET_B", help="Run the same workload against TARGET_B and compare."
    ),
    tolerance: float = typer.Option(
        0.1, "--tolerance", min=0, help="With --compare: relative change counted as a regression."
    ),
    server_timings: Optional[bool] = typer.Option(
        None,
        "--server-timings/--no-server-timings",
        help="Check the client's TTFT/TPOT against the server's /metrics [default: when it answers].",
    ),
    plot: Optional[Path] = typer.Option(
        None, "--plot", metavar="FILE", help="Write an SVG of TTFT and throughput against concurrency."
    ),
    timeout: float = typer.Option(120.0, "--timeout", min=1, help="Seconds a request may stall."),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic prompts and arrivals."),
    inventory: Optional[str] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    from clusterctl.bench.stats import Slo

    ep = endpoint(target, inventory)
    if plot is not None:
        _check_writable(plot)
    if tokenizer is not None and no_tokenizer:
        fail("--tokenizer and --no-tokenizer exclude each other")
    slo = Slo(slo_ttft, slo_tpot, slo_e2e) if any(v is not None for v in (slo_ttft, slo_tpot, slo_e2e)) else None
    levels = _levels(concurrency)
    work = _Workload(dataset, requests, input_len, output_len, seed, duration, progress=not as_json)
    work.tokenizer(ep, model, tokenizer, no_tokenizer, timeout)
    if not as_json:
        for w in work.warnings:
            err_console.print(f"warning: {w}", markup=False)
    if compare_url is not None:
        _compare(
            ep,
            endpoint(compare_url, inventory),
            levels,
            work,
            model,
            timeout,
            request_rate,
            slo,
            tolerance,
            plot,
            as_json,
            server_timings,
        )
    reports = [work.level(ep, level, model, timeout, request_rate, slo, server_timings) for level in levels]
    code = _exit_code(reports)
    if plot is not None:
        _write_plot(plot, {ep.url: reports})
    if as_json:
        print_json(
            _finite(
                {
                    "url": ep.url,
                    **work.describe(),
                    "output_len": output_len,
                    "requests": None if duration else work.requests,
                    "duration_s": duration,
                    "dataset": None if dataset is None else str(dataset),
                    "request_rate": request_rate,
                    "slo_ms": None if slo is None else vars(slo),
                    "trusted": not _untrusted(reports),
                    "results": reports,
                }
            )
        )
        raise typer.Exit(code)
    _table(reports, slo is not None)
    raise typer.Exit(code)


def _finite(x: Any) -> Any:
    """``x`` with every NaN or infinite float as None, so the JSON is strict (no NaN/Infinity)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _untrusted(reports: list[dict[str, Any]]) -> list[str]:
    from clusterctl.bench.trust import untrusted

    return untrusted(reports)


class _Workload:
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
        progress: bool = True,
    ) -> None:
        self.input_len, self.output_len, self.seed, self.duration = input_len, output_len, seed, duration
        self.progress = progress
        self.rng = random.Random(seed)
        self.data: Any = None
        self.tok: Any = None
        self.warnings: list[str] = []
        if dataset is not None:
            from clusterctl.bench import dataset as ds

            try:
                self.data = ds.load(dataset)
            except ClusterctlError as e:
                fail(str(e))
        self.requests = requests or (len(self.data.prompts) if self.data else 32)

    def tokenizer(self, ep: Any, model: Optional[str], path: Optional[Path], off: bool, timeout: float) -> None:
        """Pick the token counter: ``path``, else the endpoint's /tokenize, else none (words, with a warning)."""
        from clusterctl.bench import tokens

        if off:
            self.warnings.append("--no-tokenizer: prompts are counted in words, not tokens")
            return
        try:
            self.tok = tokens.local(path) if path is not None else tokens.endpoint(ep, model, min(timeout, 10.0))
        except ClusterctlError as e:
            fail(str(e))
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

    def prompts(self) -> tuple[list[str], list[Optional[int]], dict[str, Any]]:
        """This level's prompts, per-prompt output lengths (a new synthetic draw per level) and their lengths:
        mean words and mean tokens by the tokenizer (None without one)."""
        from clusterctl.bench import tokens

        if self.data is None:
            try:
                built = [tokens.build(self.input_len, self.rng, self.tok) for _ in range(self.requests)]
            except ClusterctlError as e:
                fail(str(e))
            ps = [b.text for b in built]
            counts = [b.tokens for b in built if b.tokens is not None]
            lens: list[Optional[int]] = [None] * self.requests
        else:
            n = len(self.data.prompts)
            idx = [i % n for i in range(self.requests)] if self.duration is None else list(range(n))
            ps, lens = [self.data.prompts[i] for i in idx], [self.data.output_lens[i] for i in idx]
            try:
                counts = [self.tok.count(p) for p in ps] if self.tok is not None else []
            except ClusterctlError as e:
                fail(str(e))
        words = sum(len(p.split()) for p in ps) / max(1, len(ps))
        size = {
            "prompt_words_mean": round(words, 1),
            "prompt_tokens_mean": round(sum(counts) / len(counts), 1) if counts else None,
        }
        return ps, lens, size

    def run(
        self,
        ep: Any,
        level: int,
        model: Optional[str],
        timeout: float,
        rate: Optional[float],
        prompts: Optional[tuple[list[str], list[Optional[int]], dict[str, Any]]] = None,
    ) -> Any:
        from clusterctl.bench import runner

        ps, lens, _ = prompts or self.prompts()
        with _Progress(f"{ep.url} concurrency {level}", None if self.duration else len(ps), self.progress) as on_result:
            try:
                return runner.run(
                    ep,
                    ps,
                    level,
                    self.output_len,
                    output_lens=lens,
                    model=model,
                    timeout=timeout,
                    request_rate=rate,
                    seed=self.seed,
                    duration=self.duration,
                    on_result=on_result,
                )
            except ClusterctlError as e:
                fail(str(e))

    def level(
        self,
        ep: Any,
        level: int,
        model: Optional[str],
        timeout: float,
        rate: Optional[float],
        slo: Any,
        server_timings: Optional[bool],
        prompts: Optional[tuple[list[str], list[Optional[int]], dict[str, Any]]] = None,
    ) -> dict[str, Any]:
        """One level's report: the run, the server's timings around it (unless turned off) and its trust."""
        from clusterctl.bench import server_metrics, trust
        from clusterctl.bench.stats import aggregate

        prompts = prompts or self.prompts()
        before = _scrape(server_metrics, ep, timeout) if server_timings is not False else None
        if server_timings and before is None:
            fail(f"--server-timings: {ep.url}/metrics does not answer")
        run = self.run(ep, level, model, timeout, rate, prompts)
        rep = aggregate(run.results, run.duration, level, slo)
        rep.update(prompts[2])
        rep["generator_cpu_percent"] = 100 * run.cpu_s / max(run.duration, 1e-9)
        ttft = tpot = None
        if before is not None:
            after = _scrape(server_metrics, ep, timeout)
            if after is not None:
                ttft = server_metrics.histogram_mean(before, after, "vllm:time_to_first_token_seconds")
                tpot = server_metrics.histogram_mean(before, after, "vllm:request_time_per_output_token_seconds")
        rep["server_ttft_mean_ms"] = None if ttft is None else 1000 * ttft
        rep["server_tpot_mean_ms"] = None if tpot is None else 1000 * tpot
        judged = trust.judge(run, rep, ttft, tpot)
        rep["ttft_error_ms"] = judged.get("ttft_error_ms")
        rep["trust"] = judged
        return rep


class _Progress:
    """Finished requests of one level on stderr: a transient bar on a terminal, else one line at the end;
    nothing when not ``enabled`` (--json)."""

    def __init__(self, label: str, total: Optional[int], enabled: bool) -> None:
        self.label, self.total, self.done, self.failed, self.enabled = label, total, 0, 0, enabled
        self.bar: Any = None
        if enabled and err_console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn(label),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err_console,
                transient=True,
            )
            self.task = self.bar.add_task(label, total=total)

    def __enter__(self) -> Any:
        if self.bar is not None:
            self.bar.start()
        return self.update

    def update(self, r: Any) -> None:
        self.done += 1
        self.failed += 0 if r.ok else 1
        if self.bar is not None:
            self.bar.advance(self.task)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
        elif self.enabled:
            err_console.print(f"{self.label}: {self.done} requests, {self.failed} failed", markup=False)


def _check_writable(path: Path) -> None:
    """Fail before the run, not after it, when --plot cannot be written."""
    import os

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"--plot {path}: cannot create its directory: {e.strerror or e}")
    if path.is_dir() or not os.access(path.parent, os.W_OK):
        fail(f"--plot {path}: not a writable file path")


def _write_plot(path: Path, runs: dict[str, list[dict[str, Any]]]) -> None:
    from clusterctl.bench.plot import bench_svg
    from clusterctl.files import write_atomic

    try:
        write_atomic(path, bench_svg(runs))
    except OSError as e:
        fail(f"--plot {path}: cannot write: {e.strerror or e}")


def _compare(
    ep: Any,
    ep_b: Any,
    levels: list[int],
    work: _Workload,
    model: Optional[str],
    timeout: float,
    request_rate: Optional[float],
    slo: Any,
    tolerance: float,
    plot: Optional[Path],
    as_json: bool,
    server_timings: Optional[bool],
) -> None:
    """Same prompts, levels and pacing against both endpoints, A then B per level; exits 1 on a regression,
    3 (and judges nothing) when a level of either side cannot be trusted."""
    from clusterctl.bench.compare import compare

    reports: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for level in levels:
        prompts = work.prompts()
        for side, target in (("a", ep), ("b", ep_b)):
            reports[side].append(work.level(target, level, model, timeout, request_rate, slo, server_timings, prompts))
    rows = compare(reports["a"], reports["b"], tolerance)
    untrusted = {side: _untrusted(reps) for side, reps in reports.items()}
    bad_levels = {r["concurrency"] for reps in reports.values() for r in reps if not r["trust"]["trusted"]}
    for r in rows:
        if r["concurrency"] in bad_levels:
            r["regression"] = None  # not judged on untrusted numbers
    failed = sum(r["failed"] for side in reports.values() for r in side)
    if plot is not None:
        _write_plot(plot, {"A": reports["a"], "B": reports["b"]})
    code = (
        ExitCode.CRIT
        if failed
        else ExitCode.UNKNOWN
        if bad_levels
        else (ExitCode.WARN if any(r["regression"] for r in rows) else ExitCode.OK)
    )
    if as_json:
        print_json(
            _finite(
                {
                    "a": ep.url,
                    "b": ep_b.url,
                    "tolerance": tolerance,
                    **work.describe(),
                    "trusted": not bad_levels,
                    "comparison": rows,
                    "results": reports,
                }
            )
        )
        raise typer.Exit(code)
    from rich.table import Table

    t = Table(title=f"A {ep.url} vs B {ep_b.url} (tolerance {tolerance:.0%})")
    for col in ("conc", "metric", "A", "B", "change", ""):
        t.add_column(col, justify="right")
    for r in rows:
        verdict = "UNTRUSTED" if r["regression"] is None else "REGRESSION" if r["regression"] else ""
        t.add_row(
            str(r["concurrency"]),
            r["metric"],
            _ms(r["a"]),
            _ms(r["b"]),
            "-" if math.isnan(r["change"]) else f"{r['change']:+.0%}",
            verdict,
        )
    console.print(t)
    for side, lines in untrusted.items():
        for line in lines:
            console.print(f"UNTRUSTED {side.upper()} {line}", markup=False)
    if failed:
        console.print(f"{failed} requests failed; see --json for the reasons")
    raise typer.Exit(code)


def _scrape(server_metrics: Any, ep: Any, timeout: float) -> dict[str, float] | None:
    try:
        return server_metrics.scrape(ep, min(timeout, 10.0))  # type: ignore[no-any-return]
    except ClusterctlError:
        return None


def _exit_code(reports: list[dict[str, Any]]) -> int:
    """2 when every request failed, 3 when a level cannot be trusted, 1 when some failed, else 0."""
    failed = sum(r["failed"] for r in reports)
    if failed and not sum(r["completed"] for r in reports):
        return ExitCode.CRIT
    if _untrusted(reports):
        return ExitCode.UNKNOWN
    return ExitCode.WARN if failed else ExitCode.OK


def _checked(r: dict[str, Any]) -> str:
    """One line of what the trust check measured for level report ``r``."""
    t = r["trust"]
    parts = []
    if r.get("server_ttft_mean_ms") is not None:
        parts.append(f"server TTFT {r['server_ttft_mean_ms']:.1f} ms (client {t['ttft_error_ms']:+.1f} ms)")
    if t.get("tpot_error_pct") is not None:
        parts.append(f"TPOT vs server {t['tpot_error_pct']:+.0f} %")
    if t.get("loop_lag_ms"):
        parts.append(f"loop lag {t['loop_lag_ms']['mean']:.1f} ms mean, {t['loop_lag_ms']['p99']:.1f} p99")
    if t.get("coalesced_share") is not None:
        parts.append(f"chunks read together {100 * t['coalesced_share']:.0f} %")
    if r.get("prompt_tokens_mean") is not None:
        parts.append(f"prompt {r['prompt_tokens_mean']:g} tokens ({r['prompt_words_mean']:g} words)")
    return "; ".join(parts + t.get("notes", [])) or "-"


def _table(reports: list[dict[str, Any]], goodput: bool) -> None:
    from rich.table import Table

    t = Table(title="bench (latencies in ms: mean / p99)")
    for col in ("conc", "ok", "fail", "req/s", "out tok/s", "TTFT", "TPOT", "ITL", "E2E", "gen CPU %"):
        t.add_column(col, justify="right")
    if goodput:
        t.add_column("goodput req/s", justify="right")
    t.add_column("numbers", justify="right")
    for r in reports:
        row = [
            str(r["concurrency"]),
            str(r["completed"]),
            str(r["failed"]),
            f"{r['request_throughput']:.2f}",
            f"{r['output_throughput']:.1f}",
        ]
        row += [f"{_ms(r[k]['mean'])} / {_ms(r[k]['p99'])}" for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")]
        row.append(f"{r['generator_cpu_percent']:.0f}")
        if goodput:
            row.append(f"{r['goodput']:.2f}")
        row.append("ok" if r["trust"]["trusted"] else "UNTRUSTED")
        t.add_row(*row)
    console.print(t)
    for r in reports:
        console.print(f"concurrency {r['concurrency']}: {_checked(r)}", markup=False)
    for line in _untrusted(reports):
        console.print(f"UNTRUSTED {line}", markup=False)
    if _untrusted(reports):
        console.print("Give the generator a core of its own or run it on another machine (docs/bench.md).")
    for r in reports:
        for e in r["errors"]:
            console.print(f"concurrency {r['concurrency']}: {e}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("bench", help=HELP)(bench)
