"""Data-network checks: the inventory's data NICs as the facts show them.

Check ``net.data``, per data NIC of the inventory (role ``data``):

- present in the facts, link up (``operstate``; the RDMA port ``ACTIVE``) —
  CRIT when missing or down;
- link speed against the inventory's ``speed_gbps``: slower — WARN; gigabit
  or less — WARN "for debugging only" (``checks/roce.yaml``
  ``datanet.debug_only_speed_mbps``);
- MTU against the fabric profile's ``mtu`` — WARN, naming the odd one out;
- an RDMA device expected (``rdma_device``) but none behind the netdev — CRIT;
  on RoCE, no ``RoCE v2`` GID — CRIT (NCCL picks RoCE v2 GIDs); on
  InfiniBand, the port's rate against the inventory — WARN.

Check ``host.rdma_prereqs``: ``/dev/shm`` smaller than
``datanet.shm_min_bytes`` (NCCL's shared-memory transport) — WARN; a GPU
with no data NIC on its NUMA node (GPUDirect RDMA then crosses the
inter-socket link) — WARN.  From the facts' ``rdma_prereqs`` and ``units``
(docs/facts.md), on hosts with GPUs where GPUDirect RDMA is used (an RDMA NIC
on a RoCE/IB fabric, or an instance spanning hosts placed there):

- nvidia-peermem (nv_peer_mem) not loaded — WARN, ``modprobe nvidia-peermem``
  (NCCL then stages through host memory); not readable — UNKNOWN;
- PCIe ACS request/completion redirect on a switch port between a GPU and a
  RDMA NIC — WARN (peer-to-peer goes up through the root complex); not
  readable (non-root probe, no lspci) — UNKNOWN;
- the IOMMU translating DMA (groups of type DMA/DMA-FQ and no ``iommu=pt``) — WARN;
- a vLLM unit's ``LimitMEMLOCK`` not ``infinity`` — WARN (RDMA memory
  registration fails or is capped); the probe's own limit is only context.

Without an inventory there is nothing to compare against and these checks
return no findings.
"""

from __future__ import annotations


from clusterctl.diagnose import fabric
from clusterctl.diagnose.evidence import is_partial
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.diagnose.sources import instances, unit_name
from clusterctl.probe.factgroups import (
    GpusFact,
    HostFact,
    Nic,
    NicsFact,
    RdmaPrereqs,
    RdmaPrereqsFact,
    Unit,
    UnitsFact,
)

CHECK = "net.data"
PREREQS = "host.rdma_prereqs"


def _nic(ctx: AnalysisContext, host: str, netdev: str) -> Nic | None:
    nics = ctx.fact(host, NicsFact)
    return nics.get(netdev) if nics is not None else None


def _gbps(mbps: float) -> str:
    return f"{mbps / 1000:g} Gb/s" if mbps >= 1000 else f"{mbps:g} Mb/s"


