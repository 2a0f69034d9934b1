"""``clusterctl net apply``: the inventory's RoCE QoS profile on every RoCE NIC (docs/bring-up.md)."""

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
    help="The data network: apply the inventory's RoCE QoS profile to the NICs.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)

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


@app.command("apply", help=APPLY_HELP)
def apply(
    inventory: Optional[str] = InventoryOpt,
    plan_only: bool = PlanOpt,
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
    finish(lambda: bringup.net_apply(request, on_event), plan_only, detailed_exitcode, as_json, "net apply")
