"""What the bring-up commands (``net apply``, ``node setup``) share: the per-host
outcome, the run's report, facts out of the probe's results, and the batch loop
(``--serial`` batches, ``--max-fail-percentage``; a batch over the limit stops the
run and later batches are ``skipped``, never touched)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from clusterctl.deploy.rollout.batches import batch_failed, batches
from clusterctl.diagnose.findings import Finding
from clusterctl.fleet.results import HostResult
from clusterctl.probe.factgroups import FactsDoc
from clusterctl.probe.run import FactsResult

OnEvent = Callable[[str, str, "str | None"], None]


class Plan(Protocol):
    host: str
    error: str | None

    @property
    def changes(self) -> Sequence[Any]: ...

    @property
    def pending(self) -> bool: ...


@dataclass
class HostOutcome:
    """``status``: unchanged, changed (reverted), failed (apply or re-check), unread (no plan), refused (read;
    the plan refuses the change), skipped."""

    host: str
    status: str
    changes: list[Any] = field(default_factory=list)
    error: str | None = None
    findings: list[Finding] = field(default_factory=list)
    batch: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "status": self.status,
            "batch": self.batch,
            "error": self.error,
            "changes": [c.to_dict() for c in self.changes],
            "findings": [f.to_json() for f in self.findings],
        }


@dataclass
class ApplyReport:
    plans: Sequence[Any]
    outcomes: list[HostOutcome] = field(default_factory=list)
    stopped: str | None = None

    @property
    def ok(self) -> bool:
        return self.stopped is None and all(o.status in ("unchanged", "changed", "reverted") for o in self.outcomes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "stopped": self.stopped,
            "plan": [p.to_dict() for p in self.plans],
            "hosts": [o.to_dict() for o in self.outcomes],
        }


def facts_of(results: Mapping[str, FactsResult]) -> tuple[dict[str, FactsDoc], dict[str, str]]:
    """The probe's results as (the facts document per host, why not per host without them)."""
    facts: dict[str, FactsDoc] = {}
    missing: dict[str, str] = {}
    for host, r in results.items():
        if r.ok and r.facts is not None:
            facts[host] = r.facts.raw
        else:
            missing[host] = r.reason or "no facts"
    return facts, missing


def run_batches(
    plans: Sequence[Any],
    order: Sequence[str],
    serial: Sequence[str],
    max_fail: float,
    apply_batch: Callable[[list[Any], int], list[HostOutcome]],
    on_event: OnEvent,
) -> ApplyReport:
    """Apply the pending, readable ``plans`` batch by batch with ``apply_batch(plans, n)``."""
    rep = ApplyReport(list(plans))
    todo = [p for p in plans if p.pending and p.error is None]
    for p in plans:
        if p.error is not None:  # not read, or read and refused (engine remove while a unit runs it)
            status = "refused" if getattr(p, "refused", False) else "unread"
            rep.outcomes.append(HostOutcome(p.host, status, list(p.changes), p.error))
            on_event("host", f"not changed: {p.error}", p.host)
        elif not p.pending:
            rep.outcomes.append(HostOutcome(p.host, "unchanged"))
    groups = batches(todo, list(serial))
    for n, batch in enumerate(groups, 1):
        if rep.stopped:
            rep.outcomes += [HostOutcome(p.host, "skipped", list(p.changes), rep.stopped, batch=n) for p in batch]
            continue
        on_event("batch", f"batch {n}/{len(groups)}: {', '.join(p.host for p in batch)}", None)
        results = apply_batch(batch, n)
        rep.outcomes += results
        failed = sum(o.status == "failed" for o in results)
        if batch_failed(failed, len(batch), max_fail):
            rep.stopped = (
                f"batch {n}: {failed} of {len(batch)} hosts failed "
                f"(more than {max_fail:g}% allowed); later batches not changed"
            )
            on_event("batch", rep.stopped, None)
    index = {h: i for i, h in enumerate(order)}
    rep.outcomes.sort(key=lambda o: index.get(o.host, len(index)))
    return rep


def boot_unit_text(description: str, script: str, documentation: str = "") -> str:
    """A oneshot unit that runs ``script`` with ``sh`` at boot, before the network is up (after the
    drivers' modules load), and stays active: how bring-up settings that live in the kernel persist."""
    doc = f"Documentation={documentation}\n" if documentation else ""
    return (
        f"[Unit]\nDescription={description}\n{doc}"
        "After=systemd-modules-load.service network-pre.target\nWants=network-pre.target\n"
        "Before=network.target\n\n"
        f"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/sh {script}\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


def failed_run(row: HostResult, n: int) -> HostOutcome:
    """The outcome of a host whose apply script failed in batch ``n``: the fleet's error, else the
    last five lines of the script's stderr, else its exit status."""
    detail = (row.stderr or "").strip().splitlines()[-5:]
    return HostOutcome(row.host, "failed", error=row.error or "; ".join(detail) or f"exit {row.rc}", batch=n)


def recheck_outcome(p: Plan, n: int, done: str = "changed") -> HostOutcome:
    """A changed host's outcome from its plan read again afterwards: nothing may still differ."""
    if p.error is not None:
        return HostOutcome(p.host, "failed", error="re-check: " + p.error, batch=n)
    if p.changes:
        return HostOutcome(p.host, "failed", batch=n, error="re-check: still " + "; ".join(c.line() for c in p.changes))
    return HostOutcome(p.host, done, batch=n)


def settle(plans: Sequence[Plan], out: Mapping[str, HostOutcome], on_event: OnEvent) -> list[HostOutcome]:
    """The batch's outcomes in the plans' order, each with its plan's changes, each reported."""
    for p in plans:
        o = out[p.host]
        o.changes = list(p.changes)
        on_event("host", o.status + (f": {o.error}" if o.error else ""), p.host)
    return [out[p.host] for p in plans]
