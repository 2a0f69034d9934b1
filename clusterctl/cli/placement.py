"""``clusterctl cordon | uncordon | cordons | scale | placement show``: where replicas go.

Everything here reads and writes the control-side deploy state directory
(``--state-dir`` > ``$CLUSTERCTL_STATE_DIR`` > ``<config state_dir>/deploy``;
docs/placement.md) and contacts no host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import typer

from clusterctl.cli import _complete
from clusterctl.cli._common import console, err_console, fail, load_inventory, print_json
from clusterctl.cli._hosts import deploy_state_dir
from clusterctl.cli._options import AskBecomePassOpt, ConnectTimeoutOpt, FanoutOpt, HostKeyOpt, InventoryOpt, JsonOpt
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

if TYPE_CHECKING:  # the workflow (and the deploy package under it) loads when a command runs
    from clusterctl.deploy.rollout.engine import DeployReport
    from clusterctl.inventory.model import Inventory
    from clusterctl.ops.placement import PlacementRequest, ScalePlan

StateDirOpt = typer.Option(
    None,
    "--state-dir",
    metavar="DIR",
    help="Deploy state directory [default: $CLUSTERCTL_STATE_DIR, else <config state_dir>/deploy].",
)

placement_app = typer.Typer(
    help="Show where template replicas are placed.\n\nExample:\n\n  clusterctl placement show --json",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def state_store(state_dir: Optional[str]) -> Any:
    """The deploy state store of ``--state-dir`` (else the default deploy state directory)."""
    from clusterctl.ops.placement import PlacementRequest

    return PlacementRequest(deploy_state_dir(state_dir)).store


def _request(inv: Inventory, state_dir: Optional[str]) -> PlacementRequest:
    from clusterctl.ops.placement import PlacementRequest

    return PlacementRequest(deploy_state_dir(state_dir), inv)


def _gpus(indexes: Any) -> str:
    return ",".join(str(i) for i in indexes)


def cordon(
    target: str = typer.Argument(
        ..., metavar="HOST|HOST:GPU", help="A host, or one GPU of it.", autocompletion=_complete.hosts
    ),
    reason: str = typer.Option(..., "--reason", "-r", help="Why (shown in `cordons` and plans)."),
    inventory: Optional[str] = InventoryOpt,
    state_dir: Optional[str] = StateDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    from clusterctl.ops import placement as ops

    inv = load_inventory(inventory)
    if not reason.strip():
        fail("--reason: say why (it is shown to whoever finds the cordon)")
    try:
        done = ops.cordon(_request(inv, state_dir), target, reason)
    except ClusterctlError as e:
        fail(str(e))
    entry = done.entry
    if as_json:
        print_json(
            {
                "target": done.target,
                "new": done.new,
                "reason": entry.reason,
                "who": entry.who,
                "when": entry.when,
                "replicas_staying": done.staying,
            }
        )
        return
    console.print(
        f"{'cordoned' if done.new else 'cordon updated:'} {done.target} ({entry.reason}; {entry.who}, {entry.when})"
    )
    if done.staying:
        console.print(f"replicas still placed there (they stay until moved): {', '.join(done.staying)}")


def uncordon(
    target: str = typer.Argument(
        ..., metavar="HOST|HOST:GPU", help="A cordoned host or GPU.", autocompletion=_complete.hosts
    ),
    inventory: Optional[str] = InventoryOpt,
    state_dir: Optional[str] = StateDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    from clusterctl.ops import placement as ops

    inv = load_inventory(inventory)
    try:
        done = ops.uncordon(_request(inv, state_dir), target)
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json({"target": done.target, "was_cordoned": done.removed is not None, "still_cordoned_by": done.left})
        return
    console.print(f"uncordoned {done.target}" if done.removed else f"{done.target} was not cordoned")
    if done.left:
        console.print(f"still cordoned: {', '.join(done.left)}")


def cordons(
    inventory: Optional[str] = InventoryOpt, state_dir: Optional[str] = StateDirOpt, as_json: bool = JsonOpt
) -> None:
    from clusterctl.ops import placement as ops

    if inventory:  # the cluster whose cordons these are (else the default inventory's)
        load_inventory(inventory)
    try:
        rows = ops.cordons(ops.PlacementRequest(deploy_state_dir(state_dir)))
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no cordons")
        return
    from rich.table import Table

    table = Table("target", "reason", "who", "when (UTC)", box=None, pad_edge=False)
    for r in rows:
        table.add_row(r["target"], r["reason"], r["who"], r["when"])
    console.print(table)


@placement_app.command(
    "show",
    help="""Print every instance with its host, GPUs and port, by template.

Recorded replicas show as placed; replicas the next deploy would place (scale
up, new template) as pending, where placement would put them now without
the hosts' GPU topology (deploy reads it); replicas that cannot fit as
unplaced with the reason; replicas on a cordoned host or GPU with the cordon.
Reads only the inventory and the deploy state; contacts no host.
Exit status: 0 every replica has a place, 1 some replica is unplaced,
3 usage, inventory or state errors.

