"""What ``gateway sync`` measures before it decides: deploy's status and, on request, doctor's TP check.

:func:`observe` takes about ``window`` seconds plus one SSH round trip per
instance host (``clusterctl.deploy.status.instances.collect_status``); with
``tp_check`` (the default: TP health is part of every sync) one more round
trip per instance host (every placed instance, TP 1 included) gathers facts for doctor's
``tp.group`` check (``clusterctl.diagnose.tp``, through
``deploy.status.tp_health``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from clusterctl.gateway.sync import Observed

#: status states whose message (why the unit is down) the gateway records as the reason.
DOWN_WITH_REASON = ("failed", "stopped", "restarting", "absent")
from clusterctl.fleet.fleet import Fleet
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.deploy.status.peaks import load_peaks
from clusterctl.deploy.status.instances import collect_status, max_num_seqs


def observe(
    inv: Inventory,
    instances: Mapping[str, Instance],
    fleet: Fleet,
    *,
    window: float,
    state_dir: Path,
    tp_check: bool = True,
    on_event: Callable[[str], None] | None = None,
) -> tuple[dict[str, Observed], set[str]]:
    """``(observed per instance, instances whose TP group is UNAVAILABLE)``; ``fleet`` holds the instance hosts."""
    rows = collect_status(
        inv,
        instances,
        fleet,
        window=window,
        state_dir=state_dir,
        include_extra=False,
        on_event=on_event,
        tp_check=tp_check,
    )
    peaks = load_peaks(state_dir)
    # a down unit's reason (from its journal) goes into the gateway's state; a loading instance's
    # message changes every second and would reload the gateway for nothing
    observed = {
        r.name: Observed(
            r.state,
            r.load,
            peaks.get(r.name),
            r.healthy,
            r.message if r.state in DOWN_WITH_REASON else "",
            running=r.running,
            waiting=r.waiting,
            kv_usage=r.kv_usage,
            seats=max_num_seqs(instances.get(r.name)),
        )
        for r in rows
    }
    unavailable = {r.name for r in rows if (r.tp_group or "").startswith("UNAVAILABLE")}
    return observed, unavailable
