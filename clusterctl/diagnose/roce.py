"""RoCE counter checks: rates of the mlx5 PFC, drop, congestion, transport and
link counters between two samples of each host's RoCE NICs, and how they
spread across hosts and leaf switches.

Checks (``--checks roce`` selects them all):

- ``roce.pfc``: fraction of each second a port was paused per priority
  (``rx_prioN_pause_duration``, µs) and pause frames it sent
  (``tx_prioN_pause_duration``), the NIC's pause-storm watchdog events
  (``tx_pause_storm_warning_events`` WARN, ``tx_pause_storm_error_events``
  CRIT), 802.3x global pause frames.  One host paused points at that host or
  its cable; every host under one leaf points at the leaf switch.
- ``roce.discards``: drops on the lossless priority (``rx_prioN_discards``,
  ``rx_prioN_buf_discard``, ``rx_prioN_cong_discard``: CRIT) and port-wide
  ``rx_discards_phy`` (lossy traffic included: WARN).
- ``roce.congestion``: CNPs sent (``np_cnp_sent``: this host receives
  ECN-marked traffic, an incast victim) and handled (``rp_cnp_handled``: its
  senders are slowed) as rates against per-speed thresholds, outliers among
  hosts, ECN marks with no CNP sent, CNPs ignored; grouped by leaf.
- ``roce.transport``: retries exceeded (CRIT: the connection failed), sequence
  errors, ACK timeouts, retransmissions, ICRC errors (loss: WARN), RNR NAKs
  (a receiver not ready, not loss: WARN) (``hw_counters``).
- ``roce.link``: link flaps (``link_down_events_phy``) and symbol/CRC errors.
- ``roce.rxpath``: PCIe back-pressure (``outbound_pci_buffer_overflow``,
  ``outbound_pci_stalled_*_events``), RDMA receives without a posted buffer
  (``out_of_buffer``), and a pre-FEC error rate (``rx_corrected_bits_phy``)
  far above the other hosts'.
- ``roce.priority``: RDMA bytes sent that do not show up on the RoCE priority.

Rates come from the NIC's ``samples`` in the facts (timed on the node), else
from two facts runs (``ctx.samples``); a host with neither gets UNKNOWN.  A
counter the NIC does not have is not checked (never read as 0); a counter
that went down (reset) has no rate for that interval.  Thresholds:
``checks/roce.yaml``; each check and action: ``docs/doctor-roce.md``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from clusterctl.diagnose import fabric
from clusterctl.diagnose.counters import Rates, nic_rates
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.probe.factgroups import Nic, NicsFact

#: Seconds between the two counter samples ``doctor`` asks the probe for.
DEFAULT_COUNTER_INTERVAL_S = 3.0


@dataclass
class NicRates:
    host: str
    nic: Nic
    rates: Rates
    gbps: float | None

    @property
    def name(self) -> str:
        return str(self.nic.netdev)


@dataclass
class NicProblem:
    """One thing wrong on one NIC; ``symptom`` (e.g. ``rx-pause``) groups hosts by leaf."""

    severity: Severity
    nic: str
    message: str
    action: str
    evidence: tuple[str, ...] = ()
    symptom: str | None = None


@dataclass
class Gathered:
    nics: list[NicRates] = field(default_factory=list)
    unknown: dict[str, str] = field(default_factory=dict)
    #: hosts with rates for some NICs: "netdev: why" for the others
    unknown_nics: dict[str, list[str]] = field(default_factory=dict)

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(n.host for n in self.nics))


def expected_rdma(ctx: AnalysisContext, host: str) -> list[str]:
    """Data NICs with an RDMA device the inventory lists for ``host``."""
    inv = ctx.inventory
    if inv is None or host not in inv.hosts:
        return []
    return [n.netdev for n in inv.hosts[host].nics if n.role == "data" and n.rdma_device]


def gather(ctx: AnalysisContext) -> Gathered:
    """Rates of every RoCE NIC of every host with facts; why not, per host."""
    out = Gathered()
    for host in fabric.hosts(ctx):
        read = ctx.fact(host, NicsFact)
        if read is not None and not read.read:
            out.unknown[host] = "the facts' NIC section is unreadable: " + "; ".join(read.reasons)
            continue
        nics = read.roce if read is not None else []
        if not nics:
            want = expected_rdma(ctx, host)
            if want:
                out.unknown[host] = f"no RoCE NIC in the facts (the inventory lists {', '.join(want)})"
            continue
        reasons = []
        for nic in nics:
            r, why = nic_rates(nic, ctx.fact(host, NicsFact, sample=True), read, ctx.interval_s)
            if r is None:
                reasons.append(f"{nic.netdev}: {why}")
            else:
                out.nics.append(NicRates(host, nic, r, nic.gbps))
        if reasons and host not in {n.host for n in out.nics}:
            out.unknown[host] = "; ".join(reasons)
        elif reasons:
            out.unknown_nics[host] = reasons
    return out


def per_s(x: float) -> str:
    return f"{x:,.0f}/s" if x >= 10 else f"{x:.2g}/s"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


PerNic = Callable[[AnalysisContext, NicRates, Gathered], Iterable[NicProblem]]


def run_check(
    ctx: AnalysisContext, check: str, per_nic: PerNic, ok_message: str, symptoms: dict[str, str] | None = None
) -> list[Finding]:
    """Run ``per_nic`` on every NIC; one finding per problem (actions pointing at
    the leaf switch where a whole leaf shares a symptom), an OK per clean host,
    an UNKNOWN per host without rates, and one finding per affected leaf."""
    if not fabric.is_roce_fabric(ctx):
        return []
    g = gather(ctx)
    problems: dict[str, list[NicProblem]] = {}
    for nr in g.nics:
        problems.setdefault(nr.host, []).extend(per_nic(ctx, nr, g))
    out: list[Finding] = []
    verdicts = {}
    for symptom, text in (symptoms or {}).items():
        hit = [h for h, ps in problems.items() if any(p.symptom == symptom for p in ps)]
        v = fabric.by_leaf(ctx, g.hosts, hit)
        verdicts[symptom] = v
        for leaf, hs in v.leaves.items():
            sev = max((p.severity for h in hs for p in problems[h] if p.symptom == symptom), key=lambda s: s.rank)
            out.append(
                Finding(
                    check,
                    sev,
                    None,
                    f"leaf:{leaf}",
                    f"every host under {leaf} ({fabric.folded(hs)}) shows {text}: the leaf switch, not one host",
                    f"look at the leaf switch {leaf} (its ports, buffers, uplinks and "
                    "PFC/ECN settings); the hosts under other leaves do not show it",
                    tuple(f"{h}: {p.message}" for h in hs for p in problems[h] if p.symptom == symptom),
                )
            )
    for host in g.hosts:
        ps = problems.get(host, [])
        if not ps:
            out.append(Finding(check, Severity.OK, host, "host", ok_message))
        for p in ps:
            action = p.action
            if p.symptom in verdicts:
                action = fabric.host_action(verdicts[p.symptom], ctx, host, p.action, (symptoms or {})[p.symptom])
            out.append(Finding(check, p.severity, host, f"nic:{p.nic}", p.message, action, p.evidence))
    again = (
        "run doctor again (the probe samples the NIC counters twice); "
        "check that ethtool and /sys/class/infiniband are readable"
    )
    for host, why in g.unknown.items():
        out.append(Finding(check, Severity.UNKNOWN, host, "host", f"cannot check: {why}", again))
    for host, whys in g.unknown_nics.items():
        for why in whys:
            out.append(
                Finding(check, Severity.UNKNOWN, host, f"nic:{why.split(':', 1)[0]}", f"cannot check {why}", again)
            )
    return out


def _ev(r: Rates, *names: str) -> tuple[str, ...]:
    out = []
    for n in names:
        for key in (n, "hw:" + n, "ib:" + n):
            if key in r.deltas:
                out.append(f"{n} +{r.deltas[key]} in {r.dt:.1f} s")
                break
    return tuple(out)


# ------------------------------------------------------------------ roce.pfc


def _pfc(ctx: AnalysisContext, nr: NicRates, g: Gathered) -> Iterable[NicProblem]:
    r = nr.rates
    roce = fabric.profile(ctx).pfc_priority
    warn = fabric.limit(ctx, "pfc", "paused_fraction_warn", 0.2)
    crit = fabric.limit(ctx, "pfc", "paused_fraction_crit", 0.8)
    twarn = fabric.limit(ctx, "pfc", "tx_paused_fraction_warn", 0.2)
    tcrit = fabric.limit(ctx, "pfc", "tx_paused_fraction_crit", 0.8)
    row = fabric.speed_row(ctx, nr.gbps)
    for prio in [*range(8), "global"]:
        p = f"prio{prio}" if prio != "global" else "global"
        where = f"priority {prio}" if prio != "global" else "802.3x global pause"
        dur, frames = r.get(f"rx_{p}_pause_duration"), r.get(f"rx_{p}_pause")
        frac = dur / 1e6 if dur is not None else None
        if (
            frac is not None
            and frac >= warn
            or frac is None
            and frames is not None
            and frames >= row["pause_per_s_warn"]
        ):
            sev = Severity.CRIT if frac is not None and frac >= crit else Severity.WARN
            what = (
                f"paused {pct(min(frac, 1.0))} of the time"
                if frac is not None
                else f"receiving {per_s(frames or 0)} pause frames"
            )
            yield NicProblem(
                sev,
                nr.name,
                f"{nr.name}: {what} on {where} ({per_s(frames or 0)} pause frames received"
                + (", a pause storm" if sev == Severity.CRIT else "")
                + ")",
                "the switch is holding back this host's transmit: check this host's cable "
                "and switch port, and what congests the egress towards its peers",
                _ev(r, f"rx_{p}_pause", f"rx_{p}_pause_duration"),
                symptom="rx-pause" if prio == roce else None,
            )
        tdur, tframes = r.get(f"tx_{p}_pause_duration"), r.get(f"tx_{p}_pause")
        tfrac = tdur / 1e6 if tdur is not None else None
        if tfrac is not None and tfrac >= twarn:
            sev = Severity.CRIT if tfrac >= tcrit else Severity.WARN
            yield NicProblem(
                sev,
                nr.name,
                f"{nr.name}: sending pause {pct(min(tfrac, 1.0))} of the time on {where} "
                f"({per_s(tframes or 0)} pause frames sent)",
                "this NIC cannot drain what it receives: check its PCIe link "
                "(outbound_pci_stalled_*), receive buffers and the host's memory bandwidth",
                _ev(
                    r,
                    f"tx_{p}_pause",
                    f"tx_{p}_pause_duration",
                    "outbound_pci_stalled_rd_events",
                    "rx_buffer_passed_thres_phy",
                ),
            )
        if prio == "global" and (frames or tframes):
            yield NicProblem(
                Severity.WARN,
                nr.name,
                f"{nr.name}: 802.3x global pause frames are flowing ({per_s(frames or 0)} received, "
                f"{per_s(tframes or 0)} sent) on a PFC fabric",
                "turn global pause off (ethtool -A IF rx off tx off) and rely on PFC",
                _ev(r, "rx_global_pause", "tx_global_pause"),
            )
    err, warn_ev = r.get("tx_pause_storm_error_events"), r.get("tx_pause_storm_warning_events")
    if err:
        yield NicProblem(
            Severity.CRIT,
            nr.name,
            f"{nr.name}: the NIC's pause-storm watchdog stopped sending pause frames "
            "(tx_pause_storm_error_events rose): drops were possible",
            "this host stalled receiving for longer than the storm timeout: check the "
            "host (PCIe, memory, a stuck process); drain it if it repeats",
            _ev(r, "tx_pause_storm_error_events"),
        )
    elif warn_ev:
        yield NicProblem(
            Severity.WARN,
            nr.name,
            f"{nr.name}: the NIC sent pause frames for long periods (tx_pause_storm_warning_events rose)",
            "this host is slow to drain its receive queue: check its PCIe link and load",
            _ev(r, "tx_pause_storm_warning_events"),
        )


@analyzer("roce.pfc")
def check_pfc(ctx: AnalysisContext) -> list[Finding]:
    """PFC pause fractions, pause storms and global pause."""
    return run_check(
        ctx,
        "roce.pfc",
        _pfc,
        "no PFC pause above thresholds",
        {"rx-pause": f"PFC pause on priority {fabric.profile(ctx).pfc_priority}"},
    )


# ------------------------------------------------------------- roce.discards


def _discards(ctx: AnalysisContext, nr: NicRates, g: Gathered) -> Iterable[NicProblem]:
    """Per-priority drops on the RoCE priority are CRIT; ``rx_discards_phy`` alone is WARN.

    ``rx_prioN_discards`` (and the shared-buffer ``rx_prioN_buf_discard`` /
    ``rx_prioN_cong_discard``) count drops of priority N only; ``rx_discards_phy``
    counts every packet the port dropped for lack of buffer, lossy priorities
    (TCP, storage) included (Linux Documentation/networking/device_drivers/
    ethernet/mellanox/mlx5/counters.rst; kernel commit 827a8cb2dd2b "net/mlx5e:
    Add discard counters per priority").  On a port whose per-priority counters
    show nothing on P, port-wide drops are lossy traffic being dropped: worth a
    look, not a broken lossless class.
    """
    r = nr.rates
    p = fabric.profile(ctx).pfc_priority
    limit = fabric.limit(ctx, "discards", "per_s_crit", 0)
    lossless = [f"rx_prio{p}_discards", f"rx_prio{p}_buf_discard", f"rx_prio{p}_cong_discard"]
    hot = [(n, r.get(n)) for n in lossless if (r.get(n) or 0) > limit]
    port = r.get("rx_discards_phy") or 0
    if hot:
        yield NicProblem(
            Severity.CRIT,
            nr.name,
            f"{nr.name}: packets dropped on the lossless priority {p} ("
            + ", ".join(
                f"{n} {per_s(v or 0)}" for n, v in [*hot, *([("rx_discards_phy", port)] if port > limit else [])]
            )
            + ")",
            f"lossless is not in effect: check that PFC is on for priority {p} on this host "
            "and its switch port, the receive buffer and headroom, and pause-storm events",
            _ev(r, *lossless, "rx_discards_phy"),
        )
    elif port > limit:
        per_prio = [n for n in lossless if r.has(n)]
        why = (
            f"{', '.join(per_prio)} did not rise, so the drops were on other (lossy) priorities"
            if per_prio
            else f"this NIC has no per-priority discard counter, so whether priority {p} lost packets cannot be told"
        )
        yield NicProblem(
            Severity.WARN,
            nr.name,
            f"{nr.name}: the port dropped {per_s(port)} received packets for lack of buffer "
            f"(rx_discards_phy counts the whole port, lossy traffic such as TCP included; {why})",
            "the adapter cannot absorb the incoming traffic on some priority: look at which "
            "priority's rx_prioN_discards rises (ethtool -S), the receive buffer sizes and the "
            "host's CPU/PCIe headroom; RoCE on the lossless priority is not affected by this alone",
            _ev(r, "rx_discards_phy", *lossless),
        )


@analyzer("roce.discards")
def check_discards(ctx: AnalysisContext) -> list[Finding]:
    """Drops on the lossless priority (CRIT) and port-wide drops (WARN)."""
    return run_check(ctx, "roce.discards", _discards, "no drops on the lossless priority")


# ----------------------------------------------------------- roce.congestion


def _cnp_rate(nr: NicRates) -> float:
    return max(nr.rates.get("np_cnp_sent") or 0.0, nr.rates.get("rp_cnp_handled") or 0.0)


def _congestion(ctx: AnalysisContext, nr: NicRates, g: Gathered) -> Iterable[NicProblem]:
    r = nr.rates
    if not (r.has("np_cnp_sent") or r.has("rp_cnp_handled")):
        return
    row = fabric.speed_row(ctx, nr.gbps)
    factor = fabric.limit(ctx, "congestion", "outlier_factor", 5)
    floor = fabric.limit(ctx, "congestion", "floor_fraction", 0.1) * row["cnp_per_s_warn"]
    host_rates: dict[str, float] = {}
    for other in g.nics:
        host_rates[other.host] = max(host_rates.get(other.host, 0.0), _cnp_rate(other))
    others = [v for h, v in host_rates.items() if h != nr.host]
    median = statistics.median(others) if others else 0.0
    sent, handled = r.get("np_cnp_sent") or 0.0, r.get("rp_cnp_handled") or 0.0
    rate = max(sent, handled)
    outlier = bool(others) and rate >= floor and rate >= factor * max(median, 1e-9)
    ev = _ev(r, "np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets")
    if rate >= row["cnp_per_s_warn"] or outlier:
        if sent >= handled:
            what = (
                f"sending {per_s(sent)} CNPs (it receives ECN-marked RoCE traffic: the switch "
                "egress towards it is congested, an incast)"
            )
        else:
            what = f"handling {per_s(handled)} CNPs (its senders are being slowed by DCQCN)"
        comp = f", {factor:g}x or more the median of the other hosts ({per_s(median)})" if outlier else ""
        yield NicProblem(
            Severity.WARN,
            nr.name,
            f"{nr.name}: {what}{comp}",
            "find the traffic converging on this host (many senders to one receiver) "
            "and spread it, or check its switch port's ECN/buffer settings",
            ev,
            symptom="cnp",
        )
    marked = r.get("np_ecn_marked_roce_packets")
    if marked and marked >= floor and r.has("np_cnp_sent") and sent < marked * 0.01:
        yield NicProblem(
            Severity.WARN,
            nr.name,
            f"{nr.name}: {per_s(marked)} ECN-marked RoCE packets received but no CNPs sent",
            "enable the ECN notification point on the RoCE priority "
            "(/sys/class/net/IF/ecn/roce_np/enable/N or the firmware's ROCE_CC_PRIO_MASK)",
            ev,
        )
    ignored = r.get("rp_cnp_ignored")
    if ignored and ignored >= floor:
        yield NicProblem(
            Severity.WARN,
            nr.name,
            f"{nr.name}: {per_s(ignored)} CNPs received and ignored (rp_cnp_ignored)",
            "enable the ECN reaction point on the RoCE priority (ecn/roce_rp/enable/N)",
            _ev(r, "rp_cnp_ignored"),
        )


@analyzer("roce.congestion")
def check_congestion(ctx: AnalysisContext) -> list[Finding]:
    """CNP and ECN rates, outliers between hosts, grouped by leaf."""
    return run_check(
        ctx, "roce.congestion", _congestion, "CNP rates normal", {"cnp": "a high CNP rate (congestion, incast)"}
    )


# ------------------------------------------------------------ roce.transport

#: Sequence errors and retransmissions: packets were lost on the path (go-back-N).
LOSS_SIGNS = (
    "out_of_sequence",
    "packet_seq_err",
    "implied_nak_seq_err",
    "duplicate_request",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "rx_icrc_encapsulated",
)
#: The requester gave up: the QP goes to the error state and NCCL fails (kernel commit
#: b339e0a39dc3 "RDMA/mlx5: Add Qcounters req_transport_retries_exceeded/req_rnr_retries_exceeded").
FATAL = ("req_transport_retries_exceeded", "req_rnr_retries_exceeded")
#: The requester's ACK timer expired and it retransmitted; the QP's retry limit was not exceeded.
ACK_TIMEOUT = "local_ack_timeout_err"
#: RNR NAKs received: the responder had no receive buffer posted (Receiver Not Ready); the
#: request is retried after the RNR timer.  Not packet loss.
RNR = "rnr_nak_retry_err"


def _transport(ctx: AnalysisContext, nr: NicRates, g: Gathered) -> Iterable[NicProblem]:
    """Counter semantics: docs/doctor-roce.md "roce.transport" (mlx5 hw_counters, IB RC rules).

    Only ``*_retries_exceeded`` mean the connection failed (CRIT).  Sequence
    errors are loss (WARN; CRIT at a sustained rate).  ``local_ack_timeout_err``
    alone is a warning of loss (a retransmission after a timeout, the QP lives
    on).  ``rnr_nak_retry_err`` is a receiver that was not ready, not loss.
    """
    r = nr.rates
    crit = fabric.limit(ctx, "transport", "per_s_crit", 10)
    fatal = [(n, r.hw[n]) for n in FATAL if r.hw.get(n)]
    loss = [(n, r.hw[n]) for n in LOSS_SIGNS if r.hw.get(n)]
    timeouts = r.hw.get(ACK_TIMEOUT) or 0.0
    rnr = r.hw.get(RNR) or 0.0
    if fatal:
        yield NicProblem(
            Severity.CRIT,
            nr.name,
            f"{nr.name}: "
            + ", ".join(f"{n} {per_s(v)}" for n, v in fatal)
            + " (the requester exhausted its retries and moved the connection to the error "
            "state: NCCL fails or hangs)",
            "packets are lost between this host and its peers (transport) or a receiver stopped "
            "posting buffers (rnr): check discards and pause on both ends, cables and the switch "
            "path; restart the affected instances",
            _ev(r, *FATAL),
        )
    if loss or timeouts:
        sev = Severity.CRIT if loss and max(v for _, v in loss) >= crit else Severity.WARN
        shown = [*loss, *([(ACK_TIMEOUT, timeouts)] if timeouts else [])]
        note = (
            ""
            if loss
            else "; ACK timeouts alone: requests were retransmitted after the ACK timer expired "
            "and the connection's retry limit was not reached"
        )
        yield NicProblem(
            sev,
            nr.name,
            f"{nr.name}: packet loss on the RDMA path ("
            + ", ".join(f"{n} {per_s(v)}" for n, v in shown)
            + f"): retransmissions slow NCCL{note}",
            "find where packets drop: discards on the lossless priority, PFC off on some "
            "hop, a bad cable (symbol errors)",
            _ev(r, *LOSS_SIGNS, ACK_TIMEOUT),
        )
    if rnr:
        yield NicProblem(
            Severity.WARN,
            nr.name,
            f"{nr.name}: rnr_nak_retry_err {per_s(rnr)}: peers answered Receiver Not Ready (no "
            "receive buffer posted) and the request was retried; this is not packet loss",
            "a receiving process is slow to post receive buffers (CPU starved, too few buffers); "
            "if req_rnr_retries_exceeded rises too, connections are failing",
            _ev(r, RNR),
        )


@analyzer("roce.transport")
def check_transport(ctx: AnalysisContext) -> list[Finding]:
    """Sequence errors, ACK timeouts and retransmissions."""
    return run_check(ctx, "roce.transport", _transport, "no RDMA retransmissions or timeouts")


# ------------------------------------------------------------------ roce.link

LINK_ERRORS = ("rx_pcs_symbol_err_phy", "rx_symbol_err_phy", "rx_crc_errors_phy")


def _link(ctx: AnalysisContext, nr: NicRates, g: Gathered) -> Iterable[NicProblem]:
    r = nr.rates
    limit = fabric.limit(ctx, "link", "per_s_crit", 0)
    flaps = r.deltas.get("link_down_events_phy")
    if flaps is None and r.ib.get("link_downed") is not None:
        flaps = r.deltas.get("ib:link_downed")
    if "link_down_events_phy" in r.resets:
        yield NicProblem(
            Severity.WARN,
            nr.name,
            f"{nr.name}: link_down_events_phy went down between samples (driver reloaded?)",
            "check the kernel log for an mlx5 reset on this host",
            (),
        )
    if flaps:
        yield NicProblem(
            Severity.CRIT,
            nr.name,
            f"{nr.name}: the link went down {flaps} time(s) in {r.dt:.1f} s",
            "replace or reseat the cable/transceiver of this port; check the switch port's log",
            _ev(r, "link_down_events_phy", "link_downed"),
        )
    errs = [(n, r.ethtool[n]) for n in LINK_ERRORS if (r.ethtool.get(n) or 0) > limit]
    if errs:
        yield NicProblem(
            Severity.CRIT,
            nr.name,
            f"{nr.name}: " + ", ".join(f"{n} {per_s(v)}" for n, v in errs) + " (frames corrupted on the wire)",
            "clean or replace the cable/transceiver of this port",
            _ev(r, *LINK_ERRORS),
        )


@analyzer("roce.link")
def check_link(ctx: AnalysisContext) -> list[Finding]:
    """Link flaps and symbol/CRC errors."""
    return run_check(ctx, "roce.link", _link, "no link flaps or symbol errors")


# ---------------------------------------------------------------- roce.rxpath

PCIE_PRESSURE = ("outbound_pci_buffer_overflow", "outbound_pci_stalled_rd_events", "outbound_pci_stalled_wr_events")


def _rxpath(ctx: AnalysisContext, nr: NicRates, g: Gathered) -> Iterable[NicProblem]:
    r = nr.rates
    hot = [(n, r.ethtool[n]) for n in PCIE_PRESSURE if r.ethtool.get(n)]
    if hot:
        yield NicProblem(
            Severity.WARN,
            nr.name,
            f"{nr.name}: PCIe back-pressure ("
            + ", ".join(f"{n} {per_s(v)}" for n, v in hot)
            + "): the NIC cannot write to host memory as fast as it receives",
            "check the NIC's PCIe link (width, speed, errors), its NUMA placement and the "
            "host's memory load; this is what makes a host send pause frames",
            _ev(r, *PCIE_PRESSURE),
        )
    oob = r.hw.get("out_of_buffer")
    if oob:
        yield NicProblem(
            Severity.WARN,
            nr.name,
            f"{nr.name}: {per_s(oob)} RDMA receives found no posted buffer (out_of_buffer)",
            "the application (NCCL) posts receive buffers too slowly: check the host's CPU "
            "load and the instance's health",
            _ev(r, "out_of_buffer"),
        )
    factor = fabric.limit(ctx, "link", "corrected_bits_outlier_factor", 10)
    floor_ber = fabric.limit(ctx, "link", "corrected_ber_floor", 1e-8)
    mine = r.ethtool.get("rx_corrected_bits_phy")
    if mine and nr.gbps:
        others = [
            x for o in g.nics if o.host != nr.host if (x := o.rates.ethtool.get("rx_corrected_bits_phy")) is not None
        ]
        median = statistics.median(others) if others else None
        ber = mine / (nr.gbps * 1e9)
        if median is not None and ber >= floor_ber and mine >= factor * max(median, 1e-9):
            yield NicProblem(
                Severity.WARN,
                nr.name,
                f"{nr.name}: {per_s(mine)} bits corrected by FEC (pre-FEC BER {ber:.1e}), "
                f"{factor:g}x or more the median of the other hosts ({per_s(median)})",
                "a marginal cable or transceiver: clean or replace it before it starts dropping frames",
                _ev(r, "rx_corrected_bits_phy"),
            )


@analyzer("roce.rxpath")
def check_rxpath(ctx: AnalysisContext) -> list[Finding]:
    """PCIe back-pressure, RDMA receives without buffers, pre-FEC error outliers."""
    return run_check(ctx, "roce.rxpath", _rxpath, "receive path and FEC error rate normal")


# -------------------------------------------------------------- roce.priority


def _priority(ctx: AnalysisContext, nr: NicRates, g: Gathered) -> Iterable[NicProblem]:
    r = nr.rates
    p = fabric.profile(ctx).pfc_priority
    rdma = r.get("tx_vport_rdma_unicast_bytes")
    on_p = r.get(f"tx_prio{p}_bytes")
    if rdma is None or on_p is None or rdma < fabric.limit(ctx, "priority", "min_rdma_bytes_per_s", 1e6):
        return
    want = fabric.limit(ctx, "priority", "min_fraction_on_roce_priority", 0.9)
    if on_p >= want * rdma:
        return
    elsewhere = sorted(((q, r.get(f"tx_prio{q}_bytes") or 0.0) for q in range(8) if q != p), key=lambda x: -x[1])
    top = elsewhere[0] if elsewhere and elsewhere[0][1] > 0 else None
    yield NicProblem(
        Severity.CRIT,
        nr.name,
        f"{nr.name}: RDMA sends {per_s(rdma)} bytes but priority {p} carries only "
        f"{pct(on_p / rdma)} of it" + (f"; priority {top[0]} carries {per_s(top[1])} bytes" if top else ""),
        "RoCE runs on a lossy priority: set NCCL_IB_TC (e.g. 106 for DSCP 26) or the "
        "NIC's global traffic class, and trust dscp with DSCP "
        f"{fabric.profile(ctx).roce_dscp} mapped to priority {p}",
        _ev(r, "tx_vport_rdma_unicast_bytes", *[f"tx_prio{q}_bytes" for q in range(8)]),
    )


@analyzer("roce.priority")
def check_priority(ctx: AnalysisContext) -> list[Finding]:
    """RDMA bytes that land on a priority other than the RoCE one."""
    return run_check(ctx, "roce.priority", _priority, "RDMA traffic on the RoCE priority")
