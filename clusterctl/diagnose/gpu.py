"""GPU checks on the NVML view of facts (``gpus`` of docs/facts.md).

Checks (each registered on its own, ``--checks gpu`` selects them all):
``gpu.nvml`` driver/NVML alive, ``gpu.inventory`` count/model/memory against
the inventory and driver/VBIOS drift, ``gpu.lost`` lost or hung GPUs,
``gpu.ecc``, ``gpu.remap`` (row remapping), ``gpu.recovery`` (NVML's recovery
action), ``gpu.fabric`` (NVSwitch fabric registration), ``gpu.retired`` (retired pages),
``gpu.clocks`` (slowdown reasons), ``gpu.pcie``, ``gpu.nvlink``,
``gpu.thermal`` (temperature, power), ``gpu.persistence``.

A host with facts and nothing wrong gets one OK finding per check; a host
without facts but with raw texts (a partial bundle) gets UNKNOWN; hosts that
could not be reached are reported once by ``host.reachable``.  Counters
compared across two collections use ``ctx.samples`` when present.

The checks read the typed ``gpus`` group (``ctx.fact(host, GpusFact)``,
``clusterctl/probe/factgroups.py``), never the raw dict.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from clusterctl.diagnose import fabric, sources
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.diagnose.thresholds import number, section
from clusterctl.probe.factgroups import GpuDevice, GpusFact, GpuSection

GpuCheck = Callable[[AnalysisContext, str, GpuDevice], Iterable[Finding]]
DRAIN = "drain the instances on this GPU"


def limits(ctx: AnalysisContext, gpu_name: str | None = None) -> dict[str, Any]:
    """GPU thresholds, with the per-model overrides whose key is in ``gpu_name``."""
    table = dict(section(ctx.thresholds, "gpu", "gpu"))
    for key, override in section(ctx.thresholds, "gpu", "models").items():
        if gpu_name and key.lower() in gpu_name.lower() and isinstance(override, dict):
            table.update(override)
    return table


def _hosts_with_facts(ctx: AnalysisContext, check: str) -> Iterable[tuple[str, GpuSection | None, Finding | None]]:
    """``(host, gpus section, None)`` for hosts with facts; ``(host, None, UNKNOWN)`` for raw-only hosts."""
    for host in sources.all_hosts(ctx):
        if host in ctx.missing:
            continue
        g = ctx.fact(host, GpusFact)
        if g is not None and g.unreadable:
            yield (
                host,
                None,
                Finding(
                    check,
                    Severity.UNKNOWN,
                    host,
                    "host",
                    f"GPU facts not read: {g.unreadable}",
                    "run doctor with a clusterctl as new as the nodes' collector",
                ),
            )
        elif g is None:
            yield (
                host,
                None,
                Finding(
                    check,
                    Severity.UNKNOWN,
                    host,
                    "host",
                    "no facts for this host (GPU state unknown)",
                    "collect the bundle with `clusterctl collect`, or run doctor live",
                ),
            )
        else:
            yield host, g, None


def _expects_gpus(ctx: AnalysisContext, host: str) -> bool:
    inv = ctx.inventory
    return bool(inv and host in inv.hosts and inv.hosts[host].gpus.count)


def per_gpu(check: str, fn: GpuCheck, ok: str) -> Callable[[AnalysisContext], list[Finding]]:
    """An analyzer that runs ``fn`` on every readable GPU; OK per host when it found nothing."""

    def run(ctx: AnalysisContext) -> list[Finding]:
        out: list[Finding] = []
        for host, g, unknown in _hosts_with_facts(ctx, check):
            if unknown:
                out.append(unknown)
                continue
            assert g is not None
            if not g.available:
                if _expects_gpus(ctx, host):
                    out.append(Finding(check, Severity.UNKNOWN, host, "host", "NVML unavailable (see gpu.nvml)"))
                continue
            found: list[Finding] = []
            for d in g.devices:
                if d.lost or d.hung:
                    continue
                found.extend(fn(ctx, host, d))
            out.extend(found or [Finding(check, Severity.OK, host, "host", ok)])
        return out

    run.__name__ = check.replace(".", "_")
    run.__doc__ = fn.__doc__
    return run


def _sample_device(ctx: AnalysisContext, host: str, index: int) -> GpuDevice | None:
    later = ctx.fact(host, GpusFact, sample=True)
    return None if later is None else later.device(index)


def _gpu(d: GpuDevice) -> str:
    return f"gpu:{d.index}"


# --------------------------------------------------------------------- checks


@analyzer("gpu.nvml")
def check_nvml(ctx: AnalysisContext) -> list[Finding]:
    """NVML and the driver answer; NVML calls that timed out."""
    out: list[Finding] = []
    for host, g, unknown in _hosts_with_facts(ctx, "gpu.nvml"):
        if unknown:
            out.append(unknown)
            continue
        assert g is not None
        reason = str(g.reason or "")
        if not g.available:
            if "pynvml" in reason.lower() and "not loaded" not in reason:
                out.append(
                    Finding(
                        "gpu.nvml",
                        Severity.UNKNOWN,
                        host,
                        "host",
                        f"NVML not checked: {reason}",
                        "install nvidia-ml-py on the node or use a clusterctl that carries it",
                    )
                )
            elif _expects_gpus(ctx, host) or "not loaded" in reason or "timed out" in reason:
                out.append(
                    Finding(
                        "gpu.nvml",
                        Severity.CRIT,
                        host,
                        "host",
                        f"NVML unavailable: {reason}",
                        "drain the node; load or reinstall the NVIDIA driver and reboot "
                        "(check the kernel log for NVRM probe failures)",
                        (reason,),
                    )
                )
            continue
        timed_out = list(g.timed_out_calls)
        if timed_out:
            out.append(
                Finding(
                    "gpu.nvml",
                    Severity.CRIT,
                    host,
                    "host",
                    f"NVML calls hung: {', '.join(sorted(set(timed_out)))}",
                    "a hung driver or GSP (often XID 119): drain the node, reset the GPUs or reboot",
                    tuple(timed_out),
                )
            )
        else:
            out.append(Finding("gpu.nvml", Severity.OK, host, "host", f"NVML answers (driver {g.driver_version})"))
    return out


@analyzer("gpu.inventory")
def check_inventory(ctx: AnalysisContext) -> list[Finding]:
    """GPU count, model and memory against the inventory; driver and VBIOS the same everywhere."""
    out: list[Finding] = []
    inv = ctx.inventory
    drivers: dict[str, list[str]] = {}
    for host, g, unknown in _hosts_with_facts(ctx, "gpu.inventory"):
        if unknown:
            out.append(unknown)
            continue
        assert g is not None
        spec = inv.hosts[host].gpus if inv and host in inv.hosts else None
        if not g.available:
            continue
        devices = g.devices
        if g.driver_version:
            drivers.setdefault(g.driver_version, []).append(host)
        problems: list[Finding] = []
        if spec is not None and spec.count and len(devices) < spec.count:
            problems.append(
                Finding(
                    "gpu.inventory",
                    Severity.CRIT,
                    host,
                    "host",
                    f"{len(devices)} GPUs visible, the inventory says {spec.count}",
                    "drain the node; a GPU is missing from the bus: check the kernel log, "
                    "reseat or power-cycle, replace the GPU",
                    tuple(f"gpu {d.index}: {d.pci_address}" for d in devices),
                )
            )
        elif spec is not None and spec.count and len(devices) > spec.count:
            problems.append(
                Finding(
                    "gpu.inventory",
                    Severity.WARN,
                    host,
                    "host",
                    f"{len(devices)} GPUs visible, the inventory says {spec.count}",
                    "update the inventory's gpus.count",
                )
            )
        if spec is not None and spec.model:
            token = spec.model.split("-")[0].lower()
            bad = [d for d in devices if d.name and token not in d.name.lower()]
            if bad:
                problems.append(
                    Finding(
                        "gpu.inventory",
                        Severity.WARN,
                        host,
                        "host",
                        f"GPU model {bad[0].name} is not the inventory's {spec.model}",
                        "correct the inventory (placement and memory plans use it)",
                        tuple(f"gpu {d.index}: {d.name}" for d in bad),
                    )
                )
        if spec is not None and spec.memory_gib:
            small = [d for d in devices if d.memory_total and d.memory_total / 2**30 < spec.memory_gib * 0.9]
            if small:
                problems.append(
                    Finding(
                        "gpu.inventory",
                        Severity.WARN,
                        host,
                        "host",
                        f"GPU memory {(small[0].memory_total or 0) / 2**30:.0f} GiB is below the "
                        f"inventory's {spec.memory_gib:g} GiB",
                        "correct the inventory",
                    )
                )
        vbios = {d.vbios_version for d in devices if d.vbios_version}
        if len(vbios) > 1:
            problems.append(
                Finding(
                    "gpu.inventory",
                    Severity.WARN,
                    host,
                    "host",
                    f"mixed VBIOS versions on one host: {', '.join(sorted(map(str, vbios)))}",
                    "flash every GPU of the node to the same VBIOS",
                )
            )
        out.extend(
            problems
            or [
                Finding(
                    "gpu.inventory",
                    Severity.OK,
                    host,
                    "host",
                    f"{len(devices)} GPUs as the inventory says"
                    if spec
                    else f"{len(devices)} GPUs (host not in the inventory)",
                )
            ]
        )
    if len(drivers) > 1:
        common = max(drivers, key=lambda v: len(drivers[v]))
        for version, hosts in drivers.items():
            if version != common:
                for h in hosts:
                    out.append(
                        Finding(
                            "gpu.inventory",
                            Severity.WARN,
                            h,
                            "host",
                            f"driver {version} differs from the other hosts' {common}",
                            "install the same NVIDIA driver everywhere",
                        )
                    )
    return out


@analyzer("gpu.lost")
def check_lost(ctx: AnalysisContext) -> list[Finding]:
    """GPUs NVML reports as lost (GPU_IS_LOST) or whose calls hung."""
    out: list[Finding] = []
    for host, g, unknown in _hosts_with_facts(ctx, "gpu.lost"):
        if unknown:
            out.append(unknown)
            continue
        assert g is not None
        if not g.available:
            continue
        bad = []
        for d in g.devices:
            why = d.field_errors.get("device") or ""
            if d.lost:
                bad.append(
                    Finding(
                        "gpu.lost",
                        Severity.CRIT,
                        host,
                        _gpu(d),
                        "GPU has fallen off the bus (NVML: GPU is lost)",
                        "drain the node and power-cycle it; replace the GPU if it happens again",
                        (why,) if why else (),
                    )
                )
            elif d.hung:
                bad.append(
                    Finding(
                        "gpu.lost",
                        Severity.CRIT,
                        host,
                        _gpu(d),
                        "NVML calls on this GPU hang",
                        "drain the GPU's instances, reset the GPU (nvidia-smi -r) or reboot",
                        (why,) if why else (),
                    )
                )
        out.extend(bad or [Finding("gpu.lost", Severity.OK, host, "host", "no lost or hung GPU")])
    return out


def _ecc(ctx: AnalysisContext, host: str, d: GpuDevice) -> Iterable[Finding]:
    """Volatile uncorrected ECC -> CRIT; many corrected -> WARN; ECC supported but off -> WARN.

    With ECC off NVML's error counters read 0 whatever happens, so "no
    uncorrected errors" would be a claim on data never collected (NVML
    nvmlDeviceGetEccMode; data-centre GPUs ship with ECC on).  A GPU without
    ECC support (``enabled`` None) is not reported.
    """
    ecc = d.ecc
    if ecc.enabled is False and limits(ctx, d.name).get("ecc_required", True):
        later = " (enabled after the next reboot: pending mode on)" if ecc.pending_enabled else ""
        yield Finding(
            "gpu.ecc",
            Severity.WARN,
            host,
            _gpu(d),
            f"ECC is disabled{later}: memory errors are neither corrected nor counted (the ECC counters "
            "read 0 whatever happens)",
            "enable ECC (nvidia-smi -i N -e 1) and reset the GPU or reboot; drain its instances first",
            (f"ecc.enabled=False pending_enabled={ecc.pending_enabled}",),
        )
        return
    unc = ecc.volatile_uncorrected
    if unc:
        yield Finding(
            "gpu.ecc",
            Severity.CRIT,
            host,
            _gpu(d),
            f"{unc} uncorrected ECC errors since the driver loaded",
            f"{DRAIN}, reset the GPU and rerun; results computed since the error are suspect; replace if it recurs",
            (f"ecc.volatile.uncorrected={unc}",),
        )
    corr = ecc.volatile_corrected
    limit = number(limits(ctx, d.name), "ecc_corrected_volatile_warn", 50_000_000)
    if corr and corr > limit:
        yield Finding(
            "gpu.ecc",
            Severity.WARN,
            host,
            _gpu(d),
            f"{corr} corrected ECC errors since the driver loaded",
            "watch the trend; plan an RMA if it keeps climbing",
            (f"ecc.volatile.corrected={corr}",),
        )


def _remap(ctx: AnalysisContext, host: str, d: GpuDevice) -> Iterable[Finding]:
    """Row remapping: failure -> CRIT (replace), pending -> WARN (reset)."""
    rr = d.remapped_rows
    if not rr:
        return
    ev = (
        f"remapped_rows correctable={rr.correctable} uncorrectable={rr.uncorrectable} "
        f"pending={rr.pending} failure={rr.failure}",
    )
    if rr.failure:
        yield Finding(
            "gpu.remap",
            Severity.CRIT,
            host,
            _gpu(d),
            "row remapping failed (no spare rows left)",
            "drain the GPU and replace it (an RMA criterion; confirm with dcgmi diag -r 3)",
            ev,
        )
    elif rr.pending:
        yield Finding(
            "gpu.remap",
            Severity.WARN,
            host,
            _gpu(d),
            "a row remap is pending: the GPU keeps working, the remap applies at the next GPU reset",
            "reset the GPU at the next maintenance window to apply it (drain its instances first; nvidia-smi -r -i N)",
            ev,
        )


#: NVML's GPU recovery action -> (severity, what it means, what to do); NVIDIA's "Error Recovery
#: and Response Flags" (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html).
RECOVERY = {
    "reset": (
        Severity.CRIT,
        "the GPU hit a fault that needs a GPU reset to recover",
        "drain its instances, stop every process on it, reset it (nvidia-smi -r -i N), then start them again",
    ),
    "reboot": (
        Severity.CRIT,
        "the GPU hit a fault that may have left the OS in an inconsistent state",
        "drain the node's instances and reboot the node",
    ),
    "drain_p2p": (
        Severity.CRIT,
        "the GPU needs its peer-to-peer (NVLink/P2P) traffic drained",
        "drain the multi-GPU instances on it (TP groups); it can serve again once P2P traffic stopped",
    ),
    "drain_and_reset": (
        Severity.CRIT,
        "the GPU needs its peer-to-peer traffic drained and then a GPU reset",
        "drain the multi-GPU instances on it, stop its processes and reset it (nvidia-smi -r -i N)",
    ),
}


def _recovery(ctx: AnalysisContext, host: str, d: GpuDevice) -> Iterable[Finding]:
    """NVML's GPU recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``): anything but none -> CRIT
    with the action NVIDIA prescribes; the tp.group rollup then marks the GPU's group UNAVAILABLE."""
    action = d.recovery_action
    if action in (None, "none"):
        return
    sev, what, do = RECOVERY.get(
        str(action),
        (
            Severity.CRIT,
            f"NVML asks for recovery action {action}",
            "drain the GPU and look the action up in NVIDIA's NVML documentation",
        ),
    )
    yield Finding(
        "gpu.recovery", sev, host, _gpu(d), f"NVML recovery action {action}: {what}", do, (f"recovery_action={action}",)
    )


