"""Check ``tp.group``: GPU findings rolled up to the instance that owns each GPU.

An instance's TP group (its inventory placement, ``host:GPU`` pairs) is
UNAVAILABLE (CRIT) when any member GPU has a CRIT finding, DEGRADED (WARN)
when one has a WARN, UNKNOWN when a member host could not be checked, OK
otherwise.  The GPU checks (``gpu.*``) are run here on the same context, so
``--checks tp`` works alone; the subject is ``tp-group:NAME``.  A group whose
NCCL traffic crosses hosts is also DEGRADED by a CRIT fabric finding
(``roce.*``, ``net.data``) on a member host.

A worker of the group that died (vLLM's "Worker proc Worker_TP1 died
unexpectedly", :data:`clusterctl.diagnose.vllmlog.WORKER_DEAD`, in the
instance's log) makes the group UNAVAILABLE too, naming the rank and its GPU
(:func:`dead_member`): the engine cannot serve with a rank missing, whatever
the GPU checks say.  A CRIT GPU finding, the likely cause, is named first.

A member host that was not selected (``doctor HOST`` on a subset: neither
read nor failed) is not a failure: the group is judged on its selected
members and says which hosts were not selected; a group none of whose hosts
was selected gets no finding.
"""

from __future__ import annotations

from dataclasses import replace


from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer, run_analyzers
from clusterctl.diagnose.sources import bus_ids
from clusterctl.diagnose.vllmlog import DeadWorker, parse_log
from clusterctl.inventory.model import GpuRef, Instance


def dead_member(inst: Instance, dead: DeadWorker) -> GpuRef | None:
    """The GPU of the dead worker ``dead`` (``LogEvents.dead_worker``): TP rank r of pipeline stage p is
    placement entry ``p x tp + r`` (vLLM's rank order over CUDA_VISIBLE_DEVICES); ``None`` when out of range."""
    rank, pp = int(dead["rank"]), dead.get("pp")
    if pp is not None:
        tp = inst.args.get("tensor-parallel-size") or inst.args.get("tensor_parallel_size") or len(inst.placement)
        rank += int(pp) * int(tp)
    return inst.placement[rank] if 0 <= rank < len(inst.placement) else None


def dead_worker(ctx: AnalysisContext, inst: Instance) -> tuple[DeadWorker, GpuRef | None] | None:
    """The first dead worker in ``inst``'s log (on the host of its first GPU) and its GPU, or ``None``."""
    if not inst.placement:
        return None
    text = ctx.raw.get(inst.placement[0].host, {}).get(f"{inst.name}.log")
    dead = parse_log(text).dead_worker if text else None
    return (dead, dead_member(inst, dead)) if dead else None


def dead_worker_message(
    inst: Instance, dead: DeadWorker, gpu: GpuRef | None, ctx: AnalysisContext | None = None
) -> str:
    bus = bus_ids(ctx, gpu.host).get(gpu.index) if gpu is not None and ctx is not None else None
    where = (
        f"GPU {gpu}" + (f" ({bus})" if bus else "") if gpu is not None else "GPU unknown (rank beyond the placement)"
    )
    return f"TP worker rank {dead['rank']} ({dead['process']}, {where}) died"


