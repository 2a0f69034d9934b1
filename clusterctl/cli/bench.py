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

For each concurrency level, REQUESTS synthetic prompts of INPUT_LEN words (or
the prompts of --dataset FILE, JSONL {"prompt": ..., "output_len": ...}) are
sent with at most that many in flight (all at once, or as Poisson arrivals at
--request-rate per second), each asking for OUTPUT_LEN tokens (ignore_eos);
with --duration S each level runs S seconds instead, cycling the prompts. Measured as `vllm bench serve` does: TTFT (first content
chunk), TPOT excluding the first token, ITL (gaps between chunks), E2E; mean,
median, p90, p99 in ms; request, output and total token throughput; goodput
under the SLOs given. --plot FILE writes an SVG of TTFT and output
throughput against concurrency. --server-timings also reads the server's own TTFT
histogram from /metrics and reports the generator's error against it.

With --compare URL_B the same workload runs against both endpoints, level by
level, and each metric's relative change is shown; worse than --tolerance is a
regression.

Exit status: 0 every request succeeded, 1 some failed, 2 all failed,
3 usage errors. With --compare: 0 no regression, 1 a regression, 2 failed
requests.

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


def bench(target: str = TargetArg,
          concurrency: str = typer.Option("1,8", "--concurrency", "-c", help="Levels, comma-separated."),
          requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1,
                                                 help="Requests per level [default: 32, or the dataset's lines]."),
          duration: Optional[float] = typer.Option(None, "--duration", min=0.001,
                                                   help="Seconds per level (prompts cycled) instead of --requests."),
          dataset: Optional[Path] = typer.Option(None, "--dataset", metavar="FILE",
                                                 help='JSONL prompts: {"prompt": str, "output_len"?: int} a line.'),
          input_len: int = typer.Option(256, "--input-len", min=1, help="Prompt length in words (~tokens)."),
          output_len: int = typer.Option(64, "--output-len", min=1, help="Tokens asked per request."),
          model: Optional[str] = typer.Option(None, "--model", help="Served model name [default: the server's]."),
          slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", min=0, help="Goodput SLO: TTFT ms."),
          slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", min=0, help="Goodput SLO: TPOT ms."),
          slo_e2e: Optional[float] = typer.Option(None, "--slo-e2e", min=0, help="Goodput SLO: E2E ms."),
          request_rate: Optional[float] = typer.Option(None, "--request-rate", min=0.001,
                                                       help="Poisson arrivals, requests/s [default: all at once]."),
          compare_url: Optional[str] = typer.Option(None, "--compare", metavar="TARGET_B",
                                                    help="Run the same workload against TARGET_B and compare."),
          tolerance: float = typer.Option(0.1, "--tolerance", min=0,
                                          help="With --compare: relative change counted as a regression."),
          server_timings: bool = typer.Option(False, "--server-timings",
                                              help="Compare TTFT with the server's /metrics histogram."),
          plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE",
                                              help="Write an SVG of TTFT and throughput against concurrency."),
          timeout: float = typer.Option(120.0, "--timeout", min=1, help="Seconds a request may stall."),
          seed: int = typer.Option(0, "--seed", help="Seed of the synthetic prompts and arrivals."),
          inventory: Optional[str] = InventoryOpt,
          as_json: bool = JsonOpt) -> None:
    from clusterctl.bench import server_metrics
    from clusterctl.bench.stats import Slo, aggregate

    ep = endpoint(target, inventory)
    if plot is not None:
        _check_writable(plot)
    slo = Slo(slo_ttft, slo_tpot, slo_e2e) if any(v is not None for v in (slo_ttft, slo_tpot, slo_e2e)) else None
    levels = _levels(concurrency)
    work = _Workload(dataset, requests, input_len, output_len, seed, duration, progress=not as_json)
    if compare_url is not None:
        _compare(ep, endpoint(compare_url, inventory), levels, work, model, timeout, request_rate, slo, tolerance,
                 plot, as_json)
    reports: list[dict[str, Any]] = []
    for level in levels:
        before = _scrape(server_metrics, ep) if server_timings else None
        run = work.run(ep, level, model, timeout, request_rate)
        rep = aggregate(run.results, run.duration, level, slo)
        rep["generator_cpu_percent"] = 100 * run.cpu_s / max(run.duration, 1e-9)
        if before is not None:
            after = _scrape(server_metrics, ep)
            server = server_metrics.histogram_mean(before, after, "vllm:time_to_first_token_seconds") \
                if after is not None else None
            rep["server_ttft_mean_ms"] = None if server is None else 1000 * server
            rep["ttft_error_ms"] = None if server is None else rep["ttft_ms"]["mean"] - 1000 * server  # type: ignore
        reports.append(rep)
    code = _exit_code(reports)
    if plot is not None:
        _write_plot(plot, {ep.url: reports})
    if as_json:
        print_json({"url": ep.url, "input_len": None if dataset else input_len, "output_len": output_len,
                    "requests": None if duration else work.requests, "duration_s": duration,
                    "dataset": None if dataset is None else str(dataset), "request_rate": request_rate,
                    "slo_ms": None if slo is None else vars(slo), "results": reports})
        raise typer.Exit(code)
    _table(reports, server_timings, slo is not None)
    raise typer.Exit(code)


