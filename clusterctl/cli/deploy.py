"""``clusterctl deploy`` and ``clusterctl rollback``: the rollout of vLLM instances (docs/deploy.md)."""

from __future__ import annotations

from typing import Optional

import typer

from clusterctl.cli._common import console, fail, print_json
from clusterctl.cli._hosts import (
    become_password,
    check_host_key_policy,
    deploy_state_dir,
    fleets,
    gateway_password,
    select,
)
from clusterctl.cli._options import (
    AskBecomePassOpt,
    ConnectTimeoutOpt,
    DeployStateDirOpt,
    FanoutOpt,
    HostKeyOpt,
    HostsOpt,
    InventoryOpt,
    JsonOpt,
)
from clusterctl.cli._deploy_views import deploy_events, print_deploy_report, print_plan, refused
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

DEPLOY_HELP = """Render every instance's systemd unit, show what differs on each host, then
roll it out in batches behind health gates.

Per host: new, changed (unit diff; env with secrets as ***), unchanged, to
remove. --plan prints that and changes nothing. Otherwise, under a deploy lock
on the target hosts: stage missing model versions, drain and restart only
what changed, start what is new, remove what is no longer wanted; each batch
passes its gate (unit active, /health 200, /v1/models lists the model, a
one-token completion) or is rolled back and the rollout stops (hosts not
reached are untouched). Release gates (--gate drift[:BASELINE], --gate
bench:REFERENCE) then run on the batch's instances; a failure rolls the batch
back the same way, except an inconclusive one (bench: untrusted or too noisy
numbers, no regression shown): the batch keeps the change and the rollout
pauses there (result paused, exit 1). Batches are over hosts, with Ansible's semantics:
--serial 1,25%,100% (count, percentage or ramp; the last value repeats), the
first batch is the canary; --max-fail-percentage N must be exceeded to fail a
batch (default 0: any failure). --prestage first stages the versions the
rollout needs on every target host without switching, and reads up to
--warm-budget of each per host into the page cache, before the first batch
stops anything: the batches then only switch, restart and load from memory.

Exit status: 0 done (or nothing to do; --plan), 1 the rollout paused on an
inconclusive release gate (or, with --plan --detailed-exitcode, changes are
pending), 2 a batch failed (rolled back)
or some host failed or could not be read, 3 usage, inventory or secret
errors, pre-flight refused, or the lock is held by another deploy.

Examples:

  clusterctl deploy --plan -i /var/lib/clusterctl-lab/inventory.yaml

  clusterctl deploy --serial 1,25%,100% --max-fail-percentage 10

  clusterctl deploy --serial 1,25%,100% --prestage --warm-budget 96G

  clusterctl deploy --instances 'qwen-*' --hosts 'gpu[01-04]' --gate-timeout 900 --json

  clusterctl deploy --serial 1,100% --record-baseline previous --gate drift --gate bench:qwen-7

  clusterctl deploy --playbook playbooks/rolling-engine-upgrade.yaml --plan

  clusterctl deploy --surge --plan        # which replicas start beside the old one on spare GPUs
"""

ROLLBACK_HELP = """Put back the unit, env and model version that the last deploy replaced
(/var/lib/clusterctl/deploy/previous/ on each host) and restart them; an
instance that deploy created is stopped and removed. The current files are
kept in exchange, so a second rollback goes forward again. Restored instances
must pass the deploy gates. Exit 0 done or nothing to roll back, 2 a host or
gate failed, 3 usage errors or lock held.

Examples:

  clusterctl rollback --instances 'qwen-*' -i /var/lib/clusterctl-lab/inventory.yaml

  clusterctl rollback --hosts gpu03 --json
"""


