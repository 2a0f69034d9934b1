"""``clusterctl cordon | uncordon | cordons | scale | placement show``: where replicas go.

Everything here reads and writes the control-side deploy state directory
(``--state-dir`` > ``$CLUSTERCTL_STATE_DIR`` > ``<config state_dir>/deploy``;
docs/placement.md) and contacts no host.
"""

from __future__ import annotations

from typing import Any, Optional

import typer

from clusterctl.cli import _complete
from clusterctl.cli._common import (
    InventoryOpt,
    JsonOpt,
    console,
    err_console,
    fail,
    load_inventory,
    print_json,
    user_config,
)
from clusterctl.cli._hosts import AskBecomePassOpt, ConnectTimeoutOpt, FanoutOpt, HostKeyOpt
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

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
    from clusterctl.deploy.state import StateStore, resolve_state_dir

    return StateStore(resolve_state_dir(state_dir, user_config()))


def _load(store: Any) -> Any:
    try:
        return store.load()
    except ClusterctlError as e:
        fail(str(e))


def _gpus(indexes: Any) -> str:
    return ",".join(str(i) for i in indexes)


def _stages(inst: Any) -> dict[str, list[int]]:
    """Host -> GPU indexes of an instance, the head's host first (a replica across hosts has several)."""
    return {h: [g.index for g in inst.placement if g.host == h] for h in dict.fromkeys(g.host for g in inst.placement)}