Example:

  clusterctl placement show -i /var/lib/clusterctl-lab/inventory.yaml --json
""",
)
def show(
    inventory: Optional[str] = InventoryOpt, state_dir: Optional[str] = StateDirOpt, as_json: bool = JsonOpt
) -> None:
    from clusterctl.ops import placement as ops

    inv = load_inventory(inventory)
    try:
        placed = ops.show(_request(inv, state_dir))
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json(placed.rows)
    else:
        _print_rows(placed.rows)
    raise typer.Exit(placed.code)


def _print_rows(rows: list[dict[str, Any]]) -> None:
    if not rows:
        console.print("no instances or templates in the inventory")
        return
    from rich.table import Table

    table = Table("template", "replica", "host", "GPUs", "port", "status", box=None, pad_edge=False)
    for i, r in enumerate(rows):
        last = i + 1 == len(rows) or rows[i + 1]["template"] != r["template"]
        stages = r.get("stages") or [r]  # a replica across hosts: each stage's host and GPUs
        table.add_row(
            r["template"] or "(explicit)",
            r["replica"],
            " ".join(s["host"] or "-" for s in stages),
            " ".join(_gpus(s["gpus"]) or "-" for s in stages),
            str(r["port"] or "-"),
            r["status"],
            end_section=last,
        )
    console.print(table)


def scale(
    template: str = typer.Argument(
        ..., metavar="TEMPLATE", help="A template of the inventory.", autocompletion=_complete.templates
    ),
    replicas: Optional[int] = typer.Option(None, "--replicas", "-n", min=0, help="The new replica count."),
    reset: bool = typer.Option(False, "--reset", help="Drop the override: back to the inventory's replicas."),
    plan: bool = typer.Option(False, "--plan", help="Show what would be added and removed; change nothing."),
    record_only: bool = typer.Option(
        False, "--record-only", help="Record the new count; let the next `clusterctl deploy` apply it."
    ),
    serial: Optional[str] = typer.Option(None, "--serial", help="Batch sizes for the rollout (1,25%,100%)."),
    max_fail_percentage: float = typer.Option(
        0.0, "--max-fail-percentage", min=0, max=100, help="Failed hosts a batch tolerates, in percent."
    ),
    gate_timeout: float = typer.Option(
        600.0, "--gate-timeout", min=1, help="Seconds a new replica may take to pass its gate."
    ),
    drain_timeout: float = typer.Option(
        120.0, "--drain-timeout", min=0, help="Seconds a removed replica's requests may take to finish."
    ),
    force: bool = typer.Option(False, "--force", help="Deploy even when pre-flight refuses."),
    inventory: Optional[str] = InventoryOpt,
    state_dir: Optional[str] = StateDirOpt,
    as_json: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.ops import placement as ops

    if (replicas is None) == (not reset):
        fail("give either --replicas N or --reset")
    inv = load_inventory(inventory)
    request = _request(inv, state_dir)
    try:
        sp = ops.plan_scale(request, template, replicas)
    except ClusterctlError as e:
        fail(str(e))
    if not plan and not sp.fits:
        _report_scale(sp, as_json, applied=False)
        fail(
            f"{len(sp.unplaced)} replica(s) of {template} cannot be placed; nothing changed "
            f"(cordons, explicit instances and other templates leave too few GPUs)"
        )
    if plan:
        _report_scale(sp, as_json, applied=False)
        return
    try:
        ops.record_scale(request, template, replicas)
    except ClusterctlError as e:
        fail(str(e))
    if record_only or not (sp.added or sp.removed):
        _report_scale(sp, as_json, applied=True)
        if record_only and not as_json:
            console.print(
                f"recorded; apply with: clusterctl deploy --instances '{template}-*' "
                "(removed replicas are drained first)"
            )
        return
    if not as_json:
        _report_scale(sp, False, applied=True)
    rep = _deploy_template(
        request,
        template,
        ops.replica_names(sp),
        serial=serial,
        max_fail_percentage=max_fail_percentage,
        gate_timeout=gate_timeout,
        drain_timeout=drain_timeout,
        force=force,
        fanout=fanout,
        connect_timeout=connect_timeout,
        ask_become_pass=ask_become_pass,
        host_key_policy=host_key_policy,
        as_json=as_json,
    )
    if as_json:
        print_json({**_scale_json(sp, True), "deploy": rep.to_dict()})
    raise typer.Exit(ExitCode.OK if rep.ok else ExitCode.CRIT)


def _deploy_template(
    request: PlacementRequest,
    template: str,
    names: list[str],
    *,
    as_json: bool,
    ask_become_pass: bool,
    host_key_policy: Optional[str],
    **opts: Any,
) -> DeployReport:
    """Roll out the replicas ``names`` of ``template`` through the deploy engine (it drains what it
    removes); exits 3 on refusal."""
    from clusterctl.cli._deploy_views import deploy_events, print_deploy_report
    from clusterctl.cli._hosts import host_fleets_and_password
    from clusterctl.deploy.rollout.engine import PreflightRefused
    from clusterctl.ops import placement as ops
    from clusterctl.ops.deploy import run_deploy

    try:
        hosts = ops.scale_hosts(request, template)
        make, password = host_fleets_and_password(
            hosts,
            fanout=opts["fanout"],
            connect_timeout=opts["connect_timeout"],
            host_key_policy=host_key_policy,
            ask_become_pass=ask_become_pass,
        )
        rollout = ops.ScaleRollout(
            hosts,
            make,
            serial=opts["serial"],
            max_fail_percentage=opts["max_fail_percentage"],
            force=opts["force"],
            gate_timeout_s=opts["gate_timeout"],
            drain_timeout_s=opts["drain_timeout"],
            gateway_password=password,
        )
        deploy = ops.scale_deploy(
            request, names, rollout, None if as_json else (lambda m: err_console.print(m, markup=False))
        )
        with deploy_events(not as_json) as events:
            rep = run_deploy(deploy, events)
    except PreflightRefused as e:
        fail(f"{e}; the new count is recorded: `clusterctl scale {template} --replicas N` to change it")
    except ClusterctlError as e:
        fail(f"{e}; the new count is recorded: `clusterctl deploy --instances '{template}-*'` retries")
    if not as_json:
        print_deploy_report(rep)
    return rep


def _scale_json(sp: Any, applied: bool) -> dict[str, Any]:
    where = sp.result.instances
    return {
        "template": sp.template,
        "before": sp.before,
        "after": sp.after,
        "recorded": applied,
        "added": [
            {
                "replica": n,
                "host": where[n].placement[0].host,
                "gpus": [g.index for g in where[n].placement],
                "port": where[n].port,
            }
            for n in sp.added
        ],
        "removed": sp.removed,
        "unplaced": sp.unplaced,
    }


def _report_scale(sp: ScalePlan, as_json: bool, applied: bool) -> None:
    from clusterctl.ops.placement import stages

    where = sp.result.instances
    if as_json:
        print_json(_scale_json(sp, applied))
        return
    console.print(
        f"{sp.template}: {sp.before} -> {sp.after} replicas" + ("" if applied else " (plan: nothing recorded)")
    )
    for n in sp.added:
        inst = where[n]
        console.print(
            f"  + {n}  " + " + ".join(f"{h} GPUs {_gpus(g)}" for h, g in stages(inst).items()) + f" port {inst.port}"
        )
    for n in sp.removed:
        console.print(f"  - {n}  (drained, then stopped)")
    for n, why in sp.unplaced.items():
        console.print(f"  ! {n}  cannot be placed: {why}")
    if not (sp.added or sp.removed or sp.unplaced):
        console.print("  nothing to change")


def register(app: typer.Typer) -> None:
    app.command(
        "cordon",
        help="""Keep new replicas off a host or one GPU (HOST or HOST:GPU).

