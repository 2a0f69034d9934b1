"""Check ``serving.unit``: each wanted instance's systemd unit, from the facts' ``units``.

For every instance of the inventory, on its host (the first of its
placement), the unit ``clusterctl-NAME.service`` as the probe read it
(``systemctl show``):

- ``failed`` or ``inactive``: CRIT, the instance is down, with the reason
  from its journal and systemd's ``Result=`` (:mod:`clusterctl.diagnose.unitlog`);
- ``activating (auto-restart)``: CRIT, between automatic restarts (a crash loop);
- no unit: no finding (not deployed yet, or started some other way;
  ``clusterctl status`` reports a wanted instance without a unit as absent);
- active, restarted by systemd ``serving.restarts_warn`` (3) times or more
  (``NRestarts``): WARN, it keeps crashing and coming back;
- active otherwise: OK.

A host whose facts have no ``units`` (systemctl did not answer) is UNKNOWN
for its instances; a host without facts is left to ``host.reachable``.

A multi-node replica (docs/multinode.md) is also judged by its worker units
``clusterctl-NAME-nodeR.service`` on their hosts: a worker that is failed,
inactive or in a crash loop is CRIT for the replica (subject
``instance:NAME``, host: the worker's), naming the worker's unit and host, with
the action ``clusterctl restart NAME`` (it stops every member, starts the
workers, then the head, and waits for the head's ``/health``), or ``clusterctl
deploy --instances NAME`` when the units must be rewritten.  A worker unit that is absent while
the head's is there is CRIT too (the replica is incomplete).
"""

from __future__ import annotations

from clusterctl.diagnose import sources
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.diagnose.thresholds import number, section
from clusterctl.diagnose.unitlog import down_reason
from clusterctl.inventory.model import Instance
from clusterctl.inventory.multinode import hosts_in_order, member_name
from clusterctl.probe.factgroups import Unit, Units, UnitsFact

CHECK = "serving.unit"


@analyzer(CHECK)
def check_units(ctx: AnalysisContext) -> list[Finding]:
    restarts_warn = number(section(ctx.thresholds, "gpu", "serving"), "restarts_warn", 3)
    out: list[Finding] = []
    for inst in sources.instances(ctx.inventory):
        if not inst.placement:
            continue
        host = inst.placement[0].host
        units = ctx.fact(host, UnitsFact)
        if units is None:
            continue
        subj = f"instance:{inst.name}"
        if not units.read:
            out.append(
                Finding(
                    CHECK,
                    Severity.UNKNOWN,
                    host,
                    subj,
                    "cannot check: the host's units were not read (systemctl did not answer)",
                    "run doctor again; check systemctl on the host",
                )
            )
            continue
        unit = _unit(units, inst.name)
        if unit is None:
            continue
        out.append(_verdict(ctx, host, inst.name, subj, unit, restarts_warn))
        if len(inst.hosts) > 1:
            out.extend(_workers(ctx, inst))
    return out


def _unit(units: Units, name: str) -> Unit | None:
    unit = units.get(sources.unit_name(name))
    return unit if unit is not None and unit.loaded else None


def _workers(ctx: AnalysisContext, inst: Instance) -> list[Finding]:
    """A multi-node replica's worker units that are down (module doc): one CRIT finding each."""
    out: list[Finding] = []
    fix = (
        f"clusterctl restart {inst.name} (stops every member, starts the workers, then the head, and waits "
        f"for its /health; clusterctl deploy --instances {inst.name} when the units must be rewritten)"
    )
    for rank, host in enumerate(hosts_in_order(inst)):
        units = ctx.fact(host, UnitsFact)
        if rank == 0 or units is None or not units.read:
            continue  # an unread worker host is host.reachable's (or the units' UNKNOWN) finding
        uname = sources.unit_name(member_name(inst.name, rank))
        unit = _unit(units, member_name(inst.name, rank))
        subj = f"instance:{inst.name}"
        if unit is None:
            out.append(
                Finding(
                    CHECK,
                    Severity.CRIT,
                    host,
                    subj,
                    f"replica incomplete: no worker unit {uname} on {host} (rank {rank} of "
                    f"{len(inst.hosts)}); vLLM's head serves only with every rank",
                    fix,
                )
            )
            continue
        active, sub = unit.active_state, unit.sub_state
        if active in ("failed", "inactive") or (active == "activating" and sub == "auto-restart"):
            why = down_reason(
                ctx.raw.get(host, {}).get(f"{member_name(inst.name, rank)}.log", ""),
                str(unit.result or ""),
                str(unit.exec_main_status or ""),
            )
            out.append(
                Finding(
                    CHECK,
                    Severity.CRIT,
                    host,
                    subj,
                    f"replica down: worker unit {uname} on {host} (rank {rank}) is {active} ({sub}): "
                    f"{why}; vLLM's head engine dies with a lost rank",
                    f"fix the cause (journalctl -u {uname} on {host}), then {fix}",
                    (f"{uname}: ActiveState={active} SubState={sub} Result={unit.result} NRestarts={unit.restarts}",),
                )
            )
    return out


def _verdict(ctx: AnalysisContext, host: str, name: str, subj: str, unit: Unit, restarts_warn: float) -> Finding:
    uname = sources.unit_name(name)
    active, sub = unit.active_state, unit.sub_state
    restarts = unit.restarts
    journal = ctx.raw.get(host, {}).get(f"{name}.log", "")
    why = down_reason(journal, str(unit.result or ""), str(unit.exec_main_status or ""))
    ev = tuple(
        x
        for x in (
            f"{uname}: ActiveState={active} SubState={sub} Result={unit.result} NRestarts={restarts}",
            f"since {unit.since}" if unit.since else None,
        )
        if x
    )
    see = f"journalctl -u {uname} on {host}"
    if active in ("failed", "inactive"):
        return Finding(
            CHECK,
            Severity.CRIT,
            host,
            subj,
            f"down: unit {active}: {why}",
            f"fix the cause ({see}), then systemctl reset-failed and start {uname} (or clusterctl deploy)",
            ev,
        )
    if active == "activating" and sub == "auto-restart":
        return Finding(
            CHECK,
            Severity.CRIT,
            host,
            subj,
            f"crash loop: between automatic restarts ({restarts} so far): {why}",
            f"fix the cause ({see}); systemd gives up after its start limit",
            ev,
        )
    if active in ("activating", "deactivating", "reloading"):
        return Finding(CHECK, Severity.WARN, host, subj, f"unit {active} ({sub})", f"check again shortly; {see}", ev)
    if restarts >= restarts_warn:
        return Finding(
            CHECK,
            Severity.WARN,
            host,
            subj,
            f"keeps restarting: systemd restarted it {restarts} times (NRestarts); last cause: {why}",
            f"find why it dies ({see}, serving.engine, oom.cause); each restart reloads the model",
            ev,
        )
    return Finding(
        CHECK,
        Severity.OK,
        host,
        subj,
        f"unit active ({sub})" + (f", restarted {restarts} time(s)" if restarts else ""),
        evidence=ev,
    )