@analyzer(CHECK)
def check_data_nics(ctx: AnalysisContext) -> list[Finding]:
    """Data NICs: present, up, speed, MTU, RDMA port and GIDs."""
    inv = ctx.inventory
    if inv is None:
        return []
    prof = fabric.profile(ctx)
    debug_mbps = fabric.limit(ctx, "datanet", "debug_only_speed_mbps", 1000)
    out: list[Finding] = []
    mtus: dict[str, int] = {}
    for host in fabric.hosts(ctx):
        if host not in inv.hosts:
            continue
        for spec in inv.hosts[host].nics_with_role("data"):
            n = _nic(ctx, host, spec.netdev)
            if n is not None and n.mtu:
                mtus.setdefault(host, n.mtu)
    for host in fabric.hosts(ctx):
        if host not in inv.hosts:
            continue
        specs = inv.hosts[host].nics_with_role("data")
        read = ctx.fact(host, NicsFact)
        if specs and read is not None and not read.read:
            out.append(
                Finding(
                    CHECK,
                    Severity.UNKNOWN,
                    host,
                    "host",
                    "cannot check the data NICs: " + "; ".join(read.reasons),
                    "run doctor again with this clusterctl's probe",
                )
            )
            continue
        bad = False
        for spec in specs:
            subj = f"nic:{spec.netdev}"
            n = _nic(ctx, host, spec.netdev)
            if n is None and is_partial(ctx.facts[host]):
                continue  # raw outputs that do not show this NIC: "not checked" (evidence.not_checked), not missing
            if n is None:
                out.append(
                    Finding(
                        CHECK,
                        Severity.CRIT,
                        host,
                        subj,
                        f"{spec.netdev}: the inventory's data NIC does not exist on this host",
                        "fix the inventory's netdev name or the host's interface naming",
                    )
                )
                bad = True
                continue
            rdma = n.rdma
            if n.operstate not in (None, "up", "unknown") or (rdma.state if rdma else None) not in (None, "ACTIVE"):
                out.append(
                    Finding(
                        CHECK,
                        Severity.CRIT,
                        host,
                        subj,
                        f"{spec.netdev}: link down (operstate {n.operstate}, RDMA port "
                        f"{(rdma.state if rdma else None) or 'none'})",
                        "check the cable, transceiver and switch port of this NIC",
                        (f"phys_state {rdma.phys_state if rdma else None}",),
                    )
                )
                bad = True
                continue
            speed = n.speed_mbps
            if speed is not None and speed <= debug_mbps:
                out.append(
                    Finding(
                        CHECK,
                        Severity.WARN,
                        host,
                        subj,
                        f"{spec.netdev}: {_gbps(speed)} link: gigabit is for debugging only",
                        "use a 100 Gb/s or faster NIC for tensor-parallel traffic across hosts",
                    )
                )
                bad = True
            elif speed is not None and spec.speed_gbps and speed < spec.speed_gbps * 1000:
                out.append(
                    Finding(
                        CHECK,
                        Severity.WARN,
                        host,
                        subj,
                        f"{spec.netdev}: link at {_gbps(speed)}, the inventory says {spec.speed_gbps:g} Gb/s",
                        "check the cable and the switch port's speed; reseat the transceiver",
                    )
                )
                bad = True
            if n.mtu and prof.kind == "roce" and n.mtu != prof.mtu:
                rel = fabric.odd_one_out(mtus, host, prof.mtu)
                out.append(
                    Finding(
                        CHECK,
                        Severity.WARN,
                        host,
                        subj,
                        f"{host} {spec.netdev}: MTU {n.mtu}; {rel}",
                        f"set MTU {prof.mtu} on {spec.netdev} and its switch port "
                        "(RoCE uses the largest of 256..4096 that fits)"
                        + fabric.node_setup_command([host])
                        + " on the host",
                    )
                )
                bad = True
            if spec.rdma_device and not rdma:
                out.append(
                    Finding(
                        CHECK,
                        Severity.CRIT,
                        host,
                        subj,
                        f"{spec.netdev}: no RDMA device behind it (the inventory says {spec.rdma_device})",
                        "load mlx5_ib / check the driver stack; NCCL falls back to TCP sockets",
                    )
                )
                bad = True
            elif rdma and rdma.link_layer == "Ethernet" and prof.kind == "roce":
                if not any("RoCE v2" in str(g.type) for g in rdma.gids):
                    out.append(
                        Finding(
                            CHECK,
                            Severity.CRIT,
                            host,
                            subj,
                            f"{spec.netdev}: no RoCE v2 GID on {rdma.device} port {rdma.port}",
                            "give the data NIC an IP address (GIDs follow addresses) and check that RoCE v2 is enabled",
                        )
                    )
                    bad = True
            elif (
                rdma
                and rdma.link_layer == "InfiniBand"
                and spec.speed_gbps
                and rdma.rate_gbps
                and rdma.rate_gbps < spec.speed_gbps
            ):
                out.append(
                    Finding(
                        CHECK,
                        Severity.WARN,
                        host,
                        subj,
                        f"{spec.netdev}: InfiniBand port at {rdma.rate_gbps:g} Gb/s, the "
                        f"inventory says {spec.speed_gbps:g} Gb/s",
                        "check the cable and the switch port",
                        (str(rdma.rate),),
                    )
                )
                bad = True
        if specs and not bad:
            out.append(Finding(CHECK, Severity.OK, host, "host", "data NICs up at the expected speed"))
    return out


@analyzer(PREREQS)
def check_prereqs(ctx: AnalysisContext) -> list[Finding]:
    """RDMA prerequisites the facts show: /dev/shm size."""
    want = int(fabric.limit(ctx, "datanet", "shm_min_bytes", 1 << 30))
    out: list[Finding] = []
    for host in fabric.hosts(ctx):
        info = ctx.fact(host, HostFact)
        shm = info.mount("/dev/shm") if info is not None else None
        if shm is None or shm.total_bytes is None:
            out.append(
                Finding(
                    PREREQS,
                    Severity.UNKNOWN,
                    host,
                    "host",
                    "/dev/shm size not in the facts",
                    "check that /dev/shm is mounted (tmpfs)",
                )
            )
        elif shm.total_bytes < want:
            out.append(
                Finding(
                    PREREQS,
                    Severity.WARN,
                    host,
                    "host",
                    f"/dev/shm is {shm.total_bytes / 2**20:.0f} MiB (NCCL wants at least {want / 2**30:g} GiB)",
                    "mount /dev/shm larger (tmpfs size=...), or give the vLLM units a larger one",
                )
            )
        else:
            out.append(Finding(PREREQS, Severity.OK, host, "host", "/dev/shm large enough"))
        out.extend(_numa(ctx, host))
        if _uses_gpudirect(ctx, host):
            out.extend(_peermem(ctx, host))
            out.extend(_acs(ctx, host))
            out.extend(_iommu(ctx, host))
        out.extend(_memlock(ctx, host))
    return out


