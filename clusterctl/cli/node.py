"""``clusterctl node setup``: converge the node prerequisites of instance units (docs/bring-up.md)."""

from __future__ import annotations

from typing import Optional

import typer

from clusterctl.cli._common import InventoryOpt, JsonOpt
from clusterctl.cli._hosts import AskBecomePassOpt, ConnectTimeoutOpt, FanoutOpt, HostKeyOpt
from clusterctl.cli._plan_views import (
    DetailedOpt,
    HostsOpt,
    MaxFailOpt,
    PlanOpt,
    SerialOpt,
    finish,
    prepare,
    stderr_events,
)

app = typer.Typer(
    help="Node prerequisites: converge what instance units need on each host.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)

SETUP_HELP = """Converge what vLLM instance units need on each host, like an Ansible
play in check/diff mode first: nvidia-persistenced enabled and running (hosts
with GPUs), nvidia-fabricmanager on NVSwitch systems (the probe saw a GPU
fabric), the units' service user (vllm, or the host's vars.service_user),
memlock/nofile limits for its login sessions, kernel parameters (a drop-in in
/etc/sysctl.d: kernel.numa_balancing=0 on multi-NUMA hosts, arp_ignore=1 and
arp_announce=2 with two or more data NICs, plus the host's vars.sysctl; null
drops one) and the data NICs' MTU (fabric.mtu; kept by node-mtu.service).

Only what differs is changed; a setting that cannot be read makes the host an
error row, never "unchanged". Every value a change replaces is recorded in
/etc/clusterctl/node-setup.json first; --revert puts those back and removes
the files it wrote. Hosts change --serial at a time (default 1) and are read
again afterwards; a batch with more failures than --max-fail-percentage
(default 0) stops the run. A second apply changes nothing.

Exit status: 0 done or nothing to do (--plan: also with changes pending), 1
with --plan --detailed-exitcode when changes are pending, 2 a host failed or
could not be read, 3 usage or inventory errors.

Examples:

  clusterctl node setup --plan -i /var/lib/clusterctl-lab/inventory.yaml

  clusterctl node setup --plan --detailed-exitcode --hosts 'gpu[01-08]' --json

  clusterctl node setup --hosts 'gpu[01-08]' --serial 1,25%,100%

  clusterctl node setup --revert --plan --hosts gpu03
"""


@app.command("setup", help=SETUP_HELP)
def setup(
    inventory: Optional[str] = InventoryOpt,
    plan_only: bool = PlanOpt,
    revert: bool = typer.Option(
        False, "--revert", help="Put back what earlier applies replaced; remove what they wrote."
    ),
    detailed_exitcode: bool = DetailedOpt,
    hosts_pattern: str = HostsOpt,
    serial: Optional[str] = SerialOpt,
    max_fail_percentage: float = MaxFailOpt,
    as_json: bool = JsonOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.ops import bringup

    request = prepare(
        inventory,
        hosts_pattern,
        serial,
        max_fail_percentage,
        plan_only,
        detailed_exitcode,
        host_key_policy,
        fanout,
        connect_timeout,
        ask_become_pass,
    )
    on_event = stderr_events(not as_json)
    title = "node setup --revert" if revert else "node setup"
    finish(
        lambda: bringup.node_setup(request, revert, on_event),
        plan_only,
        detailed_exitcode,
        as_json,
        title,
        verb="to revert" if revert else "to change",
        empty="nothing recorded" if revert else "unchanged",
        done=("changed", "reverted"),
        plan_json={"revert": revert},
    )