def _fabric(ctx: AnalysisContext, host: str, d: GpuDevice) -> Iterable[Finding]:
    """NVSwitch systems: a GPU not registered with the NVLink fabric cannot run multi-GPU work.

    ``fabric`` (nvmlDeviceGetGpuFabricInfo) is absent on GPUs without a fabric.
    State ``completed`` with status 0 is registered; anything else is CRIT, naming
    the fabric manager's state when the facts have it.
    """
    fab = d.fabric
    if not fab:
        return
    state, status = fab.state, fab.status
    if state == "completed" and not status:
        return
    g = ctx.fact(host, GpusFact)
    fm = g.fabric_manager if g else None
    fm_text = f"; nvidia-fabricmanager is {fm.active_state} ({fm.sub_state})" if fm and fm.active_state else ""
    what = (
        f"registration with the NVLink fabric failed (NVML status {status})"
        if state == "completed"
        else f"not registered with the NVLink fabric (state {state})"
    )
    yield Finding(
        "gpu.fabric",
        Severity.CRIT,
        host,
        _gpu(d),
        f"{what}: multi-GPU (TP) work cannot run on it{fm_text}",
        "start or restart the fabric manager (systemctl restart nvidia-fabricmanager; its log: "
        "/var/log/fabricmanager.log) and wait for state completed; the instance units Wants= it"
        + (fabric.node_setup_command([host]) if (fm.active_state if fm else None) != "active" else ""),
        (
            f"fabric state={state} status={status} clique={fab.clique_id}",
            *([f"nvidia-fabricmanager {fm.load_state}/{fm.active_state}"] if fm else []),
        ),
    )


