"""``clusterctl collect HOSTS -o DIR|FILE.tar.gz``: a bundle for offline triage.

Saves per host the facts JSON, the kernel log, each instance's journal and
/metrics samples, the raw output of the commands that ran, timestamps, and
the inventory; ``clusterctl doctor --from`` analyses it.  Layout: docs/bundles.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import typer

from clusterctl.cli import _complete
from clusterctl.cli._common import InventoryOpt, console, fail
from clusterctl.cli._hosts import AskBecomePassOpt, ConnectTimeoutOpt, DeadlineOpt, FanoutOpt, HostKeyOpt, ProbeSudoOpt
from clusterctl.cli.doctor import live_snapshot
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

HELP = """Save a bundle for offline diagnosis: per host the facts JSON, kernel log,
each vLLM instance's journal, two /metrics samples, the raw output of every
command that ran, timestamps; plus the inventory, its secret-looking values
(HF_TOKEN, *PASSWORD*, ... as `inventory show --json` hides them) replaced by
'***'. Written under a temporary name and renamed, so a half-written bundle
is never left behind; readable by its owner only (0600 files, 0700 folders).

Exit status: 0 when every host answered, 2 when some host gave no facts (the
bundle records why), 3 on usage or inventory errors.

Examples:

  clusterctl collect all -o /tmp/triage-$(date +%F).tar.gz

  clusterctl doctor --from /tmp/triage-2026-11-30.tar.gz
"""


def collect(
    pattern: str = typer.Argument(
        ..., help="Hosts: names, gpu[01-08], @group, label=value, all.", autocompletion=_complete.hosts
    ),
    output: str = typer.Option(..., "--output", "-o", help="Bundle directory, or a FILE.tar.gz."),
    inventory: Optional[str] = InventoryOpt,
    interval: float = typer.Option(
        2.0, "--interval", min=0, help="Seconds between the two /metrics samples (0: one sample)."
    ),
    timeout: float = typer.Option(60.0, "--timeout", "-t", min=1, help="Seconds one host's probe may take."),
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    deadline: Optional[float] = DeadlineOpt,
    sudo: bool = ProbeSudoOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.ops.collect import CollectRequest, check_output, write

    request = CollectRequest(output=output, inventory_path="", pattern=pattern)
    try:
        check_output(request)
    except ClusterctlError as e:
        fail(str(e))
    snap, _inv, path = live_snapshot(
        pattern,
        inventory,
        interval=interval,
        timeout=timeout,
        sudo=sudo,
        ask_become_pass=ask_become_pass,
        fanout=fanout,
        connect_timeout=connect_timeout,
        deadline=deadline,
        host_key_policy=host_key_policy,
        raw_outputs=True,
    )
    try:
        done = write(replace(request, inventory_path=path), snap)
    except ClusterctlError as e:
        fail(str(e))
    console.print(
        f"bundle: {done.dest} ({done.with_facts} hosts with facts, {len(done.missing)} without)", markup=False
    )
    for host, reason in done.missing.items():
        console.print(f"{host}: no facts: {reason}", markup=False)
    raise typer.Exit(ExitCode.CRIT if done.missing else ExitCode.OK)


def register(app: typer.Typer) -> None:
    app.command("collect", help=HELP)(collect)
