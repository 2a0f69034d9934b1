"""``clusterctl net apply``: the inventory's RoCE QoS profile on every RoCE NIC (docs/bring-up.md)."""

from __future__ import annotations

import sys
from typing import Any, Optional

import typer

from clusterctl.cli._common import InventoryOpt, JsonOpt, console, fail, print_json, user_config
from clusterctl.cli._hosts import (AskBecomePassOpt, ConnectTimeoutOpt, FanoutOpt, HostKeyOpt, become_password,
                                   check_host_key_policy, select)
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

app = typer.Typer(help="The data network: apply the inventory's RoCE QoS profile to the NICs.",
                  no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]},
                  rich_markup_mode=None)

APPLY_HELP = """Make every RoCE NIC match the inventory's fabric profile: trust mode, PFC on
the RoCE priority only, the RoCE DSCP on that priority, ECN (notification and
reaction point) on it, the CNP DSCP, the global RoCE traffic class (4 x DSCP +
2) and 802.3x global pause off. mlnx_qos where the node has it, iproute2 dcb
otherwise; ECN, CNP DSCP and the traffic class through MLNX_OFED's sysfs where
it exists.

The settings persist: each host gets /etc/clusterctl/roce-qos.sh (the whole
profile, idempotent) run by roce-qos.service (oneshot, enabled), so they come
back after a reboot; applying is restarting that unit.

--plan reads each host (the probe doctor uses) and prints what differs, host
by host; nothing is changed. Otherwise only hosts with differences are
changed, --serial hosts at a time (default 1; counts, percentages or a ramp as
deploy), and each is re-read and checked by doctor's roce.qos analyzer
afterwards; a batch with more failures than --max-fail-percentage (default 0)
stops the run. A second apply finds nothing to change.

Exit status: 0 done or nothing to do (--plan: also with changes pending), 1
with --plan --detailed-exitcode when changes are pending, 2 a host failed or
could not be read, 3 usage or inventory errors.

Examples:

  clusterctl net apply --plan -i /var/lib/clusterctl-lab/inventory.yaml

  clusterctl net apply --plan --detailed-exitcode --hosts 'gpu[01-08]'

  clusterctl net apply --serial 1,25%,100% --max-fail-percentage 10 --json
"""


def _events(enabled: bool) -> Any:
    def on_event(kind: str, message: str, host: Optional[str]) -> None:
        if enabled:
            sys.stderr.write(f"{host + ': ' if host else ''}{message}\n")
    return on_event


def print_plan(plans: list[Any]) -> None:
    for p in plans:
        if p.error:
            console.print(f"{p.host}: could not plan: {p.error}", markup=False)
        elif not p.changes:
            console.print(f"{p.host}: unchanged", markup=False)
        else:
            console.print(f"{p.host}: {len(p.changes)} to change", markup=False)
            for c in p.changes:
                console.print(f"  ~ {c.line()}", markup=False)
    pending = sum(len(p.changes) for p in plans if not p.error)
    hosts = sum(1 for p in plans if p.changes and not p.error)
    console.print(f"net apply plan: {pending} changes on {hosts} of {len(plans)} hosts"
                  + (f"; {sum(1 for p in plans if p.error)} hosts could not be read" if any(p.error for p in plans)
                     else ""), markup=False)


def print_report(rep: Any) -> None:
    for o in rep.outcomes:
        line = f"{o.host}: {o.status}"
        if o.changes and o.status == "changed":
            line += " (" + "; ".join(c.line() for c in o.changes) + ")"
        if o.error:
            line += f": {o.error}"
        console.print(line, markup=False)
    counts: dict[str, int] = {}
    for o in rep.outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    console.print("net apply: " + ("done" if rep.ok else "FAILED") + "; "
                  + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                  + (f"; {rep.stopped}" if rep.stopped else ""), markup=False)


@app.command("apply", help=APPLY_HELP)
def apply(inventory: Optional[str] = InventoryOpt,
          plan_only: bool = typer.Option(False, "--plan", help="Show what differs per host; change nothing."),
          detailed_exitcode: bool = typer.Option(False, "--detailed-exitcode",
                                                 help="With --plan: exit 1 when changes are pending."),
          hosts_pattern: str = typer.Option("all", "--hosts", "-H", help="Hosts: names, gpu[01-04], @group, label=value."),
          serial: Optional[str] = typer.Option(None, "--serial", help="Hosts changed at a time: a count, a "
                                                                      "percentage or a ramp (1,25%,100%) [default: 1]."),
          max_fail_percentage: float = typer.Option(0.0, "--max-fail-percentage", min=0, max=100,
                                                    help="Failed hosts a batch tolerates, in percent (must be exceeded)."),
          as_json: bool = JsonOpt,
          fanout: Optional[int] = FanoutOpt,
          connect_timeout: Optional[float] = ConnectTimeoutOpt,
          ask_become_pass: bool = AskBecomePassOpt,
          host_key_policy: Optional[str] = HostKeyOpt) -> None:
    from clusterctl.bringup.netqos import NetApply
    from clusterctl.deploy.rollout import parse_serial
    from clusterctl.fleet.factory import fleet_factory
    from clusterctl.inventory.loader import load_inventory as _load

    if detailed_exitcode and not plan_only:
        fail("--detailed-exitcode goes with --plan")
    policy = check_host_key_policy(host_key_policy)
    path, hosts = select(inventory, hosts_pattern)
    try:
        inv = _load(path)
        steps = parse_serial(serial) or ["1"]
    except ClusterctlError as e:
        fail(str(e))
    if inv.fabric.kind != "roce":
        fail(f"{path}: fabric.kind is {inv.fabric.kind}: net apply sets RoCE QoS only")
    make = fleet_factory(user_config(), fanout=fanout, connect_timeout=connect_timeout, host_key_policy=policy,
                         become_password=become_password(ask_become_pass, hosts, True))
    runner = NetApply(inv, hosts, make, serial=steps, max_fail_percentage=max_fail_percentage,
                      on_event=_events(not as_json))
    try:
        plans = runner.plan()
        if plan_only:
            if as_json:
                print_json({"plan": [p.to_dict() for p in plans],
                            "pending": sum(len(p.changes) for p in plans if not p.error)})
            else:
                print_plan(plans)
            if any(p.error for p in plans):
                raise typer.Exit(ExitCode.CRIT)
            raise typer.Exit(ExitCode.WARN if detailed_exitcode and any(p.changes for p in plans) else ExitCode.OK)
        rep = runner.run(plans)
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json(rep.to_dict())
    else:
        print_report(rep)
    raise typer.Exit(ExitCode.OK if rep.ok else ExitCode.CRIT)
