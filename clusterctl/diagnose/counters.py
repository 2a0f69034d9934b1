"""Counter rates between two samples of a NIC's counters.

A sample is ``{t, ethtool_stats, hw_counters, counters}`` (``t`` in seconds
on one clock; see ``nics[].samples`` in docs/facts.md).  A rate is
``(new - old) / dt`` per second, with these rules:

- a counter missing from either sample has no rate (``None``): missing means
  "not supported here", never 0;
- a counter that went down wrapped if it is 32 bits wide (the mlx5 Q counters
  of ``hw_counters``, ``rx_out_of_buffer``, ``rx_if_down_packets``,
  ``link_down_events_phy``), both values fit in 32 bits and the wrapped delta
  ``new + 2**32 - old`` is plausible (under half the range: the old value was
  near the top);
- otherwise a counter that went down was reset (driver reload, link
  renegotiation): its rate for this interval is unknown (``None``), never
  negative.  :attr:`Rates.resets` lists those names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from clusterctl.probe.factgroups import CounterSample, Nic, Nics, NicsFact, counter_sample
from clusterctl.probe.factgroups import nic as parse_nic

WRAP_32 = 2**32

#: hw_counters read as 32-bit (mlx5 ``be32_to_cpu`` Q counters, groups 1-5 of
#: drivers/infiniband/hw/mlx5/counters.c); the congestion ones are 64-bit.
HW_COUNTERS_32 = frozenset(
    """
    rx_write_requests rx_read_requests rx_atomic_requests rx_dct_connect out_of_buffer
    out_of_sequence duplicate_request rnr_nak_retry_err packet_seq_err implied_nak_seq_err
    local_ack_timeout_err resp_local_length_error resp_cqe_error req_cqe_error
    req_remote_invalid_request req_remote_access_errors resp_remote_access_errors
    resp_cqe_flush_error req_cqe_flush_error req_transport_retries_exceeded
    req_rnr_retries_exceeded roce_adp_retrans roce_adp_retrans_to roce_slow_restart
    roce_slow_restart_cnps roce_slow_restart_trans
""".split()
)
#: ethtool -S counters the mlx5 driver keeps in 32 bits.
ETHTOOL_32 = frozenset({"rx_out_of_buffer", "rx_if_down_packets", "link_down_events_phy"})


def delta(name: str, old: int | None, new: int | None, wide32: bool) -> int | None:
    """``new - old`` allowing for one 32-bit wrap; ``None`` when unknown (missing or reset)."""
    if old is None or new is None:
        return None
    if new >= old:
        return new - old
    if wide32 and old < WRAP_32 and new < WRAP_32 and new + WRAP_32 - old < WRAP_32 // 2:
        return new + WRAP_32 - old
    return None


@dataclass
class Rates:
    """Per-second rates of one NIC over one interval of ``dt`` seconds.

    ``ethtool``, ``hw``, ``ib``: counter name -> rate (per second); a name is
    absent when either sample lacks it or it was reset (then it is in
    ``resets``).  ``deltas`` holds the raw differences by the same names
    (prefixed ``hw:``/``ib:`` for the RDMA ones).
    """

    dt: float
    ethtool: dict[str, float] = field(default_factory=dict)
    hw: dict[str, float] = field(default_factory=dict)
    ib: dict[str, float] = field(default_factory=dict)
    deltas: dict[str, int] = field(default_factory=dict)
    resets: list[str] = field(default_factory=list)

    def get(self, name: str) -> float | None:
        """The rate of ``name`` from ethtool, else hw_counters, else IB counters."""
        for table in (self.ethtool, self.hw, self.ib):
            if name in table:
                return table[name]
        return None

    def has(self, name: str) -> bool:
        return self.get(name) is not None


def _table(
    old: Mapping[str, int] | None,
    new: Mapping[str, int] | None,
    dt: float,
    wide: frozenset[str],
    prefix: str,
    out: Rates,
) -> dict[str, float]:
    rates: dict[str, float] = {}
    if not old or not new:
        return rates
    for name, b in new.items():
        a = old.get(name)
        if a is None or not isinstance(a, int) or not isinstance(b, int):
            continue
        d = delta(name, a, b, name in wide)
        if d is None:
            out.resets.append(prefix + name)
            continue
        out.deltas[prefix + name] = d
        rates[name] = d / dt
    return rates


def _interval(t0: float | None, t1: float | None) -> float | None:
    return None if t0 is None or t1 is None else float(t1) - float(t0)


def _sample(s: CounterSample | Mapping[str, Any]) -> CounterSample:
    return s if isinstance(s, CounterSample) else counter_sample(s)


def rates_between(
    old: CounterSample | Mapping[str, Any], new: CounterSample | Mapping[str, Any], dt: float | None = None
) -> Rates | None:
    """Rates from sample ``old`` to ``new`` (typed, or their JSON).  ``dt`` defaults to
    ``new.t - old.t`` (the ``ethtool -S`` times) and, for the sysfs counters, ``t_sysfs``
    when both samples have it.  ``None`` when the interval is not positive."""
    a, b = _sample(old), _sample(new)
    dt_sys = None
    if dt is None:
        dt = _interval(a.t, b.t)
        dt_sys = _interval(a.t_sysfs, b.t_sysfs)
    if dt is None or dt <= 0:
        return None
    if dt_sys is None or dt_sys <= 0:
        dt_sys = dt
    r = Rates(dt=dt)
    r.ethtool = _table(a.ethtool_stats, b.ethtool_stats, dt, ETHTOOL_32, "", r)
    r.hw = _table(a.hw_counters, b.hw_counters, dt_sys, HW_COUNTERS_32, "hw:", r)
    r.ib = _table(a.counters, b.counters, dt_sys, frozenset(), "ib:", r)
    return r


def _epoch(collected_at: str | None) -> float | None:
    try:
        return datetime.fromisoformat(str(collected_at)).timestamp() if collected_at is not None else None
    except ValueError:
        return None


def _nics(doc: Nics | Mapping[str, Any] | None) -> Nics | None:
    return doc if doc is None or isinstance(doc, Nics) else NicsFact.parse(doc)


def nic_rates(
    nic: Nic | Mapping[str, Any],
    later_doc: Nics | Mapping[str, Any] | None = None,
    doc: Nics | Mapping[str, Any] | None = None,
    interval_s: float = 0.0,
) -> tuple[Rates | None, str]:
    """The rates of one NIC of a facts document, and where they come from (each argument
    typed, ``probe/factgroups.py``, or its JSON).

    Preferred: the NIC's own ``samples`` (first and last, timed on the node).
    Else: this document's counters against the same NIC in ``later_doc``
    (a second facts run), over ``interval_s`` or the difference of the two
    ``collected_at`` (SSH latency makes these rates approximate).  Returns
    ``(None, why)`` when neither is available.
    """
    n = nic if isinstance(nic, Nic) else parse_nic(nic)
    later, this = _nics(later_doc), _nics(doc)
    if len(n.samples) >= 2:
        r = rates_between(n.samples[0], n.samples[-1])
        return (r, "node-timed samples") if r else (None, "the samples have no positive interval")
    if later is not None:
        other = later.get(n.netdev) if n.netdev else None
        if other is not None:
            dt = interval_s
            if this is not None and not dt:
                a, b = _epoch(this.collected_at), _epoch(later.collected_at)
                dt = (b - a) if a is not None and b is not None else 0.0
            r = rates_between(n.counters_now(), other.counters_now(), dt) if dt > 0 else None
            if r:
                return r, "two facts runs"
    why = n.ethtool_stats_reason
    return None, f"no counter samples ({why or 'collect with a counter interval'})"