def cordon(
    target: str = typer.Argument(
        ..., metavar="HOST|HOST:GPU", help="A host, or one GPU of it.", autocompletion=_complete.hosts
    ),
    reason: str = typer.Option(..., "--reason", "-r", help="Why (shown in `cordons` and plans)."),
    inventory: Optional[str] = InventoryOpt,
    state_dir: Optional[str] = StateDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    from clusterctl.deploy.placement import cordon as ops

    inv = load_inventory(inventory)
    if not reason.strip():
        fail("--reason: say why (it is shown to whoever finds the cordon)")
    try:
        tgt = ops.parse_target(inv, target)
        entry, fresh, staying = ops.cordon(state_store(state_dir), tgt, reason.strip())
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json(
            {
                "target": tgt.key,
                "new": fresh,
                "reason": entry.reason,
                "who": entry.who,
                "when": entry.when,
                "replicas_staying": staying,
            }
        )
        return
    console.print(f"{'cordoned' if fresh else 'cordon updated:'} {tgt.key} ({entry.reason}; {entry.who}, {entry.when})")
    if staying:
        console.print(f"replicas still placed there (they stay until moved): {', '.join(staying)}")


def uncordon(
    target: str = typer.Argument(
        ..., metavar="HOST|HOST:GPU", help="A cordoned host or GPU.", autocompletion=_complete.hosts
    ),
    inventory: Optional[str] = InventoryOpt,
    state_dir: Optional[str] = StateDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    from clusterctl.deploy.placement import cordon as ops

    inv = load_inventory(inventory)
    try:
        tgt = ops.parse_target(inv, target)
        removed, left = ops.uncordon(state_store(state_dir), tgt)
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json({"target": tgt.key, "was_cordoned": removed is not None, "still_cordoned_by": left})
        return
    console.print(f"uncordoned {tgt.key}" if removed else f"{tgt.key} was not cordoned")
    if left:
        console.print(f"still cordoned: {', '.join(left)}")


def cordons(
    inventory: Optional[str] = InventoryOpt, state_dir: Optional[str] = StateDirOpt, as_json: bool = JsonOpt
) -> None:
    if inventory:  # the cluster whose cordons these are (else the default inventory's)
        load_inventory(inventory)
    st = _load(state_store(state_dir))
    rows = [{"target": k, "reason": c.reason, "who": c.who, "when": c.when} for k, c in sorted(st.cordons.items())]
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


def _placement_rows(res: Any) -> list[dict[str, Any]]:
    """One row per instance and per unplaced replica: template, replica, host, GPUs, port, state."""
    from clusterctl.deploy.placement.place import replica_number

    rows = []
    for name, inst in res.instances.items():
        if name in res.new or name in res.moved:
            status = "pending (deploy places it)"
        elif name in res.on_cordoned:
            status = f"on cordon: {res.on_cordoned[name]}"
        else:
            status = "placed" if inst.template else "explicit"
        stages = _stages(inst)
        head = next(iter(stages))
        rows.append(
            {
                "template": inst.template,
                "replica": name,
                "host": head,
                "gpus": stages[head],
                "port": inst.port,
                "status": status,
            }
            | ({"stages": [{"host": h, "gpus": g} for h, g in stages.items()]} if len(stages) > 1 else {})
        )
    for name, why in res.unplaced.items():
        tpl = name.rpartition("-")[0]
        rows.append(
            {"template": tpl, "replica": name, "host": None, "gpus": [], "port": None, "status": f"unplaced: {why}"}
        )
    rows.sort(
        key=lambda r: (
            r["template"] is not None,
            r["template"] or "",
            replica_number(r["template"] or "", r["replica"]) or 0,
            r["replica"],
        )
    )
    return rows


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
    from clusterctl.deploy.placement.place import desired_instances

    inv = load_inventory(inventory)
    st = _load(state_store(state_dir))
    try:
        res = desired_instances(inv, st)
    except ClusterctlError as e:
        fail(str(e))
    rows = _placement_rows(res)
    if as_json:
        print_json(rows)
    else:
        _print_rows(rows)
    raise typer.Exit(1 if res.unplaced else 0)


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
    from clusterctl.deploy.placement import scale as ops

    if (replicas is None) == (not reset):
        fail("give either --replicas N or --reset")
    inv = load_inventory(inventory)
    store = state_store(state_dir)
    st = _load(store)
    try:
        sp = ops.plan_scale(inv, st, template, replicas)
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
        ops.record_scale(store, template, replicas)
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
        inv,
        store,
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
    inv: Any,
    store: Any,
    template: str,
    names: list[str],
    *,
    as_json: bool,
    ask_become_pass: bool,
    host_key_policy: Optional[str],
    **opts: Any,
) -> Any:
    """Roll out the replicas ``names`` of ``template`` through the deploy engine (it drains what it
    removes); exits 3 on refusal."""
    from clusterctl.cli._deploy_views import deploy_events, print_deploy_report
    from clusterctl.cli._hosts import host_fleets_and_password
    from clusterctl.deploy.rollout.engine import DeployOptions, PreflightRefused
    from clusterctl.deploy.rollout.batches import parse_serial
    from clusterctl.ops.deploy import DeployRequest, place_scaled, run_deploy, scale_rollout_hosts

    try:
        hosts = scale_rollout_hosts(inv, store, template)
        dopts = DeployOptions(
            instances=",".join(names),
            serial=parse_serial(opts["serial"]),
            max_fail_percentage=opts["max_fail_percentage"],
            force=opts["force"],
            gate_timeout_s=opts["gate_timeout"],
            drain_timeout_s=opts["drain_timeout"],
        )
        make, password = host_fleets_and_password(
            hosts,
            fanout=opts["fanout"],
            connect_timeout=opts["connect_timeout"],
            host_key_policy=host_key_policy,
            ask_become_pass=ask_become_pass,
        )
        request = DeployRequest(inv, hosts, make, str(store.directory), dopts, gateway_password=password)
        place_scaled(request, store, None if as_json else (lambda m: err_console.print(m, markup=False)))
        with deploy_events(not as_json) as events:
            rep = run_deploy(request, events)
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


def _report_scale(sp: Any, as_json: bool, applied: bool) -> None:
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
            f"  + {n}  " + " + ".join(f"{h} GPUs {_gpus(g)}" for h, g in _stages(inst).items()) + f" port {inst.port}"
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
