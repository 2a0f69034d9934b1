"""``clusterctl failover``: instances whose TP group is UNAVAILABLE out of the gateway, moved, back in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import typer

from clusterctl.cli._common import console, err_console, fail, load_inventory, print_json, user_config
from clusterctl.cli._hosts import become_password, check_host_key_policy
from clusterctl.cli._options import (
    AskBecomePassOpt,
    ConnectTimeoutOpt,
    DeployStateDirOpt,
    FanoutOpt,
    HostKeyOpt,
    InventoryOpt,
    JsonOpt,
)
from clusterctl.errors import ClusterctlError

if TYPE_CHECKING:
    from rich.console import Console

    from clusterctl.ops.failover import FailoverReport, FailoverRequest

FAILOVER_HELP = """Find instances whose TP group doctor marks UNAVAILABLE (a member GPU is
critical: lost, XID, ...), take them out of the gateway, and move template
replicas onto spare, uncordoned GPUs.

For each such instance, in name order and at most --max-share of all
instances in one run (the rest are listed as over the cap and left alone):
cordon the failed GPU, or its whole host when the finding's action is
node-level ("drain the node and power-cycle it": XID 79, a lost GPU), and
every --avoid-host (reason "failover: ..."; an existing cordon is kept,
nothing is ever uncordoned; `clusterctl uncordon` removes it), mark the
instance down at the gateway, drain and stop it, place it anew (placement's
reschedule), roll it out through the deploy engine (gates, rollback) and
sync the gateway so it receives traffic again. Explicit instances (fixed
placement, also across hosts: the inventory decides where they run; the output
says which member failed and what to change) and replicas with no room left
are marked down and reported, not moved. --plan shows all of this and changes
nothing.

Exit status: 0 nothing to do or all moved, 1 some over the cap or not
movable, 2 a move (or the gateway) failed, 3 usage errors.

Examples:

  clusterctl failover --plan -i /var/lib/clusterctl-lab/inventory.yaml

  clusterctl failover --max-share 0.1 --json

  clusterctl failover --avoid-host gpu07
"""


def show(rep: FailoverReport, console: Console = console) -> None:
    """A failover report as lines (on ``console``: stdout, or stderr for ``report run --failover``)."""
    p = rep.plan
    if p.nothing:
        console.print(f"no UNAVAILABLE TP group among {p.total} instances; nothing to do", markup=False)
    for name, msg in sorted(p.findings.items()):
        console.print(f"{name}: {msg}", markup=False)
    verb = "would move" if rep.planned else "moved"
    for m in p.moves:
        why = rep.moved.get(m.instance)
        state = "" if rep.planned else (" ok" if why is None else f" FAILED: {why}")
        old, new = (" + ".join(f"{h} GPUs {','.join(map(str, g))}" for h, g in p_.stages) for p_ in (m.old, m.new))
        console.print(f"  {verb} {m.instance}: {old} -> {new} port {m.new.port}{state}", markup=False)
    down = "would be marked down" if rep.planned else "marked down"
    for name in p.fixed:
        why = p.fixed_why.get(name, "explicit instance (fixed placement)")
        console.print(f"  {name}: {down}, not moved: {why}", markup=False)
    for name, why in sorted(p.no_room.items()):
        console.print(f"  {name}: {down}, not moved: {why}", markup=False)
    for name in p.over_cap:
        console.print(
            f"  {name}: over the cap ({p.cap} of {p.total} instances per run, --max-share), not moved", markup=False
        )
    for key, c in sorted(p.cordons.items()):
        console.print(f"  {'would cordon' if rep.planned else 'cordoned'} {key}: {c.reason}", markup=False)
    for h, why in sorted(rep.detection.unchecked.items()):
        console.print(f"  {h}: not checked: {why}", markup=False)
    for e in rep.errors:
        console.print(f"  error: {e}", markup=False)


def failover(
    inventory: Optional[str] = InventoryOpt,
    plan_only: bool = typer.Option(False, "--plan", help="Show what would happen; change nothing."),
    max_share: float = typer.Option(
        0.25, "--max-share", min=0.0, max=1.0, help="Most instances one run takes out, as a share of all."
    ),
    drain_timeout: float = typer.Option(
        120.0, "--drain-timeout", min=0, help="Seconds to wait for requests in flight before stopping."
    ),
    gate_timeout: float = typer.Option(
        600.0, "--gate-timeout", min=1, help="Seconds a moved instance may take to pass its gate."
    ),
    state_dir: Optional[str] = DeployStateDirOpt,
    avoid_host: list[str] = typer.Option(
        [],
        "--avoid-host",
        metavar="HOST",
        help="Do not place moved replicas on HOST (cordoned with the "
        "reason 'failover: --avoid-host (operator)'); repeatable.",
    ),
    as_json: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    rep = run(
        inventory,
        state_dir,
        quiet=as_json,
        fanout=fanout,
        connect_timeout=connect_timeout,
        ask_become_pass=ask_become_pass,
        host_key_policy=host_key_policy,
        max_share=max_share,
        plan_only=plan_only,
        drain_timeout_s=drain_timeout,
        gate_timeout_s=gate_timeout,
        avoid_hosts=tuple(avoid_host),
    )
    if as_json:
        print_json(rep.to_json())
    else:
        show(rep)
    raise typer.Exit(int(rep.exit_code))


def failover_request(
    inventory: Optional[str],
    state_dir: Optional[str],
    *,
    fanout: Optional[int],
    connect_timeout: Optional[float],
    ask_become_pass: bool,
    host_key_policy: Optional[str],
    **options: Any,
) -> FailoverRequest:
    """The workflow's request (``options``: ``ops.failover.failover_request``'s, else its defaults);
    the inventory loaded and the sudo password read here, at the CLI's edge; exits 3 on
    configuration errors."""
    from clusterctl.ops.failover import failover_request as build

    policy = check_host_key_policy(host_key_policy)
    inv = load_inventory(inventory)
    try:
        return build(
            inv,
            user_config(),
            state_dir=state_dir,
            fanout=fanout,
            connect_timeout=connect_timeout,
            host_key_policy=policy,
            become_password=lambda: become_password(ask_become_pass, list(inv.hosts.values()), True),
            **options,
        )
    except ClusterctlError as e:
        fail(str(e))


def run(
    inventory: Optional[str],
    state_dir: Optional[str],
    *,
    quiet: bool,
    fanout: Optional[int],
    connect_timeout: Optional[float],
    ask_become_pass: bool,
    host_key_policy: Optional[str],
    **options: Any,
) -> FailoverReport:
    """One failover run for the CLI; exits 3 on configuration errors."""
    from clusterctl.ops.failover import run as run_failover

    req = failover_request(
        inventory,
        state_dir,
        fanout=fanout,
        connect_timeout=connect_timeout,
        ask_become_pass=ask_become_pass,
        host_key_policy=host_key_policy,
        **options,
    )
    say = None if quiet else (lambda s: err_console.print(s, markup=False, highlight=False))
    try:
        return run_failover(req, on_event=say)
    except ClusterctlError as e:
        fail(str(e))


def register(app: typer.Typer) -> None:
    app.command("failover", help=FAILOVER_HELP)(failover)