class _Workload:
    """The prompts of every level: the dataset's (cut or repeated to ``requests``) or synthetic ones."""

    def __init__(self, dataset: Optional[Path], requests: Optional[int], input_len: int, output_len: int,
                 seed: int, duration: Optional[float], progress: bool = True) -> None:
        self.input_len, self.output_len, self.seed, self.duration = input_len, output_len, seed, duration
        self.progress = progress
        self.rng = random.Random(seed)
        self.data: Any = None
        if dataset is not None:
            from clusterctl.bench import dataset as ds

            try:
                self.data = ds.load(dataset)
            except ClusterctlError as e:
                fail(str(e))
        self.requests = requests or (len(self.data.prompts) if self.data else 32)

    def prompts(self) -> tuple[list[str], list[Optional[int]]]:
        """This level's prompts and per-prompt output lengths (a new synthetic draw per level)."""
        if self.data is None:
            from clusterctl.bench.loadgen import synthetic_prompt

            return [synthetic_prompt(self.input_len, self.rng) for _ in range(self.requests)], [None] * self.requests
        n = len(self.data.prompts)
        idx = [i % n for i in range(self.requests)] if self.duration is None else list(range(n))
        return [self.data.prompts[i] for i in idx], [self.data.output_lens[i] for i in idx]

    def run(self, ep: Any, level: int, model: Optional[str], timeout: float, rate: Optional[float],
            prompts: Optional[tuple[list[str], list[Optional[int]]]] = None) -> Any:
        from clusterctl.bench import runner

        ps, lens = prompts or self.prompts()
        with _Progress(f"{ep.url} concurrency {level}", None if self.duration else len(ps),
                       self.progress) as on_result:
            try:
                return runner.run(ep, ps, level, self.output_len, output_lens=lens, model=model, timeout=timeout,
                                  request_rate=rate, seed=self.seed, duration=self.duration, on_result=on_result)
            except ClusterctlError as e:
                fail(str(e))


class _Progress:
    """Finished requests of one level on stderr: a transient bar on a terminal, else one line at the end;
    nothing when not ``enabled`` (--json)."""

    def __init__(self, label: str, total: Optional[int], enabled: bool) -> None:
        self.label, self.total, self.done, self.failed, self.enabled = label, total, 0, 0, enabled
        self.bar: Any = None
        if enabled and err_console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                console=err_console, transient=True)
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
    from clusterctl.report.textfile import write_atomic

    try:
        write_atomic(path, bench_svg(runs))
    except OSError as e:
        fail(f"--plot {path}: cannot write: {e.strerror or e}")


def _compare(ep: Any, ep_b: Any, levels: list[int], work: _Workload, model: Optional[str], timeout: float,
             request_rate: Optional[float], slo: Any, tolerance: float, plot: Optional[Path], as_json: bool) -> None:
    """Same prompts, levels and pacing against both endpoints, A then B per level; exits 1 on a regression."""
    from clusterctl.bench.compare import compare
    from clusterctl.bench.stats import aggregate

    reports: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for level in levels:
        prompts = work.prompts()
        for side, target in (("a", ep), ("b", ep_b)):
            run = work.run(target, level, model, timeout, request_rate, prompts)
            reports[side].append(aggregate(run.results, run.duration, level, slo))
    rows = compare(reports["a"], reports["b"], tolerance)
    failed = sum(r["failed"] for side in reports.values() for r in side)
    if plot is not None:
        _write_plot(plot, {"A": reports["a"], "B": reports["b"]})
    code = ExitCode.CRIT if failed else (ExitCode.WARN if any(r["regression"] for r in rows) else ExitCode.OK)
    if as_json:
        print_json({"a": ep.url, "b": ep_b.url, "tolerance": tolerance, "comparison": rows, "results": reports})
        raise typer.Exit(code)
    from rich.table import Table

    t = Table(title=f"A {ep.url} vs B {ep_b.url} (tolerance {tolerance:.0%})")
    for col in ("conc", "metric", "A", "B", "change", ""):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["concurrency"]), r["metric"], _ms(r["a"]), _ms(r["b"]),
                  "-" if math.isnan(r["change"]) else f"{r['change']:+.0%}", "REGRESSION" if r["regression"] else "")
    console.print(t)
    if failed:
        console.print(f"{failed} requests failed; see --json for the reasons")
    raise typer.Exit(code)


def _scrape(server_metrics: Any, ep: Any) -> dict[str, float] | None:
    try:
        return server_metrics.scrape(ep)  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def _exit_code(reports: list[dict[str, Any]]) -> int:
    failed = sum(r["failed"] for r in reports)
    if not failed:
        return ExitCode.OK
    return ExitCode.CRIT if not sum(r["completed"] for r in reports) else ExitCode.WARN


def _table(reports: list[dict[str, Any]], server: bool, goodput: bool) -> None:
    from rich.table import Table

    t = Table(title="bench (latencies in ms: mean / p99)")
    for col in ("conc", "ok", "fail", "req/s", "out tok/s", "TTFT", "TPOT", "ITL", "E2E", "gen CPU %"):
        t.add_column(col, justify="right")
    if goodput:
        t.add_column("goodput req/s", justify="right")
    if server:
        t.add_column("server TTFT", justify="right")
        t.add_column("TTFT err", justify="right")
    for r in reports:
        row = [str(r["concurrency"]), str(r["completed"]), str(r["failed"]), f"{r['request_throughput']:.2f}",
               f"{r['output_throughput']:.1f}"]
        row += [f"{_ms(r[k]['mean'])} / {_ms(r[k]['p99'])}" for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")]
        row.append(f"{r['generator_cpu_percent']:.0f}")
        if goodput:
            row.append(f"{r['goodput']:.2f}")
        if server:
            row += [_ms(r.get("server_ttft_mean_ms")), _ms(r.get("ttft_error_ms"))]
        t.add_row(*row)
    console.print(t)
    for r in reports:
        for e in r["errors"]:
            console.print(f"concurrency {r['concurrency']}: {e}")


def register(app: typer.Typer) -> None:
    app.command("bench", help=HELP)(bench)