def _retired(ctx: AnalysisContext, host: str, d: GpuDevice) -> Iterable[Finding]:
    """Retired pages (before Ampere): table full -> CRIT, many or pending -> WARN."""
    rp = d.retired_pages
    if not rp:
        return
    lim = limits(ctx, d.name)
    sbe, dbe = int(rp.single_bit_ecc or 0), int(rp.double_bit_ecc or 0)
    ev = (f"retired_pages sbe={sbe} dbe={dbe} pending={rp.pending}",)
    if rp.pending and sbe + dbe >= number(lim, "retired_pages_table_full", 62):
        yield Finding(
            "gpu.retired",
            Severity.CRIT,
            host,
            _gpu(d),
            "the page retirement table is full",
            "drain the GPU and replace it",
            ev,
        )
    elif max(sbe, dbe) > number(lim, "retired_pages_warn", 10):
        yield Finding(
            "gpu.retired",
            Severity.WARN,
            host,
            _gpu(d),
            f"{sbe + dbe} retired pages",
            "plan an RMA if the count keeps growing",
            ev,
        )
    elif rp.pending:
        yield Finding(
            "gpu.retired",
            Severity.WARN,
            host,
            _gpu(d),
            "a page retirement is pending",
            "reboot the node (or reset the GPU) to retire the page",
            ev,
        )


