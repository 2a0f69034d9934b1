"""``clusterctl bench TARGET``: streaming load test with vLLM's latency definitions (docs/bench.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer

from clusterctl.cli._common import InventoryOpt, JsonOpt, console, err_console, fail, print_json
from clusterctl.cli._target import TargetArg, endpoint
from clusterctl.errors import ClusterctlError

if TYPE_CHECKING:
    from clusterctl.ops.bench import Compared, Workload
    from clusterctl.vllmclient import Endpoint, RequestResult

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
    from clusterctl.ops import bench as ops

    ep = endpoint(target, inventory)
    if plot is not None:
        _check_writable(plot)
    if tokenizer is not None and no_tokenizer:
        fail("--tokenizer and --no-tokenizer exclude each other")
    slo = Slo(slo_ttft, slo_tpot, slo_e2e) if any(v is not None for v in (slo_ttft, slo_tpot, slo_e2e)) else None
    levels = _levels(concurrency)
    opts = ops.LevelOptions(model, timeout, request_rate, slo, server_timings)
    try:
        work = ops.Workload(
            dataset,
            requests,
            input_len,
            output_len,
            seed,
            duration,
            progress=lambda label, total: _Progress(label, total, not as_json),
        )
        work.tokenizer(ep, model, tokenizer, no_tokenizer, timeout)
        if not as_json:
            for w in work.warnings:
                err_console.print(f"warning: {w}", markup=False)
        if compare_url is not None:
            ep_b = endpoint(compare_url, inventory)
            _compare(
                ep, ep_b, ops.compare_runs(work, ep, ep_b, levels, opts, tolerance), work, tolerance, plot, as_json
            )
        reports = ops.run_levels(work, ep, levels, opts)
        if plot is not None:
            ops.write_plot(plot, {ep.url: reports})
    except ClusterctlError as e:
        fail(str(e))
    code = ops.exit_code(reports)
    if as_json:
        print_json(
            ops.finite(
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


def _untrusted(reports: list[dict[str, Any]]) -> list[str]:
    from clusterctl.bench.trust import untrusted

    return untrusted(reports)


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

    def __enter__(self) -> Callable[[RequestResult], None]:
        if self.bar is not None:
            self.bar.start()
        return self.update

    def update(self, r: RequestResult) -> None:
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


def _compare(
    ep: Endpoint, ep_b: Endpoint, done: Compared, work: Workload, tolerance: float, plot: Optional[Path], as_json: bool
) -> None:
    """Render the comparison of A and B (``ops.bench.compare_runs``); always exits: 1 on a regression,
    3 (nothing judged) when a level of either side cannot be trusted, 2 failed requests."""
    from clusterctl.ops import bench as ops

    reports, rows = done.reports, done.rows
    untrusted = {side: _untrusted(reps) for side, reps in reports.items()}
    if plot is not None:
        ops.write_plot(plot, {"A": reports["a"], "B": reports["b"]})
    code = done.code
    if as_json:
        print_json(
            ops.finite(
                {
                    "a": ep.url,
                    "b": ep_b.url,
                    "tolerance": tolerance,
                    **work.describe(),
                    "trusted": not done.bad_levels,
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
    if done.failed:
        console.print(f"{done.failed} requests failed; see --json for the reasons")
    raise typer.Exit(code)


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
