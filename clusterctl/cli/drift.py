"""``clusterctl drift``: baselines of greedy outputs, drift checks, noise calibration, leak check (docs/drift.md)."""

from __future__ import annotations

from typing import Any, Optional

import typer

from clusterctl.cli._common import console, fail, load_inventory, print_json, user_config
from clusterctl.cli._target import TargetArg
from clusterctl.cli._options import InventoryOpt, JsonOpt
from clusterctl.errors import ClusterctlError

app = typer.Typer(
    help="Compare greedy outputs with named baselines; check for cross-session context leaks.\n\n"
    "TARGET is an endpoint URL or an inventory instance (address, port and API key from the "
    "inventory).\n\nExample:\n\n  clusterctl drift check http://127.0.0.1:8000 --baseline reference",
    no_args_is_help=True,
    rich_markup_mode=None,
)

PromptsOpt = typer.Option(None, "--prompts", "-p", help="Prompt set JSONL [default: checks/drift/basic.jsonl].")
TimeoutOpt = typer.Option(60.0, "--timeout", min=1, help="Seconds one request may take in all (connect to last byte).")


def _endpoint(target: str, inventory: Optional[str]) -> Any:
    """The endpoint of ``target`` (``ops.drift.endpoint``); exits 3 on a bad URL, an unknown instance
    or an unreadable secret.  The inventory is read only for an instance name."""
    from clusterctl.ops import drift as ops

    try:
        return ops.endpoint(target, lambda: load_inventory(inventory), user_config)
    except ClusterctlError as e:
        fail(str(e))


