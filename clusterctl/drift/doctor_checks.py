"""``doctor --checks drift,leak``: the checks that cost requests, run only when asked for.

Per inventory instance on the selected hosts:

- ``drift.output``: the drift check (:mod:`clusterctl.drift.verdict`) against
  the instance's baseline (:func:`clusterctl.drift.store.baseline_for`): CRIT
  when it fails, OK when it passes, UNKNOWN without a baseline or an answer.
- ``leak.context``: the context-leak check (:mod:`clusterctl.drift.leak`):
  CRIT on any sighting, OK when none, UNKNOWN when no request succeeded.

Instances are checked in parallel (``parallel`` at a time); each request is
bounded by ``timeout`` seconds, so a hung instance is a row, not a stall.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor

from clusterctl.bench.target import instance_endpoint
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.drift import leak, store, verdict
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import Instance, Inventory

DRIFT = "drift.output"
LEAK = "leak.context"
#: ``--checks`` words that select each (the check, its group, its last part).
WORDS = {DRIFT: ("drift", DRIFT, "output"), LEAK: ("leak", LEAK, "context")}


def split_checks(words: list[str]) -> tuple[list[str], list[str]]:
    """(``--checks`` words for the analyzers, request checks selected); the analyzer list is empty when only
    request checks were named."""
    rest, picked = [], []
    for w in (x.strip() for x in words if x.strip()):
        hit = [c for c, names in WORDS.items() if w in names]
        if hit:
            picked += [c for c in hit if c not in picked]
        else:
            rest.append(w)
    return rest, picked


def _drift(inv: Inventory, inst: Instance, timeout: float) -> Finding:
    host = inst.placement[0].host
    try:
        ep = instance_endpoint(inv, inst)
        name = store.baseline_for(inst.name, ep.url)
        if name is None:
            return Finding(
                DRIFT,
                Severity.UNKNOWN,
                host,
                inst.name,
                f"no drift baseline for {inst.name}",
                f"record one: clusterctl drift baseline {inst.name} --name {inst.name}",
            )
        v = verdict.check(ep, name, timeout=timeout)
    except ClusterctlError as e:
        return Finding(DRIFT, Severity.UNKNOWN, host, inst.name, f"drift check could not run: {e}")
    s = v.summary
    text = (
        f"vs baseline {name!r}: exact match {s['exact_match']:.0%}, vLLM rule {s['vllm_rule_pass']:.0%}, "
        f"mean KL {s['mean_kl']:.4f}"
    )
    if v.passed:
        return Finding(DRIFT, Severity.OK, host, inst.name, text)
    return Finding(
        DRIFT,
        Severity.CRIT,
        host,
        inst.name,
        f"outputs drifted {text}: {'; '.join(v.reasons)}",
        "compare quantization, vLLM version and GPU with the baseline's environment; "
        "roll back if the change was not intended",
        tuple(v.reasons),
    )


def _leak(inv: Inventory, inst: Instance, timeout: float) -> Finding:
    host = inst.placement[0].host
    try:
        rep = leak.run(instance_endpoint(inv, inst), timeout=timeout)
    except ClusterctlError as e:
        return Finding(LEAK, Severity.UNKNOWN, host, inst.name, f"leak check could not run: {e}")
    if rep.sightings:
        ev = tuple(
            f"{s.owner}'s canary {s.canary!r} in {s.seen_by}'s response {s.request} ({s.where})"
            for s in rep.sightings[:10]
        )
        return Finding(
            LEAK,
            Severity.CRIT,
            host,
            inst.name,
            f"{len(rep.sightings)} cross-session canary sightings in {rep.requests} responses",
            "another session's prompt text reached a response: disable prefix caching / KV reuse "
            "and take the instance out of service until the cause is found",
            ev,
        )
    if not rep.requests:
        why = "; ".join(rep.errors) or "no request succeeded"
        return Finding(LEAK, Severity.UNKNOWN, host, inst.name, f"leak check got no answer: {why}")
    return Finding(
        LEAK, Severity.OK, host, inst.name, f"no canary seen across {rep.sessions} sessions, {rep.requests} responses"
    )


def run(
    inv: Inventory,
    hosts: Collection[str],
    checks: Collection[str],
    *,
    timeout: float = 60.0,
    parallel: int = 8,
    on_done: Callable[[Finding], None] | None = None,
) -> list[Finding]:
    """Findings of ``checks`` (:data:`DRIFT`, :data:`LEAK`) for every instance placed on ``hosts``."""
    instances = [i for i in inv.instances.values() if any(g.host in hosts for g in i.placement)]
    jobs = [(fn, inst) for inst in instances for check, fn in ((DRIFT, _drift), (LEAK, _leak)) if check in checks]

    def one(job: tuple[Callable[[Inventory, Instance, float], Finding], Instance]) -> Finding:
        f = job[0](inv, job[1], timeout)
        if on_done is not None:
            on_done(f)
        return f

    if not jobs:
        return [
            Finding(c, Severity.UNKNOWN, None, "instances", "no inventory instance on the selected hosts")
            for c in sorted(checks)
        ]
    with ThreadPoolExecutor(max(1, min(parallel, len(jobs)))) as pool:
        return list(pool.map(one, jobs))
