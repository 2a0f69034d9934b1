"""The plan and report views shared by the bring-up commands (``net apply``, ``node setup``)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

import typer

from clusterctl.cli._common import console
from clusterctl.cli._options import HostsOpt as HostsOpt  # re-exported: net, node and engine import it from here

if TYPE_CHECKING:  # the workflow (and the features under it) loads when a command runs, not at start-up
    from clusterctl.bringup.batch import ApplyReport, OnEvent
    from clusterctl.ops.bringup import BringupPlan, BringupRequest


def stderr_events(enabled: bool) -> OnEvent:
    """An ``on_event`` that writes ``host: message`` lines to stderr (nothing with ``enabled`` false)."""

    def on_event(kind: str, message: str, host: Optional[str]) -> None:
        if enabled:
            sys.stderr.write(f"{host + ': ' if host else ''}{message}\n")

    return on_event


def print_plan(plans: list[Any], title: str, verb: str = "to change", empty: str = "unchanged") -> None:
    """Per host: its changes (``~ item: current -> wanted``), an error row, or ``empty``; then a total."""
    for p in plans:
        if p.error:
            console.print(f"{p.host}: could not plan: {p.error}", markup=False)
        elif not p.changes:
            console.print(f"{p.host}: {empty}", markup=False)
        else:
            console.print(f"{p.host}: {len(p.changes)} {verb}", markup=False)
            for c in p.changes:
                console.print(f"  ~ {c.line()}", markup=False)
        for note in getattr(p, "notes", None) or []:
            console.print(f"  ({note})", markup=False)
    pending = sum(len(p.changes) for p in plans if not p.error)
    hosts = sum(1 for p in plans if p.changes and not p.error)
    bad = sum(1 for p in plans if p.error)
    console.print(
        f"{title} plan: {pending} changes on {hosts} of {len(plans)} hosts"
        + (f"; {bad} hosts could not be read" if bad else ""),
        markup=False,
    )


def print_report(rep: ApplyReport, title: str, done: tuple[str, ...] = ("changed",)) -> None:
    """Per host: its status (with the changes made, or the error); then the counts."""
    for o in rep.outcomes:
        line = f"{o.host}: {o.status}"
        if o.changes and o.status in done:
            line += " (" + "; ".join(c.line() for c in o.changes) + ")"
        if o.error:
            line += f": {o.error}"
        console.print(line, markup=False)
    counts: dict[str, int] = {}
    for o in rep.outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    console.print(
        f"{title}: "
        + ("done" if rep.ok else "FAILED")
        + "; "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + (f"; {rep.stopped}" if rep.stopped else ""),
        markup=False,
    )


# The options both bring-up commands take, and their common start and end.
PlanOpt = typer.Option(False, "--plan", help="Show what differs per host; change nothing.")
DetailedOpt = typer.Option(False, "--detailed-exitcode", help="With --plan: exit 1 when changes are pending.")
SerialOpt = typer.Option(
    None, "--serial", help="Hosts changed at a time: a count, a percentage or a ramp (1,25%,100%) [default: 1]."
)
MaxFailOpt = typer.Option(
    0.0, "--max-fail-percentage", min=0, max=100, help="Failed hosts a batch tolerates, in percent (must be exceeded)."
)


def prepare(
    inventory: Optional[str],
    hosts_pattern: str,
    serial: Optional[str],
    max_fail_percentage: float,
    plan_only: bool,
    detailed_exitcode: bool,
    host_key_policy: Optional[str],
    fanout: Optional[int],
    connect_timeout: Optional[float],
    ask_become_pass: bool,
) -> BringupRequest:
    """Check the options; load the inventory: the workflow's request (``ops/bringup.py``; the user
    config and the sudo password are read once the workflow has checked ``--serial``)."""
    from clusterctl.cli._common import fail, user_config
    from clusterctl.cli._hosts import become_password, check_host_key_policy, select
    from clusterctl.errors import ClusterctlError
    from clusterctl.inventory.loader import load_inventory
    from clusterctl.ops.bringup import BringupRequest

    if detailed_exitcode and not plan_only:
        fail("--detailed-exitcode goes with --plan")
    policy = check_host_key_policy(host_key_policy)
    path, hosts = select(inventory, hosts_pattern)
    try:
        inv = load_inventory(path)
    except ClusterctlError as e:
        fail(str(e))
    return BringupRequest(
        path,
        inv,
        list(hosts),
        load_config=user_config,
        become_password=lambda: become_password(ask_become_pass, hosts, True),
        serial=serial,
        max_fail_percentage=max_fail_percentage,
        fanout=fanout,
        connect_timeout=connect_timeout,
        host_key_policy=policy,
    )


def finish(
    start: Callable[[], BringupPlan],
    plan_only: bool,
    detailed_exitcode: bool,
    as_json: bool,
    title: str,
    *,
    verb: str = "to change",
    empty: str = "unchanged",
    done: tuple[str, ...] = ("changed",),
    plan_json: Optional[dict[str, Any]] = None,
) -> NoReturn:
    """Plan (``start()``, a workflow of ``ops/bringup.py``); with --plan print it and exit (0, 1
    pending with --detailed-exitcode, 2 unreadable); otherwise apply and exit 0 (done) or 2."""
    from clusterctl.cli._common import fail, print_json
    from clusterctl.errors import ClusterctlError
    from clusterctl.exitcodes import ExitCode

    try:
        planned = start()
        plans = planned.plans
        if plan_only:
            if as_json:
                print_json(
                    {
                        "plan": [p.to_dict() for p in plans],
                        **(plan_json or {}),
                        "pending": sum(len(p.changes) for p in plans if not p.error),
                    }
                )
            else:
                print_plan(plans, title, verb, empty)
            if any(p.error for p in plans):
                raise typer.Exit(ExitCode.CRIT)
            raise typer.Exit(ExitCode.WARN if detailed_exitcode and any(p.changes for p in plans) else ExitCode.OK)
        rep = planned.apply()
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json(rep.to_dict())
    else:
        print_report(rep, title, done)
    raise typer.Exit(ExitCode.OK if rep.ok else ExitCode.CRIT)
