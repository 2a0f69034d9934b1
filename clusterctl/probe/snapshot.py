"""Doctor's snapshot gathered live: one SSH round trip per host (moved here from ``diagnose/``,
whose analyzers and bundle reader never touch the network).

:func:`gather` ships the node script (``clusterctl/node/bundle.py``) with the probe's payload
inside through ``fleet.ship`` and turns each host's answer into a
:class:`clusterctl.diagnose.bundle.Snapshot`: the facts (:func:`clusterctl.probe.run.interpret`),
the kernel log, each local instance's journal and ``/metrics`` samples, the verbatim command
records.  Doctor, collect, failover's detection and deploy status's TP health take it.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from datetime import datetime, timezone
from typing import Any, Callable

from clusterctl import __version__, node
from clusterctl.diagnose import sources
from clusterctl.diagnose.bundle import Snapshot, redact
from clusterctl.fleet import ship
from clusterctl.fleet.fleet import Fleet
from clusterctl.fleet.results import HostResult
from clusterctl.inventory.model import Host, Inventory
from clusterctl.probe.payload import payload, probe_command
from clusterctl.probe.run import FactsResult, interpret

NODE_SCRIPT = node.path("bundle")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def node_spec(inventory: Inventory | None, host: str, journal: bool, lines: int = 5000) -> dict[str, Any]:
    """The node script's argument for ``host``: its instances' units and ports."""
    insts = {}
    for inst in sources.instances(inventory):
        if inst.placement and inst.placement[0].host == host:
            bind = inst.args.get("host") if isinstance(inst.args.get("host"), str) else None
            insts[inst.name] = {
                "unit": sources.unit_name(inst.name),
                "port": inst.port,
                "host": None if bind in (None, "0.0.0.0", "::") else bind,
            }
    return {"instances": insts, "journal": journal, "lines": lines, "timeout_s": 5}


def node_program(probe_payload: bytes) -> ship.Program:
    """What runs on the node: the node script with the probe's payload as the constant ``PROBE_PAYLOAD``."""
    return ship.build("bundle", NODE_SCRIPT.read_bytes(), constants={"PROBE_PAYLOAD": probe_payload})


def gather(
    fleet: Fleet,
    inventory: Inventory | None,
    hosts: list[Host],
    *,
    interval_s: float = 0.0,
    timeout: float = 60.0,
    sudo: bool = False,
    on_event: Callable[[str], None] | None = None,
    on_facts: Callable[[FactsResult], None] | None = None,
    raw_outputs: bool = False,
) -> Snapshot:
    """One snapshot of ``hosts`` in one SSH round trip per host.

    On each host the node script (``clusterctl/node/bundle.py``) runs, at once: the probe
    (facts; it samples the NIC counters ``interval_s`` apart on the node) and,
    for every instance whose first GPU is there, a first ``/metrics`` sample
    and the unit's journal, then a second sample ``interval_s`` after the
    first (``interval_s`` 0: no second sample).  So a run takes about
    ``interval_s`` plus one round trip, the interval overlapping the probe's
    work.  ``raw_outputs``: the probe also returns every command it ran,
    verbatim; they go to ``commands`` (not to the facts document).
    ``snap.interval_s`` is the measured time between the ``/metrics``
    samples (the longest over the hosts; ``interval_s`` when no host runs an
    instance).  ``timeout``: seconds for one host's probe.  A host that fails
    is recorded, never raised: facts failures go to ``missing``,
    journal/metrics failures to the host's ``commands`` records.
    """
    snap = Snapshot(
        interval_s=interval_s,
        meta={"started_at": _now(), "clusterctl_version": __version__, "hosts": [h.name for h in hosts]},
    )
    probe_argv = shlex.split(
        probe_command(nvml_budget=max(1.0, timeout * 0.6), raw_outputs=raw_outputs, counter_interval=interval_s or None)
    )  # NIC counters for rate checks
    commands = {}
    for h in getattr(fleet, "hosts", hosts):
        spec = {
            **node_spec(inventory, h.name, True),
            "interval_s": interval_s,
            "probe": {"argv": probe_argv, "timeout_s": timeout},
        }
        commands[h.name] = [json.dumps(spec)]
    busy = sum(1 for h in hosts if node_spec(inventory, h.name, False)["instances"])
    if on_event and busy:
        on_event(f"probe on {len(hosts)} host(s); journals and /metrics of the instances on {busy}")
    intervals: list[float] = []

    def each(row: HostResult) -> None:
        doc = _node_document(row)
        probe_row = row
        if doc is not None:
            p = doc.get("probe") or {}
            rc = p.get("rc")
            probe_row = dataclasses.replace(
                row,
                rc=rc,
                stdout=p.get("stdout", ""),
                stderr=p.get("stderr", ""),
                status=type(row.status)("ok" if rc == 0 else "failed"),
            )
            _absorb(snap, row.host, doc)
            if doc.get("metrics_interval_s") is not None:
                intervals.append(float(doc["metrics_interval_s"]))
        r = interpret(probe_row)
        if r.ok and r.facts is not None:
            snap.commands.setdefault(row.host, []).extend(r.facts.raw.pop("raw_outputs", None) or [])
            snap.facts[row.host] = r.facts.raw
            kl = r.facts.kernel_log
            if kl.source:
                snap.raw.setdefault(row.host, {})[sources.KERNEL_LOG] = "".join(x.text + "\n" for x in kl.lines)
        else:
            snap.missing[row.host] = r.reason or r.status
        if on_facts:
            on_facts(r)

    t0 = time.monotonic()
    wanted = {h.name for h in hosts}
    # the node script with the probe inside, shipped only to hosts without a verified copy
    ship.run(
        fleet,
        node_program(payload().data),
        {k: v for k, v in commands.items() if k in wanted},
        sudo=sudo,
        timeout=timeout + interval_s + 10,
        on_result=each,
    )
    snap.meta["facts_at"] = snap.meta["finished_at"] = _now()
    snap.meta["phases_s"] = {"round_trip": round(time.monotonic() - t0, 3)}
    if intervals:
        snap.interval_s = max(intervals)
    return snap


def _node_document(row: HostResult) -> dict[str, Any] | None:
    """The node script's JSON document from a fleet row (its last stdout line), or None."""
    if str(getattr(row.status, "value", row.status)) != "ok":
        return None
    lines = [x for x in (row.stdout or "").splitlines() if x.strip()]
    try:
        doc = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) and "instances" in doc else None


def _absorb(snap: Snapshot, host: str, doc: dict[str, Any]) -> None:
    raw = snap.raw.setdefault(host, {})
    for name, rec in (doc.get("instances") or {}).items():
        j = rec.get("journal")
        if j is not None:
            j["stdout"] = text = redact(j.get("stdout", ""))
            snap.commands.setdefault(host, []).append(j)
            if j.get("rc") == 0 and text.strip() not in ("", "-- No entries --"):
                raw[f"{name}.log"] = text  # an instance never started has no log to analyse
        for key, suffix in (("metrics", ""), ("metrics_2", ".2")):
            m = rec.get(key)
            if m is None:
                continue
            snap.commands.setdefault(host, []).append(m)
            if "text" in m:
                raw[f"{name}.metrics{suffix}"] = m["text"]
    if not raw:
        del snap.raw[host]
    snap.meta.setdefault("instances_at", {})[host] = doc.get("collected_at")
