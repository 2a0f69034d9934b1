"""``clusterctl deploy --playbook FILE [--plan]``: run or show a playbook (docs/playbooks.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import typer

from clusterctl.cli._common import console, fail, print_json
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.ops.deploy import DeployRequest
from clusterctl.ops.deploy import run_playbook as run

if TYPE_CHECKING:
    from clusterctl.ops.deploy import OnEvent, PlaybookReport


def _steps_table(rep: PlaybookReport) -> None:
    """One row per step (hosts, instance count, batches), then each step's checks, one a line."""
    from rich.table import Table

    table = Table("step", "kind", "hosts", "instances", "batches", box=None, header_style="bold", pad_edge=False)
    checks: list[str] = []
    for sp in rep.steps:
        s = sp.step
        batches = " | ".join(",".join(b) for b in sp.batches) if sp.batches else "-"
        table.add_row(s.name, s.kind, ",".join(sp.hosts) or "-", str(len(sp.instances)), batches)
        if s.kind == "exec":
            checks.append(f"  {s.name}: {s.command!r} -> exit status {s.expect_rc}")
        checks += [f"  {s.name}: {g.describe()} (within {g.timeout_s:g} s)" for g in s.gates]
    console.print(table, markup=False)
    if checks:
        console.print("checks:\n" + "\n".join(checks), markup=False, highlight=False)


def _outcomes(rep: PlaybookReport) -> None:
    for o in rep.outcomes:
        console.print(f"step {o.name} ({o.kind}): {o.status}" + (f": {o.note}" if o.note else ""), markup=False)


def run_playbook(
    path: str,
    request: DeployRequest,
    *,
    as_json: bool,
    detailed_exitcode: bool,
    on_event: OnEvent,
) -> NoReturn:
    """Load ``path``, then show its plan (``opts.plan_only``) or run it; always exits.

    Exit status as ``deploy``: 0 ok / nothing / plan shown, 1 plan with
    ``--detailed-exitcode`` and changes pending, 2 a step or batch failed (or a
    host could not be read), 3 a bad playbook, pre-flight refused, lock held.
    """
    from clusterctl.cli._deploy_views import print_deploy_report, print_plan, refused
    from clusterctl.deploy.rollout.engine import PreflightRefused

    opts = request.options
    try:
        book, rep = run(request, path, on_event)
    except PreflightRefused as e:
        refused(e, as_json)
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json(rep.to_dict())
    else:
        console.print(f"playbook {book.name} ({path})", markup=False)
        _steps_table(rep)
        if opts.plan_only:
            print_plan(rep.deploy.plan)
        else:
            _outcomes(rep)
            print_deploy_report(rep.deploy)
    plan = rep.deploy.plan
    if opts.plan_only:
        if any(h.error for h in plan.hosts):
            raise typer.Exit(ExitCode.CRIT)
        raise typer.Exit(ExitCode.WARN if detailed_exitcode and plan.pending else ExitCode.OK)
    raise typer.Exit(ExitCode.OK if rep.ok else ExitCode.CRIT)