def _spanning_hosts(ctx: AnalysisContext) -> set[str]:
    return {h for i in instances(ctx.inventory) if len(i.hosts) > 1 for h in i.hosts}


def _uses_gpudirect(ctx: AnalysisContext, host: str) -> bool:
    """A host with GPUs whose NCCL traffic goes GPUDirect RDMA: one that carries a
    member of an instance spanning hosts.  Instances within one host talk over
    NVLink or PCIe P2P and never need peer memory, so a fleet of single-host
    instances is not warned about it."""
    gpus = ctx.fact(host, GpusFact)
    if gpus is None or not gpus.devices:
        return False
    return host in _spanning_hosts(ctx)


def _prereqs(ctx: AnalysisContext, host: str) -> RdmaPrereqs:
    """The host's ``rdma_prereqs`` (every part None without facts)."""
    return ctx.fact(host, RdmaPrereqsFact) or RdmaPrereqs(None, None, None, None)


def _peermem(ctx: AnalysisContext, host: str) -> list[Finding]:
    pre = _prereqs(ctx, host)
    pm = pre.peer_memory
    if pm is None or pm.loaded is None:
        why = (
            pm.reason
            if pm is not None
            else "; ".join(pre.reasons) or "the facts have no rdma_prereqs (an older collector)"
        )
        return [
            Finding(
                PREREQS,
                Severity.UNKNOWN,
                host,
                "peermem",
                f"whether nvidia-peermem is loaded is not known: {why}",
                "check with lsmod | grep peermem on the host",
            )
        ]
    if not pm.loaded:
        return [
            Finding(
                PREREQS,
                Severity.WARN,
                host,
                "peermem",
                f"nvidia-peermem is not loaded ({pm.source}): GPUDirect RDMA is off, NCCL "
                "stages GPU buffers through host memory",
                "modprobe nvidia-peermem (and list it in /etc/modules-load.d)",
            )
        ]
    return [Finding(PREREQS, Severity.OK, host, "peermem", f"{pm.module} loaded")]


def _acs(ctx: AnalysisContext, host: str) -> list[Finding]:
    pairs = _prereqs(ctx, host).acs
    if pairs is None:
        return []
    redirect: dict[str, list[str]] = {}
    unknown: list[str] = []
    for pair in pairs:
        for b in pair.bridges:
            what = f"GPU {pair.gpu} - {pair.netdev}"
            if b.redirect:
                redirect.setdefault(str(b.pci_address), []).append(what)
            elif b.redirect is None:
                unknown.append(f"{b.pci_address}: {b.reason}")
    if redirect:
        ev = tuple(f"{addr} ({', '.join(sorted(set(w)))}): ACS redirect on" for addr, w in sorted(redirect.items()))
        return [
            Finding(
                PREREQS,
                Severity.WARN,
                host,
                "pcie",
                f"PCIe ACS redirects peer-to-peer on {len(redirect)} switch port(s) between GPUs and "
                "RDMA NICs: GPUDirect RDMA goes up through the root complex",
                "disable ACS request/completion redirect on those switch ports (setpci at boot, or "
                "the BIOS's ACS setting); keep it where VMs need isolation",
                ev,
            )
        ]
    if unknown:
        return [
            Finding(
                PREREQS,
                Severity.UNKNOWN,
                host,
                "pcie",
                "PCIe ACS on the GPU-NIC switch ports is not readable",
                "run the probe as root (the ACS capability is past the first 256 bytes of config "
                "space) or install pciutils",
                tuple(sorted(set(unknown))),
            )
        ]
    if pairs:
        return [
            Finding(
                PREREQS,
                Severity.OK,
                host,
                "pcie",
                "no ACS redirect between GPUs and RDMA NICs that share a PCIe switch",
            )
        ]
    return []