def deploy(
    inventory: Optional[str] = InventoryOpt,
    plan_only: bool = typer.Option(False, "--plan", help="Show the difference per host; change nothing."),
    detailed_exitcode: bool = typer.Option(
        False, "--detailed-exitcode", help="With --plan: exit 1 when changes are pending."
    ),
    instances: Optional[str] = typer.Option(
        None, "--instances", help="Only instances matching these comma-separated globs."
    ),
    hosts_pattern: str = HostsOpt,
    serial: Optional[str] = typer.Option(
        None, "--serial", help="Batch sizes: a count, a percentage or a ramp (1,25%,100%)."
    ),
    max_fail_percentage: float = typer.Option(
        0.0,
        "--max-fail-percentage",
        min=0,
        max=100,
        help="Failed hosts a batch tolerates, in percent (must be exceeded).",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Deploy even when pre-flight refuses (each refused instance and the checks skipped are named).",
    ),
    gate_timeout: float = typer.Option(
        600.0, "--gate-timeout", min=1, help="Seconds an instance may take to pass its gate."
    ),
    drain_timeout: float = typer.Option(
        120.0, "--drain-timeout", min=0, help="Seconds to wait for requests in flight before a restart."
    ),
    break_lock: bool = typer.Option(
        False, "--break-lock", help="Take over another deploy's lock (only when it is dead)."
    ),
    state_dir: Optional[str] = DeployStateDirOpt,
    playbook: Optional[str] = typer.Option(
        None,
        "--playbook",
        metavar="FILE",
        help="Run the steps of a playbook (playbooks/*.yaml) instead of one rollout.",
    ),
    gate: list[str] = typer.Option(
        [],
        "--gate",
        metavar="drift[:BASELINE]|bench:REFERENCE",
        help="Release gate after each batch's health gates (repeatable; docs/deploy.md 'Release gates').",
    ),
    bench_tolerance: float = typer.Option(
        0.1, "--bench-tolerance", min=0, help="Regression the bench gate allows (0.1 = 10 %)."
    ),
    record_baseline: Optional[str] = typer.Option(
        None,
        "--record-baseline",
        metavar="NAME",
        help="Before applying, record drift baseline NAME from a running instance about to change.",
    ),
    prestage: bool = typer.Option(
        False,
        "--prestage",
        help="Before the first batch: stage the needed versions on every target "
        "host without switching, and warm them (docs/release.md).",
    ),
    warm_budget: Optional[str] = typer.Option(
        None,
        "--warm-budget",
        metavar="SIZE",
        help="With --prestage: page-cache bytes per host (e.g. 96G) [default: the whole version].",
    ),
    surge: bool = typer.Option(
        False,
        "--surge",
        help="Start each changed replica's new version beside the "
        "old on spare GPUs first; in place where none "
        "(docs/deploy.md 'Surge').",
    ),
    surge_strict: bool = typer.Option(
        False, "--surge-strict", help="As --surge, but refuse the deploy (exit 3) when some change cannot surge."
    ),
    as_json: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.deploy.rollout.engine import DeployOptions, PreflightRefused
    from clusterctl.stage.run import parse_size
    from clusterctl.deploy.rollout.surge import step_line
    from clusterctl.deploy.rollout.release_gates import parse_gates
    from clusterctl.ops.deploy import DeployRequest, run_deploy
    from clusterctl.deploy.rollout.lock import LockHeld
    from clusterctl.deploy.rollout.batches import parse_serial
    from clusterctl.inventory.loader import load_inventory as _load

    policy = check_host_key_policy(host_key_policy)
    if warm_budget is not None and not prestage:
        fail("--warm-budget goes with --prestage (to warm a version already staged: clusterctl stage warm)")
    if prestage and playbook is not None:
        fail("--prestage does not go with --playbook: give the playbook a stage step")
    path, hosts = select(inventory, hosts_pattern)
    try:
        inv = _load(path, force=force)
        opts = DeployOptions(
            instances=instances,
            serial=parse_serial(serial),
            max_fail_percentage=max_fail_percentage,
            force=force,
            gate_timeout_s=gate_timeout,
            drain_timeout_s=drain_timeout,
            break_lock=break_lock,
            plan_only=plan_only,
            prestage=prestage,
            warm_budget=None if warm_budget is None else parse_size(warm_budget, "--warm-budget"),
            surge="strict" if surge_strict else "auto" if surge else "",
        )
        release = parse_gates(gate, bench_tolerance=bench_tolerance, record_baseline=record_baseline)
    except ClusterctlError as e:
        fail(str(e))
    sd = str(deploy_state_dir(state_dir))
    password = become_password(ask_become_pass, hosts, True)
    make = fleets(fanout=fanout, connect_timeout=connect_timeout, become_password=password, host_key_policy=policy)
    request = DeployRequest(inv, hosts, make, sd, opts, release, gateway_password(password))
    if playbook is not None:
        from clusterctl.cli.deploy_playbook import run_playbook

        if serial is not None:
            fail("--serial does not go with --playbook: each canary, rollout and exec step has its own serial")
        if release.any:
            fail("--gate / --record-baseline do not go with --playbook: give the playbook drift: and bench: gates")
        if opts.surge:
            fail("--surge does not go with --playbook")
        with deploy_events(not as_json) as events:
            run_playbook(
                playbook,
                request,
                as_json=as_json,
                detailed_exitcode=detailed_exitcode,
                on_event=events,
            )
    try:
        with deploy_events(not as_json) as events:
            rep = run_deploy(request, events)
    except PreflightRefused as e:
        refused(e, as_json)
    except LockHeld as e:
        fail(str(e))
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json(rep.to_dict())
    elif plan_only:
        print_plan(rep.plan)
        for step in rep.surge or []:
            console.print(f"surge: {step_line(step)}", markup=False)
    else:
        for step in rep.surge or []:
            console.print(f"surge: {step_line(step)}", markup=False)
        print_deploy_report(rep)
    if plan_only:
        if any(h.error for h in rep.plan.hosts):
            raise typer.Exit(ExitCode.CRIT)  # an unread host: the plan is incomplete
        raise typer.Exit(ExitCode.WARN if detailed_exitcode and rep.plan.pending else ExitCode.OK)
    raise typer.Exit(ExitCode.OK if rep.ok else ExitCode.WARN if rep.result == "paused" else ExitCode.CRIT)


def rollback(
    inventory: Optional[str] = InventoryOpt,
    instances: Optional[str] = typer.Option(
        None, "--instances", help="Only instances matching these comma-separated globs."
    ),
    hosts_pattern: str = HostsOpt,
    gate_timeout: float = typer.Option(
        600.0, "--gate-timeout", min=1, help="Seconds an instance may take to pass its gate."
    ),
    break_lock: bool = typer.Option(
        False, "--break-lock", help="Take over another deploy's lock (only when it is dead)."
    ),
    drain_timeout: float = typer.Option(
        120.0, "--drain-timeout", min=0, help="Seconds to wait for requests in flight before restarting an instance."
    ),
    state_dir: Optional[str] = typer.Option(
        None, "--state-dir", help="Deploy state directory (the audit log is written there)."
    ),
    as_json: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.cli._common import load_inventory
    from clusterctl.ops.deploy import RollbackRequest, run_rollback

    policy = check_host_key_policy(host_key_policy)
    _, hosts = select(inventory, hosts_pattern)
    inv = load_inventory(inventory)
    sd = str(deploy_state_dir(state_dir))
    password = become_password(ask_become_pass, hosts, True)
    make = fleets(fanout=fanout, connect_timeout=connect_timeout, become_password=password, host_key_policy=policy)
    request = RollbackRequest(
        inv,
        hosts,
        make,
        sd,
        instances=instances,
        gate_timeout_s=gate_timeout,
        break_lock=break_lock,
        drain_timeout_s=drain_timeout,
        gateway_password=gateway_password(password),
    )
    try:
        with deploy_events(not as_json) as events:
            rep = run_rollback(request, events)
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json(rep.to_dict())
    else:
        for h, d in rep.hosts.items():
            console.print(
                f"{h}: {d['status']} restored {', '.join(d.get('restored', [])) or '-'}"
                + (f" removed {', '.join(d['removed'])}" if d.get("removed") else "")
                + (f" ({d['error']})" if d.get("error") else ""),
                markup=False,
            )
        console.print(f"rollback {rep.run_id}: {rep.result} in {rep.seconds:.1f} s", markup=False)
    raise typer.Exit(ExitCode.OK if rep.ok else ExitCode.CRIT)


def register(app: typer.Typer) -> None:
    app.command("deploy", help=DEPLOY_HELP)(deploy)
    app.command("rollback", help=ROLLBACK_HELP)(rollback)
