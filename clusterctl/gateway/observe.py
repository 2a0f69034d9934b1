"""What ``gateway sync`` measures before it decides: deploy's status and, on request, doctor's TP check.

:func:`observe` takes about ``window`` seconds plus one SSH round trip per
instance host (``clusterctl.deploy.status.collect_status``); with
``tp_check`` one more round trip per host gathers facts for doctor's
``tp.group`` check (``clusterctl.diagnose.tp``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from clusterctl.gateway.sync import Observed, tp_unavailable

#: status states whose message (why the unit is down) the gateway records as the reason.
DOWN_WITH_REASON = ("failed", "stopped", "restarting", "absent")
from clusterctl.inventory.model import Instance, Inventory


def observe(inv: Inventory, instances: Mapping[str, Instance], fleet: Any, *, window: float, state_dir: Path,
            tp_check: bool = False, on_event: Callable[[str], None] | None = None,
            ) -> tuple[dict[str, Observed], set[str]]:
    """``(observed per instance, instances whose TP group is UNAVAILABLE)``; ``fleet`` holds the instance hosts."""
    from clusterctl.deploy.peaks import load_peaks
    from clusterctl.deploy.status import collect_status

    rows = collect_status(inv, instances, fleet, window=window, state_dir=state_dir, include_extra=False,
                          on_event=on_event)
    peaks = load_peaks(state_dir)
    # a down unit's reason (from its journal) goes into the gateway's state; a loading instance's
    # message changes every second and would reload the gateway for nothing
    observed = {r.name: Observed(r.state, r.load, peaks.get(r.name), r.healthy,
                                 r.message if r.state in DOWN_WITH_REASON else "") for r in rows}
    unavailable: set[str] = set()
    if tp_check:
        from clusterctl.diagnose import bundle
        from clusterctl.diagnose.thresholds import load_thresholds
        from clusterctl.diagnose.tp import check_tp_groups

        hosts = [inv.hosts[h] for h in sorted({g.host for i in instances.values() for g in i.placement})
                 if h in inv.hosts]
        snap = bundle.gather(fleet, inv, hosts, on_event=on_event)
        scoped = replace(inv, instances=dict(instances))  # template replicas have TP groups too
        unavailable = tp_unavailable(check_tp_groups(bundle.context(snap, scoped, load_thresholds())))
    return observed, unavailable
