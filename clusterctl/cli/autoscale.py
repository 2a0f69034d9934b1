"""``clusterctl autoscale [plan|run|daemon|install|history]``: elastic scaling of templates (docs/autoscale.md)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer

from clusterctl.cli import _complete
from clusterctl.cli._hosts import check_host_key_policy
from clusterctl.cli._common import console, err_console, fail, load_inventory, print_json, user_config, write_files
from clusterctl.cli.placement import StateDirOpt, state_store
from clusterctl.cli._options import ConnectTimeoutOpt, FanoutOpt, HostKeyOpt, InventoryOpt, JsonOpt
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

if TYPE_CHECKING:
    from clusterctl.ops.autoscale import AutoscaleRequest, Outcome

ACTIONS = ("plan", "run", "daemon", "install", "history")


def _outcome_code(outs: list[Outcome], plan: bool) -> ExitCode:
    codes = [ExitCode.OK]
    for o in outs:
        if o.outcome in ("failed", "error"):
            codes.append(ExitCode.CRIT)
        elif (
            o.outcome == "waited"
            or (plan and o.decision.action != "none")
            or o.decision.rule in ("missing-data", "no-data", "backoff")
        ):
            codes.append(ExitCode.WARN)
    return max(codes)


def _print_outcome(o: Outcome) -> None:
    d, p = o.decision, o.policy
    assert p is not None
    val = "unknown" if d.value is None else f"{d.value:.3g}"
    act = {
        "out": f"scale out {d.current} -> {d.target}",
        "in": f"scale in {d.current} -> {d.target}",
        "none": f"stay at {d.current}",
    }[d.action]
    console.print(
        f"{o.template}: {p.signal} {val} (band {p.low:g}..{p.high:g}, replicas {p.min_replicas}.."
        f"{p.max_replicas}): {act} [{d.rule}]" + ("" if o.outcome in ("planned", "none") else f" -> {o.outcome}"),
        markup=False,
    )
    for r in o.signals.replicas:
        v = "-" if r.value is None else f"{r.value:.3g}"
        extra = f"  ({r.error})" if r.error else ""
        console.print(f"  {r.name:<24} {r.state:<10} {v:>8}  worth {r.worth:g}{extra}", markup=False)
    for why in d.reasons:
        console.print(f"  why: {why}", markup=False)
    if o.detail:
        console.print(f"  {o.outcome}: {o.detail}", markup=False)


def _say(quiet: bool) -> Callable[[str], None]:
    return (lambda s: None) if quiet else (lambda s: err_console.print(s, markup=False))


def autoscale(
    action: str = typer.Argument(
        "plan",
        metavar="[plan|run|daemon|install|history]",
        help="plan (default): what it would do now and why; run: one decision "
        "per template, acted on; daemon: decide every interval_s; install: "
        "a systemd service on this (the control) host; history: past decisions.",
    ),
    templates: Optional[list[str]] = typer.Option(
        None,
        "--template",
        "-t",
        autocompletion=_complete.templates,
        help="Only this template (repeatable; default: every template with an autoscale: policy).",
    ),
    plan_flag: bool = typer.Option(False, "--plan", help="Same as the action 'plan'."),
    daemon_flag: bool = typer.Option(False, "--daemon", help="Same as the action 'daemon'."),
    interval: Optional[float] = typer.Option(
        None,
        "--interval",
        min=0.5,
        help="daemon: seconds between rounds (default: the smallest interval_s of the policies).",
    ),
    rounds: int = typer.Option(0, "--rounds", min=0, help="daemon: stop after N rounds (0: until stopped)."),
    last: int = typer.Option(20, "--last", min=1, help="history: the newest N decisions."),
    unit_dir: str = typer.Option("/etc/systemd/system", "--unit-dir", help="install: where the unit goes."),
    no_start: bool = typer.Option(False, "--no-start", help="install: write the unit, do not enable/start it."),
    dry_run: bool = typer.Option(False, "--dry-run", help="install: print the unit, write nothing."),
    inventory: Optional[str] = InventoryOpt,
    state_dir: Optional[str] = StateDirOpt,
    as_json: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    # start-up: `clusterctl --help` imports every command module; the autoscaler loads when run
    from clusterctl.ops import autoscale as ops_autoscale

    if action not in ACTIONS:
        fail(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    if plan_flag and daemon_flag:
        fail("give --plan or --daemon, not both")
    if plan_flag:
        action = "plan"
    elif daemon_flag:
        action = "daemon"
    inv = load_inventory(inventory)
    store = state_store(state_dir)
    try:
        policies = ops_autoscale.policies(inv, templates or [])
    except ClusterctlError as e:
        fail(str(e))
    if action == "history":
        _history(store.directory, templates or [], last, as_json)
        return
    if not policies:
        fail(f"no template of {inv.path} has an autoscale: policy (docs/autoscale.md)")
    if action == "install":
        _install(inventory, store.directory, templates or [], unit_dir, no_start, dry_run)
        return
    fleets = ops_autoscale.fleets(
        user_config(),
        fanout=fanout,
        connect_timeout=connect_timeout,
        host_key_policy=check_host_key_policy(host_key_policy),
    )
    request = ops_autoscale.AutoscaleRequest(inv, store.directory, fleets, policies)
    if action == "daemon":
        _daemon(request, interval, rounds, as_json, templates or [])
        return
    try:
        outs = ops_autoscale.run_once(request, plan_only=action == "plan", on_event=_say(as_json))
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json(
            {
                "action": action,
                "templates": [o.to_json() for o in outs],
                "exit_code": int(_outcome_code(outs, action == "plan")),
            }
        )
    else:
        for o in outs:
            _print_outcome(o)
    raise typer.Exit(_outcome_code(outs, action == "plan"))


def _daemon(
    request: AutoscaleRequest, interval: Optional[float], rounds: int, as_json: bool, templates: list[str]
) -> None:
    """Decide every interval until SIGTERM/SIGINT (the round in progress finishes first); an edited
    inventory applies from the next round (a broken edit is reported and the previous one kept)."""
    import json

    from clusterctl.ops import autoscale as ops_autoscale

    reload_inventory = ops_autoscale.inventory_reloader(request, templates)
    policies = dict(request.policies)

    def reload(current: AutoscaleRequest) -> Optional[AutoscaleRequest]:
        fresh = reload_inventory(current)
        if fresh is not None:
            policies.clear()
            policies.update(fresh.policies)
        return fresh

    every = ops_autoscale.daemon_interval(request, interval)
    stop = {"now": False}

    def _stop(signum: int, frame: Any) -> None:
        stop["now"] = True

    def show(outs: list[Outcome]) -> None:
        for o in outs:
            if as_json:
                sys.stdout.write(json.dumps(o.to_json(), sort_keys=True) + "\n")
                sys.stdout.flush()
            elif o.decision.action != "none" or o.outcome not in ("none",):
                _print_outcome(o)
            else:
                d = o.decision
                console.print(
                    f"{o.template}: {policies[o.template].signal} "
                    f"{'unknown' if d.value is None else f'{d.value:.3g}'}, {d.current} replicas "
                    f"[{d.rule}]",
                    markup=False,
                )

    signal.signal(signal.SIGTERM, _stop)
    console.print(f"autoscaler: {', '.join(policies)} every {every:g} s (state {request.state_dir})", markup=False)
    ops_autoscale.run_daemon(
        request,
        interval=interval,
        rounds=rounds,
        should_stop=lambda: stop["now"],
        on_round=show,
        on_error=lambda msg: err_console.print(msg, markup=False),
        on_event=_say(as_json),
        reload=reload,
    )
    console.print("autoscaler: stopped", markup=False)


def _install(
    inventory: Optional[str], state_dir: Path, templates: list[str], unit_dir: str, no_start: bool, dry_run: bool
) -> None:
    from clusterctl.ops import autoscale as ops_autoscale

    inv_path = inventory or str(user_config().inventory or "")
    if not inv_path:
        fail("install: give -i INVENTORY (the service reads it on every round)")
    path, text = ops_autoscale.service(inv_path, state_dir, templates, unit_dir)
    write_files({path: text}, dry_run=dry_run)
    if dry_run or no_start:
        return
    try:
        ops_autoscale.enable_service()
    except ClusterctlError as e:
        fail(str(e), ExitCode.CRIT)
    console.print(f"started {ops_autoscale.UNIT} (journalctl -u {ops_autoscale.UNIT} -f)", markup=False)


def _history(state_dir: Path, templates: list[str], last: int, as_json: bool) -> None:
    from clusterctl.ops import autoscale as ops_autoscale

    recs = ops_autoscale.history(state_dir, templates, last)
    if as_json:
        print_json({"decisions": recs})
        return
    if not recs:
        console.print("no autoscaler decisions recorded", markup=False)
        return
    for r in recs:
        val = r.get("value")
        console.print(
            f"{r.get('time')}  {r.get('template')}  {r.get('signal')} "
            f"{'-' if val is None else f'{val:.3g}'}  {r.get('current')} -> {r.get('target')}  "
            f"{r.get('action')} [{r.get('rule')}] {r.get('outcome')}"
            + (f": {r.get('detail')}" if r.get("detail") else ""),
            markup=False,
        )


def register(app: typer.Typer) -> None:
    app.command(
        "autoscale",
        help="""Add and remove template replicas from live load (the template's autoscale: policy).

plan (the default, also --plan) measures every autoscaled template (status's
collection over the policy's window_s) and prints what it would do now and
why, with the numbers; it changes nothing. run makes one decision per
template and acts through placement, the deploy engine (deploy lock,
staging, gates, rollback) and the gateway: new replicas are added at the
gateway only after their gates pass; removed replicas are drained first.
An operator's deploy or scale holding the deploy lock wins: the autoscaler
records 'waited' and tries again next round. daemon (also --daemon) runs a
round every interval; install writes and starts a systemd service for it on
this host. history lists the audited decisions (also in `report`).

Exit status: 0 nothing to do or done; 1 plan: it would act, or it waited, or
data was missing; 2 an action failed (rolled back); 3 usage, inventory or
state errors.

Examples:

  clusterctl autoscale --plan -i site.yaml

  clusterctl autoscale run -i site.yaml --json

  clusterctl autoscale install -i /etc/clusterctl/site.yaml
""",
    )(autoscale)