def _clocks(ctx: AnalysisContext, host: str, d: GpuDevice) -> Iterable[Finding]:
    """Hardware slowdown, thermal or power-brake clock reasons -> WARN."""
    cr = d.clocks_event_reasons
    active = set(cr.active)
    wanted = set(
        limits(ctx, d.name).get("clocks_warn_reasons")
        or ["hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    )
    hit = sorted(active & wanted)
    if hit:
        yield Finding(
            "gpu.clocks",
            Severity.WARN,
            host,
            _gpu(d),
            f"clocks slowed down: {', '.join(hit)}",
            "check cooling (fans, inlet air) and power supply; the GPU runs slower than it can",
            (f"clocks_event_reasons.mask={cr.mask}",),
        )


def _pcie(ctx: AnalysisContext, host: str, d: GpuDevice) -> Iterable[Finding]:
    """PCIe link narrower than its maximum (or slower gen while busy); replays rising."""
    p = d.pcie
    w, mw, gen, mg = p.width, p.max_width, p.gen, p.max_gen
    busy = (d.utilization_gpu or 0) > 0
    if w and mw and w < mw:
        yield Finding(
            "gpu.pcie",
            Severity.WARN,
            host,
            _gpu(d),
            f"PCIe link x{w}, below its maximum x{mw}",
            "reseat the GPU or riser at the next window; replace if it stays degraded",
            (f"pcie width={w} max_width={mw} gen={gen} max_gen={mg}",),
        )
    elif busy and gen and mg and gen < mg:
        yield Finding(
            "gpu.pcie",
            Severity.WARN,
            host,
            _gpu(d),
            f"PCIe gen {gen} while busy, below its maximum {mg}",
            "check BIOS PCIe settings and the riser",
            (f"pcie gen={gen} max_gen={mg}",),
        )
    replay = p.replay_counter
    later = _sample_device(ctx, host, int(d.index or 0))
    if later is not None and replay is not None:
        after = later.pcie.replay_counter
        if after is not None and after > replay:
            yield Finding(
                "gpu.pcie",
                Severity.WARN,
                host,
                _gpu(d),
                f"PCIe replays rising: +{after - replay} in {ctx.interval_s:g} s",
                "a marginal PCIe link: reseat the GPU; replace if it continues",
                (f"replay_counter {replay} -> {after}",),
            )
    elif replay:
        yield Finding(
            "gpu.pcie",
            Severity.WARN,
            host,
            _gpu(d),
            f"{replay} PCIe replays since the driver loaded",
            "run doctor again to see whether they are rising",
            (f"replay_counter={replay}",),
        )


def _nvlink(ctx: AnalysisContext, host: str, d: GpuDevice) -> Iterable[Finding]:
    """NVLink links down -> CRIT; error counters (rising, or non-zero) -> WARN."""
    yield from _nvlink_topology(ctx, host, d)
    links = d.nvlink
    down = [lk for lk in links if lk.state != "active"]
    if down:
        yield Finding(
            "gpu.nvlink",
            Severity.CRIT,
            host,
            _gpu(d),
            f"{len(down)} of {len(links)} NVLink links down",
            f"{DRAIN}; check `nvidia-smi nvlink -s`, reset the GPU, replace if links stay down",
            tuple(f"link {lk.link}: {lk.state}" for lk in down),
        )
    sample = _sample_device(ctx, host, int(d.index or 0))
    later = {lk.link: lk for lk in (sample.nvlink if sample else ())}
    errs = []
    for lk in links:
        base = lk.errors
        if later:
            theirs = later.get(lk.link)
            after = theirs.errors if theirs else {}
            rise = {k: after[k] - v for k, v in base.items() if k in after and after[k] > v}
        else:
            rise = {k: v for k, v in base.items() if v}
        if rise:
            errs.append(f"link {lk.link}: " + ", ".join(f"{k} +{v}" for k, v in sorted(rise.items())))
    if errs:
        yield Finding(
            "gpu.nvlink",
            Severity.WARN,
            host,
            _gpu(d),
            "NVLink error counters " + ("rising" if later else "non-zero"),
            "watch the trend; reset the GPU if they keep rising, replace if they persist",
            tuple(errs),
        )


def _nvlink_pairs(ctx: AnalysisContext, host: str) -> dict[tuple[int, int], tuple[int, int | None]]:
    """GPU pairs of ``host`` with fewer bonded NVLinks than expected: pair -> (links, expected).

    Read from ``gpus.topology`` entries that carry ``nvlinks`` (``nvidia-smi topo -m``).  Expected:
    the most any other host with the same GPU model and count has between the same two GPUs; on a
    host whose inventory says ``interconnect: nvlink``, a GPU with no NVLink to any other GPU is
    short of at least one (expected None)."""

    def pairs(h: str) -> tuple[dict[tuple[int, int], int], tuple[str, ...]]:
        g = ctx.fact(h, GpusFact)
        if g is None:
            return {}, ()
        return {t.gpus: t.nvlinks for t in g.topology}, tuple(str(d.name) for d in g.devices)

    mine, model = pairs(host)
    if not mine:
        return {}
    want: dict[tuple[int, int], int] = {}
    for other in sources.all_hosts(ctx):
        theirs, their_model = pairs(other) if other != host and other not in ctx.missing else ({}, ())
        if theirs and their_model == model:
            for k, n in theirs.items():
                want[k] = max(want.get(k, 0), n)
    short: dict[tuple[int, int], tuple[int, int | None]] = {
        k: (n, want[k]) for k, n in mine.items() if want.get(k, 0) > n
    }
    inv = ctx.inventory
    if inv is not None and host in inv.hosts and inv.hosts[host].gpus.interconnect == "nvlink":
        gpus = {i for k in mine for i in k}
        for i in gpus:
            if not any(n for k, n in mine.items() if i in k):
                short.update({k: (n, want.get(k)) for k, n in mine.items() if i in k and k not in short})
    return short


def _nvlink_topology(ctx: AnalysisContext, host: str, d: GpuDevice) -> Iterable[Finding]:
    """GPU pairs with fewer NVLinks than the same pair on the other hosts of this GPU model (or
    none where the inventory says NVLink): links down, the same fault as an inactive link.
    A pair short of links is named once, under the GPU with more such pairs (a GPU that lost
    its links is short to every peer)."""
    short = _nvlink_pairs(ctx, host)
    if not short:
        return
    count: dict[int, int] = {}
    for a, b in short:
        count[a], count[b] = count.get(a, 0) + 1, count.get(b, 0) + 1
    me = int(d.index or 0)
    mine = sorted(
        (b if a == me else a, n, w)
        for (a, b), (n, w) in short.items()
        if me in (a, b) and (count[me], -me) > (count[b if a == me else a], -(b if a == me else a))
    )
    if not mine:
        return
    peers = ",".join(str(p) for p, _, _ in mine)
    wants = {w for _, _, w in mine if w}
    why = f"other hosts with this GPU model have NV{max(wants)}" if wants else "the inventory says interconnect: nvlink"
    yield Finding(
        "gpu.nvlink",
        Severity.CRIT,
        host,
        _gpu(d),
        f"{'no NVLink' if not any(n for _, n, _ in mine) else 'fewer NVLinks'} to GPU(s) {peers} "
        f"({why}): NVLinks down, traffic between them goes over PCIe",
        f"{DRAIN}; check `nvidia-smi nvlink -s` and the fabric manager, reset the GPU, replace if links stay down",
        tuple(
            f"GPU {me}-{p}: {'NV%d' % n if n else 'no NVLink'}" + (f", expected NV{w}" if w else "") for p, n, w in mine
        ),
    )


def _thermal(ctx: AnalysisContext, host: str, d: GpuDevice) -> Iterable[Finding]:
    """Temperature above the model's thresholds; power draw above the enforced limit."""
    lim = limits(ctx, d.name)
    t = d.temperature_c
    if t is not None:
        crit, warn = number(lim, "temperature_crit_c", 92), number(lim, "temperature_warn_c", 85)
        if t >= crit or t >= warn:
            yield Finding(
                "gpu.thermal",
                Severity.CRIT if t >= crit else Severity.WARN,
                host,
                _gpu(d),
                f"temperature {t} C (limit {warn:g}/{crit:g} C)",
                "check fans, airflow and inlet temperature",
                (f"temperature_c={t}",),
            )
    pw, pl = d.power_w, d.power_limit_w
    if pw is not None and pl and pw > pl * number(lim, "power_warn_fraction", 1.0):
        yield Finding(
            "gpu.thermal",
            Severity.WARN,
            host,
            _gpu(d),
            f"power {pw:.0f} W above the limit {pl:.0f} W",
            "check the power supply and the power limit setting",
            (f"power_w={pw} power_limit_w={pl}",),
        )


def _persistence(ctx: AnalysisContext, host: str, d: GpuDevice) -> Iterable[Finding]:
    """Persistence mode off -> WARN (slow starts, lost state between processes)."""
    if d.persistence_mode is False and limits(ctx, d.name).get("persistence_mode_required", True):
        yield Finding(
            "gpu.persistence",
            Severity.WARN,
            host,
            _gpu(d),
            "persistence mode is off",
            "enable nvidia-persistenced (systemctl enable --now nvidia-persistenced)"
            + fabric.node_setup_command([host]),
        )


for _name, _fn, _ok in (
    ("gpu.ecc", _ecc, "no uncorrected ECC errors"),
    ("gpu.remap", _remap, "no pending or failed row remaps"),
    ("gpu.recovery", _recovery, "NVML asks for no recovery action"),
    ("gpu.fabric", _fabric, "registered with the NVLink fabric, or no fabric"),
    ("gpu.retired", _retired, "retired pages within limits"),
    ("gpu.clocks", _clocks, "no hardware slowdown"),
    ("gpu.pcie", _pcie, "PCIe links at full width"),
    ("gpu.nvlink", _nvlink, "NVLink links up, no errors"),
    ("gpu.thermal", _thermal, "temperature and power within limits"),
    ("gpu.persistence", _persistence, "persistence mode on"),
):
    analyzer(_name)(per_gpu(_name, _fn, _ok))