@app.command(
    "baseline",
    help="""Record greedy outputs (temperature 0, fixed seed, top-k logprobs) as a named baseline.

Kept as JSON under $XDG_STATE_HOME/clusterctl/drift/baselines/NAME.json with the
endpoint's model and vLLM version; --meta adds what the endpoint cannot tell
(quantization, GPU, TP size). Exit status: 0 recorded, 3 errors.

Example:

  clusterctl drift baseline http://127.0.0.1:8000 --name reference --prompts checks/drift/basic.jsonl --meta gpu=H100 --meta tp=1
""",
)
def baseline(
    target: str = TargetArg,
    name: str = typer.Option(..., "--name", help="Baseline name (e.g. reference, previous)."),
    prompts: Optional[str] = PromptsOpt,
    k: int = typer.Option(8, "--top-k", min=1, max=20, help="Top logprobs kept per token."),
    seed: int = typer.Option(0, "--seed"),
    meta: list[str] = typer.Option([], "--meta", help="KEY=VALUE recorded with the baseline."),
    timeout: float = TimeoutOpt,
    inventory: Optional[str] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    from clusterctl.ops import drift as ops

    extra = {}
    for m in meta:
        key, eq, value = m.partition("=")
        if not eq or not key:
            fail(f"--meta {m!r}: expected KEY=VALUE")
        extra[key] = value
    ep = _endpoint(target, inventory)
    try:
        done = ops.record_baseline(ep, name, prompts, k=k, seed=seed, extra_env=extra, timeout=timeout)
    except ClusterctlError as e:
        fail(str(e))
    b, path = done.baseline, done.path
    if as_json:
        print_json({"name": name, "path": str(path), "prompts": len(b.outputs), "env": b.env, "skipped": b.skipped})
    else:
        console.print(
            f"baseline {name!r}: {len(b.outputs)} prompts from {ep.url} (model {b.env.get('model')}) -> {path}"
        )
        for pid, why in b.skipped.items():
            console.print(
                f"  note: prompt {pid!r} skipped: it does not fit the endpoint's context "
                f"(max_model_len {b.env.get('max_model_len')}): {why}",
                markup=False,
            )


@app.command(
    "check",
    help="""Compare the endpoint's greedy outputs with a baseline; pass or fail.

Metrics: exact-match rate, first divergence, vLLM's rule (at the first differing
token each side's token is in the other's top-k), token agreement, approximate
KL over the top-k. Limits from checks/drift.yaml (per model), widened to the
noise floor of `drift calibrate` when one was measured for the model.
Exit status: 0 pass, 2 fail, 3 errors.

Example:

  clusterctl drift check http://127.0.0.1:8000 --baseline previous --json
""",
)
def check(
    target: str = TargetArg,
    baseline_name: str = typer.Option(..., "--baseline", "-b", help="Baseline name."),
    thresholds: Optional[str] = typer.Option(None, "--thresholds", help="Threshold file [default: checks/drift.yaml]."),
    use_calibration: bool = typer.Option(
        True, "--calibration/--no-calibration", help="Widen limits to the measured noise floor."
    ),
    timeout: float = TimeoutOpt,
    inventory: Optional[str] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    from clusterctl.ops import drift as ops

    ep = _endpoint(target, inventory)
    try:
        v = ops.check(ep, baseline_name, thresholds=thresholds, use_calibration=use_calibration, timeout=timeout)
    except ClusterctlError as e:
        fail(str(e))
    summary, reasons, limits, cal, diffs = v.summary, v.reasons, v.limits, v.calibrated, v.diffs
    code = ops.check_code(v)
    if as_json:
        print_json(
            {
                "url": ep.url,
                "baseline": baseline_name,
                "pass": not reasons,
                "reasons": reasons,
                "summary": summary,
                "thresholds": vars(limits),
                "calibrated": bool(cal),
                "prompts": [vars(d) for d in diffs],
            }
        )
        raise typer.Exit(code)
    _diff_table(diffs)
    console.print(
        f"exact match {summary['exact_match']:.0%}, vLLM rule {summary['vllm_rule_pass']:.0%}, "
        f"agreement {summary['agreement']:.0%}, mean KL {summary['mean_kl']:.4f} (max "
        f"{summary['max_kl']:.4f}){' [calibrated limits]' if cal else ''}"
    )
    console.print("PASS" if not reasons else "FAIL: " + "; ".join(reasons))
    raise typer.Exit(code)


def _diff_table(diffs: list[Any]) -> None:
    from rich.table import Table

    t = Table()
    for col in ("result", "prompts", "first divergence", "vLLM rule", "KL"):
        t.add_column(col)
    exact = [d.id for d in diffs if d.exact]
    if exact:
        t.add_row(
            "identical",
            f"{len(exact)}: {', '.join(exact[:6])}{' ...' if len(exact) > 6 else ''}",
            "-",
            "pass",
            f"{max((d.kl for d in diffs if d.exact), default=0):.4f}",
        )
    for d in diffs:
        if not d.exact:
            if d.first_divergence is None:
                where = "-"
            elif d.length_only:
                where = f"length only: one output ends at token {d.first_divergence}"
            else:
                where = f"token {d.first_divergence}: {d.baseline_token!r} -> {d.new_token!r}" + (
                    f" ({d.baseline_id} -> {d.new_id})" if d.baseline_id else ""
                )
            t.add_row("diverged", d.id, where, "pass" if d.vllm_rule else "FAIL", f"{d.kl:.4f}")
    console.print(t)


@app.command(
    "calibrate",
    help="""Measure the noise floor: the endpoint against itself under other traffic.

A reference pass alone, then RUNS passes with BACKGROUND streams of other
requests running (real vLLM's greedy output can change with batch composition);
the worst exact match, rule pass rate and KL are saved for the model, and
`drift check` widens its limits to them. Exit status: 0 measured, 3 errors.

Example:

  clusterctl drift calibrate http://127.0.0.1:8000 --runs 3 --background 8
""",
)
def calibrate(
    target: str = TargetArg,
    prompts: Optional[str] = PromptsOpt,
    runs: int = typer.Option(3, "--runs", min=1, help="Passes under load."),
    background: int = typer.Option(4, "--background", min=0, help="Concurrent streams of other traffic."),
    save: bool = typer.Option(True, "--save/--no-save", help="Keep the floor for `drift check`."),
    timeout: float = TimeoutOpt,
    inventory: Optional[str] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    from clusterctl.ops import drift as ops

    ep = _endpoint(target, inventory)
    try:
        done = ops.calibrate(ep, prompts, runs_n=runs, background=background, save=save, timeout=timeout)
    except ClusterctlError as e:
        fail(str(e))
    cal, path = done.result, done.path
    if as_json:
        print_json({**cal, "path": None if path is None else str(path)})
        return
    f = cal["floor"]
    console.print(
        f"noise floor over {runs} runs with {background} background streams: exact match "
        f"{f['exact_match']:.0%}, vLLM rule {f['vllm_rule_pass']:.0%}, mean KL {f['mean_kl']:.4f}"
        + (f" -> {path}" if path else "")
    )


@app.command(
    "leak",
    help="""Context-leak check: canaries planted per session, looked for in the others.

SESSIONS concurrent sessions (OpenAI `user` field) each send REQUESTS prompts
carrying their own random canary word; another session's canary in a response's
text or top-k tokens is a sighting. Does not rely on output equality.

TARGET is a URL (an instance or the gateway), an inventory instance, or
comma-separated instance globs ('pool-*': every matching instance, template
replicas included, checked one after the other). Requests name the model
(--model, else the one /v1/models lists; a gateway serving several needs
--model). Exit status: 0 no sighting, 2 any sighting (CRIT), 3 errors or no
answers (the worst over the targets).

Examples:

  clusterctl drift leak http://127.0.0.1:8000 --sessions 8 --requests 10

  clusterctl drift leak http://gw01:8080 --model qwen3-8b

  clusterctl drift leak 'pool-*' -i site.yaml --json
""",
)
def leak_cmd(
    target: str = TargetArg,
    sessions: int = typer.Option(4, "--sessions", min=2, help="Concurrent sessions."),
    requests: int = typer.Option(6, "--requests", min=1, help="Requests per session."),
    model: Optional[str] = typer.Option(
        None, "--model", help="Model the requests name [default: the one the endpoint lists]."
    ),
    timeout: float = TimeoutOpt,
    inventory: Optional[str] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    from clusterctl.ops import drift as ops

    try:
        targets = ops.leak_targets(target, lambda: load_inventory(inventory), user_config)
    except ClusterctlError as e:
        fail(str(e))
    results = ops.leak_check(targets, sessions=sessions, requests=requests, model=model, timeout=timeout)
    code = ops.leak_code(results)
    if as_json:
        rows = [
            {
                "target": r.name,
                "url": r.endpoint.url,
                "model": r.model,
                "sessions": r.report.sessions,
                "requests": r.report.requests,
                "failed": r.report.failed,
                "sightings": [vars(s) for s in r.report.sightings],
                "errors": r.report.errors,
                "status": r.status.name,
            }
            for r in results
        ]
        print_json({**rows[0], "status": code.name} if len(rows) == 1 else {"targets": rows, "status": code.name})
        raise typer.Exit(code)
    for r in results:
        name, ep, picked, rep = r.name, r.endpoint, r.model, r.report
        head = f"{name} ({ep.url}, model {picked or '?'})" if name != ep.url else f"{ep.url} (model {picked or '?'})"
        for err in rep.errors:
            console.print(f"{head}: error: {err}", markup=False)
        if rep.sightings:
            console.print(
                f"{head}: CRIT: {len(rep.sightings)} cross-session sightings in {rep.requests} responses", markup=False
            )
            for s in rep.sightings[:20]:
                console.print(
                    f"  {s.owner}'s canary {s.canary!r} in {s.seen_by}'s response {s.request} ({s.where})", markup=False
                )
        elif rep.requests:
            console.print(
                f"{head}: OK: no canary seen across {rep.sessions} sessions, {rep.requests} responses"
                + (f" ({rep.failed} failed)" if rep.failed else ""),
                markup=False,
            )
        else:
            console.print(f"{head}: UNKNOWN: no request succeeded", markup=False)
    raise typer.Exit(code)