Replicas already there stay until moved (gateway failover moves them; `plan`
shows them). Nothing automatic ever uncordons: only `clusterctl uncordon`.
Recorded with the reason, user@hostname and the time (UTC) in cordons.json.
Exit status: 0 recorded, 3 unknown host or GPU, inventory or state errors.

Example:

  clusterctl cordon gpu03:5 --reason "XID 79, RMA ticket 4411"
""",
    )(cordon)
    app.command(
        "uncordon",
        help="""Remove an operator's cordon on a host or GPU (HOST or HOST:GPU).

Uncordoning a host leaves its GPUs' own cordons (they are listed); replicas
do not move back by themselves. Exit status: 0 (also when it was not
cordoned), 3 unknown host or GPU, inventory or state errors.

Example:

  clusterctl uncordon gpu03:5
""",
    )(uncordon)
    app.command(
        "cordons",
        help="""List cordons: target, reason, who, when.

Exit status: 0, 3 state errors.

Example:

  clusterctl cordons --json
""",
    )(cordons)
    app.command(
        "scale",
        help="""Set a template's replica count (kept as an override in the deploy state), then deploy it.

Scaling up adds the lowest missing replica numbers on free uncordoned GPUs;
scaling down removes the highest-numbered replicas; nothing else moves.
The count is recorded, then the template's replicas are rolled out through the deploy
engine over the template's hosts (batches, gates, rollback as `deploy`;
removed replicas are drained first). --plan shows the change and records
nothing (no host is contacted); --record-only records it for the next
`clusterctl deploy`. Refused (exit 3, nothing recorded) when a new replica
cannot be placed. --reset drops the override (back to the inventory's replicas).
Exit status: 0 done, 2 the rollout failed (the count stays recorded),
3 usage, unknown template, no room, pre-flight refused, inventory or state errors.

Examples:

  clusterctl scale qwen-pool --replicas 12 --plan

  clusterctl scale qwen-pool --replicas 12
""",
    )(scale)
    app.add_typer(placement_app, name="placement")