@analyzer("tp.group")
def check_tp_groups(ctx: AnalysisContext) -> list[Finding]:
    inv = ctx.inventory
    if inv is None or not inv.instances:
        return []
    gpu_findings = run_analyzers(ctx, only=["gpu"])
    by_gpu: dict[tuple[str, int], list[Finding]] = {}
    host_level: dict[str, list[Finding]] = {}
    for f in gpu_findings:
        if f.host is None:
            continue
        if f.subject.startswith("gpu:") and f.subject[4:].split("/")[0].isdigit():
            by_gpu.setdefault((f.host, int(f.subject[4:].split("/")[0])), []).append(f)
        elif f.subject == "host":  # NVML down, GPUs missing: every group on the host
            host_level.setdefault(f.host, []).append(f)
    fabric: dict[str, list[Finding]] = {}
    if any(len(i.hosts) > 1 for i in inv.instances.values()):
        for f in run_analyzers(ctx, only=["roce", "net.data"]):
            if f.host and f.severity == Severity.CRIT:
                fabric.setdefault(f.host, []).append(replace(f, severity=Severity.WARN))
    out: list[Finding] = []
    for inst in inv.instances.values():
        members = [str(g) for g in inst.placement]
        bad: list[tuple[str, Finding]] = []
        for g in inst.placement:
            for f in by_gpu.get((g.host, g.index), []) + host_level.get(g.host, []):
                if f.severity in (Severity.CRIT, Severity.WARN):
                    bus = bus_ids(ctx, g.host).get(g.index)
                    bad.append((str(g) + (f" ({bus})" if bus else "") if f.subject.startswith("gpu:") else g.host, f))
        if len(inst.hosts) > 1:  # NCCL traffic crosses the fabric
            bad += [(h, f) for h in inst.hosts for f in fabric.get(h, [])]
        # Unchecked means no GPU state at all (unreachable, no facts, NVML down);
        # a single check without data (an unreadable kernel log) does not make it so.
        # A member host neither read nor failed was not selected (``doctor HOST`` on a subset): not a failure.
        not_selected = sorted({h for h in inst.hosts if h not in ctx.facts and h not in ctx.missing})
        if len(not_selected) == len(set(inst.hosts)):
            continue  # none of the group's hosts selected: not this run's business
        unknown = sorted(
            {
                h
                for h in inst.hosts
                if h not in not_selected
                and (
                    h in ctx.missing
                    or h not in ctx.facts
                    or any(
                        f.severity == Severity.UNKNOWN and f.check in ("gpu.nvml", "gpu.lost")
                        for f in host_level.get(h, [])
                    )
                )
            }
        )
        crit = [(m, f) for m, f in bad if f.severity == Severity.CRIT]
        warn = [(m, f) for m, f in bad if f.severity == Severity.WARN]
        subj = f"tp-group:{inst.name}"
        ev = tuple(dict.fromkeys(f"{m}: {f.check}: {f.message}" for m, f in crit + warn))
        died = dead_worker(ctx, inst) if len(members) > 1 else None
        if died and not crit:
            dead, gpu = died
            out.append(
                Finding(
                    "tp.group",
                    Severity.CRIT,
                    None,
                    subj,
                    f"UNAVAILABLE: {dead_worker_message(inst, dead, gpu, ctx)}; the group of {len(members)} "
                    "cannot serve",
                    f"drain instance {inst.name}; check {gpu or 'the group'}'s GPU findings and kernel log "
                    "(XIDs), then restart the instance",
                    (dead["line"],),
                )
            )
        elif crit:
            out.append(
                Finding(
                    "tp.group",
                    Severity.CRIT,
                    None,
                    subj,
                    f"UNAVAILABLE: member {crit[0][0]} is critical ({crit[0][1].check}); "
                    f"the group of {len(members)} cannot serve",
                    f"drain instance {inst.name}; {crit[0][1].action}",
                    ev,
                )
            )
        elif warn:
            out.append(
                Finding(
                    "tp.group",
                    Severity.WARN,
                    None,
                    subj,
                    f"DEGRADED: member {warn[0][0]} has a warning ({warn[0][1].check})",
                    warn[0][1].action,
                    ev,
                )
            )
        elif unknown:
            out.append(
                Finding(
                    "tp.group",
                    Severity.UNKNOWN,
                    None,
                    subj,
                    f"member host(s) {', '.join(unknown)} could not be checked",
                    "make the hosts reachable and run doctor again",
                )
            )
        elif not_selected:
            seen = [m for m in members if m.rpartition(":")[0] not in not_selected]
            out.append(
                Finding(
                    "tp.group",
                    Severity.OK,
                    None,
                    subj,
                    f"selected members healthy ({', '.join(seen)}); members on "
                    f"{', '.join(not_selected)} not selected (doctor ran on a subset of the hosts)",
                    f"run doctor on {','.join(sorted(set(inst.hosts)))} to check the whole group",
                )
            )
        else:
            out.append(
                Finding(
                    "tp.group",
                    Severity.OK,
                    None,
                    subj,
                    f"all {len(members)} member GPUs healthy ({', '.join(members)})",
                )
            )
    return out