def _iommu(ctx: AnalysisContext, host: str) -> list[Finding]:
    io = _prereqs(ctx, host).iommu
    if io is None or not io.translated_groups:
        return []
    cmdline = io.cmdline
    if any(w in ("iommu=pt", "iommu.passthrough=1", "iommu=off", "intel_iommu=off", "amd_iommu=off") for w in cmdline):
        return []
    return [
        Finding(
            PREREQS,
            Severity.WARN,
            host,
            "iommu",
            f"the IOMMU translates DMA ({io.translated_groups} of {io.groups} groups in DMA "
            "mode): GPUDirect RDMA between GPU and NIC may fail or slow down",
            "boot with iommu=pt (passthrough), or disable the IOMMU where it is not needed",
            (f"kernel command line: {' '.join(cmdline) or 'no iommu parameters'}",),
        )
    ]


def _vllm_units(ctx: AnalysisContext, host: str) -> list[Unit]:
    """The host's clusterctl units that run vLLM instances (the inventory's, else all)."""
    read = ctx.fact(host, UnitsFact)
    names = {unit_name(i.name) for i in instances(ctx.inventory)}
    return [u for u in (read.units if read is not None else ()) if not names or u.unit in names]


def _memlock(ctx: AnalysisContext, host: str) -> list[Finding]:
    units = [u for u in _vllm_units(ctx, host) if u.limit_memlock_read]
    out = []
    for u in units:
        lim = u.limit_memlock
        if lim is not None and lim != "infinity":
            out.append(
                Finding(
                    PREREQS,
                    Severity.WARN,
                    host,
                    f"unit:{u.unit}",
                    f"{u.unit}: LimitMEMLOCK={lim} bytes ({int(lim) / 2**20:g} MiB): RDMA "
                    "memory registration is capped",
                    "set LimitMEMLOCK=infinity in the unit (clusterctl's deploy templates do) and restart it",
                )
            )
    if units and not out:
        out.append(Finding(PREREQS, Severity.OK, host, "memlock", "vLLM units may lock unlimited memory"))
    placed = any(host in i.hosts for i in instances(ctx.inventory))
    read = ctx.fact(host, UnitsFact)
    if not units and placed and read is not None and read.read:
        own = _prereqs(ctx, host).probe_memlock
        soft = own.soft_bytes if own is not None else None
        ctxline = (
            "unlimited"
            if soft is None and own is not None and own.soft_read
            else (f"{soft} bytes" if soft is not None else "not known")
        )
        # Nothing deployed here yet: nothing to check (not "could not check"); serving.* reports the
        # missing instance.  The probe's own limit is a login session's, never the unit's.
        out.append(
            Finding(
                PREREQS,
                Severity.OK,
                host,
                "memlock",
                "no vLLM unit deployed on this host yet: LimitMEMLOCK not applicable",
                "deploy the instance (its unit sets LimitMEMLOCK=infinity); doctor reads it then",
                (f"the probe's own memlock limit (a login session's, not the unit's): {ctxline}",),
            )
        )
    return out


def _numa(ctx: AnalysisContext, host: str) -> list[Finding]:
    """GPUs whose NUMA node has no data NIC (only where the NICs' nodes are known)."""
    inv = ctx.inventory
    if inv is not None and host in inv.hosts:
        names = {n.netdev for n in inv.hosts[host].nics_with_role("data")}
        read = ctx.fact(host, NicsFact)
        nics = [n for n in (read.nics if read is not None else ()) if n.netdev in names]
    else:
        nics = fabric.roce_nics(ctx, host)
    nodes = {n.numa_node for n in nics if n.numa_node is not None}
    section = ctx.fact(host, GpusFact)
    gpus = [g for g in (section.devices if section is not None else ()) if g.numa_node is not None]
    if not nodes or not gpus:
        return []
    out = []
    for g in gpus:
        if g.numa_node not in nodes:
            out.append(
                Finding(
                    PREREQS,
                    Severity.WARN,
                    host,
                    f"gpu:{g.index}",
                    f"GPU {g.index} is on NUMA node {g.numa_node}, the data NICs on "
                    f"node(s) {','.join(map(str, sorted(nodes)))}: GPUDirect RDMA crosses the "
                    "inter-socket link",
                    "put a data NIC on each GPU's NUMA node (or pin NCCL_IB_HCA per GPU)",
                    tuple(f"{n.netdev}: NUMA node {n.numa_node}" for n in nics),
                )
            )
    if not out:
        out.append(Finding(PREREQS, Severity.OK, host, "host", "every GPU has a data NIC on its NUMA node"))
    return out
