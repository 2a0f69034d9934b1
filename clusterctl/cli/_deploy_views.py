"""How deploy's plans, events and reports look on the terminal: shared by ``deploy``, ``rollback``,
``deploy --playbook``, ``scale``/``placement`` and ``failover`` (rendering only; the work is in
:mod:`clusterctl.deploy`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from clusterctl.cli._common import console, err_console, fail, print_json

if TYPE_CHECKING:
    from clusterctl.cli._progress import EventProgress
    from clusterctl.deploy.rollout.engine import DeployReport, PreflightRefused
    from clusterctl.deploy.rollout.plan import Plan


def deploy_events(enabled: bool) -> EventProgress:
    """The deploy renderer (a context manager, and the ``on_event`` callback)."""
    from clusterctl.cli._progress import EventProgress

    return EventProgress("deploy", enabled)


def plan_table(plan: Plan) -> None:
    """One row per host and instance: action, state, digest."""
    from rich.table import Table

    table = Table("host", "instance", "action", "state", "digest", box=None, header_style="bold", pad_edge=False)
    for h in plan.hosts:
        if h.error:
            table.add_row(h.host, "-", "unreadable", h.error, "")
        for i in h.items:
            table.add_row(h.host, i.instance, i.action, i.state or "-", (i.digest or i.old_digest or "")[:12])
    console.print(table)


def print_plan(plan: Plan) -> None:
    """The plan table, the unit diffs and env changes (secrets as ***), and the counts."""
    from clusterctl.deploy.rollout.plan import render_text

    plan_table(plan)
    text = render_text(plan)
    if text:
        console.print(text, markup=False, highlight=False, end="")
    for line in getattr(plan, "placed", []) + getattr(plan, "order", []):
        console.print(line, markup=False)
    c = plan.counts()
    console.print(
        f"plan: {c['new']} new, {c['changed']} changed, {c['start']} to start, {c['remove']} to remove, "
        f"{c['unchanged']} unchanged",
        markup=False,
    )


def refused(e: PreflightRefused, as_json: bool) -> NoReturn:
    """Pre-flight refused: its findings (or JSON), then exit 3."""
    if as_json:
        print_json({"result": "refused", "error": str(e), "preflight": e.report.to_json()})
    else:
        for f in e.report.findings():
            err_console.print(
                f"{f.severity.name} {f.host} {f.subject}: {f.message}" + (f" ({f.action})" if f.action else ""),
                markup=False,
            )
    fail(str(e))


def print_deploy_report(rep: DeployReport) -> None:
    """The deploy report as a table per host, then the run's counts."""
    from rich.table import Table

    table = Table("host", "batch", "status", "gates", "note", box=None, header_style="bold", pad_edge=False)
    for h in rep.hosts.values():
        gates = f"{sum(g.ok for g in h.gates)}/{len(h.gates)}" if h.gates else "-"
        table.add_row(h.host, str(h.batch or "-"), h.status, gates, h.error or "")
    console.print(table, markup=False)
    c = rep.plan.counts()
    console.print(
        f"deploy {rep.run_id}: {rep.result} in {rep.seconds:.1f} s; {len(rep.batches)} batches; "
        f"new {c['new']}, changed {c['changed']}, started {c['start']}, removed {c['remove']}, "
        f"unchanged {c['unchanged']}",
        markup=False,
    )
