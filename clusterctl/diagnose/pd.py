"""Check ``pd.kv_transfer``: KV transfers of prefill/decode pools (docs/disaggregation.md).

The decode members of a pool pull each request's KV cache from a prefill
member; vLLM's NIXL connector counts it on the decode side
(``vllm:nixl_num_failed_transfers_total``, ``vllm:nixl_xfer_time_seconds``,
``vllm:nixl_bytes_transferred``).  Read from ``<instance>.metrics`` (and
``.metrics.2``, over the interval when both are there):

* transfers failed (the counter rose, or is above 0 in a single sample): CRIT;
* transfers slow: the mean transfer time above ``kv_transfer_slow_factor``
  times what the bytes take at the slower end's data-NIC speed (inventory
  ``speed_gbps``) and above ``kv_transfer_min_s``: WARN (a pause storm or a
  lossy RoCE class shows here first).

Each finding names the pair (decode <- the pool's prefill members) and the
network path (host, data NICs and RDMA devices at each end), so the RoCE
checks of those NICs are where to look next.
"""

from __future__ import annotations


from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.diagnose.serving import Metrics, parse_metrics, total
from clusterctl.diagnose.thresholds import number, section
from clusterctl.inventory.model import Host, Instance, Inventory

CHECK = "pd.kv_transfer"
ACTION = (
    "check the RoCE path between the pair (`clusterctl doctor roce qos` on both hosts: PFC on the "
    "RoCE priority, pause storms, discards); the KV connector's log on the decode instance says more"
)


def _nics(host: Host | None) -> str:
    if host is None:
        return "?"
    data = host.nics_with_role("data")
    if not data:
        return f"{host.name} (no data NIC in the inventory)"
    return f"{host.name} " + ",".join(f"{n.netdev}/{n.rdma_device}" if n.rdma_device else n.netdev for n in data)


def _gbps(host: Host | None) -> float | None:
    if host is None:
        return None
    speeds = [n.speed_gbps for n in host.nics_with_role("data") if n.speed_gbps]
    return float(min(speeds)) if speeds else None


def _pairs(inv: Inventory) -> list[tuple[str, Instance, list[Instance]]]:
    """(pool, decode instance, its pool's prefill instances) for every placed decode member."""
    out = []
    for pool in inv.pd_pools.values():
        mine = [i for i in inv.instances.values() if i.model == pool.model]
        pre = sorted((i for i in mine if i.role == "prefill"), key=lambda i: i.name)
        for d in sorted((i for i in mine if i.role == "decode"), key=lambda i: i.name):
            out.append((pool.name, d, pre))
    return out


def _delta(m0: Metrics | None, m1: Metrics, name: str) -> float | None:
    v1 = total(m1, name)
    if v1 is None:
        return None
    v0 = total(m0, name) if m0 is not None else 0.0
    return v1 - (v0 or 0.0)


@analyzer(CHECK)
def check_kv_transfer(ctx: AnalysisContext) -> list[Finding]:
    inv = ctx.inventory
    if inv is None or not inv.pd_pools:
        return []
    lim = section(ctx.thresholds, "gpu", "serving")
    factor = number(lim, "kv_transfer_slow_factor", 3.0)
    floor = number(lim, "kv_transfer_min_s", 0.005)
    out: list[Finding] = []
    for pool, dec, pre in _pairs(inv):
        host = dec.hosts[0]
        raw = ctx.raw.get(host, {})
        text = raw.get(dec.name + ".metrics")
        subj = f"instance:{dec.name}"
        src = [inv.hosts.get(p.hosts[0]) for p in pre]
        pair = f"decode {dec.name} <- prefill {', '.join(p.name for p in pre) or '(none placed)'} (pool {pool})"
        path = " | ".join(sorted({_nics(h) for h in src})) + " -> " + _nics(inv.hosts.get(host))
        if text is None:
            continue  # serving.metrics says when an instance's metrics are missing
        later = raw.get(dec.name + ".metrics.2")
        m0 = parse_metrics(text)
        m1 = parse_metrics(later) if later else None
        now = m1 or m0
        base = m0 if m1 is not None else None
        if total(now, "vllm:nixl_xfer_time_seconds_count") is None:
            out.append(
                Finding(
                    CHECK,
                    Severity.UNKNOWN,
                    host,
                    subj,
                    f"{pair}: no KV-transfer metrics (vllm:nixl_*) in /metrics",
                    "check the instance runs with the pool's --kv-transfer-config (clusterctl deploy)",
                )
            )
            continue
        span = f" in {ctx.interval_s:g} s" if base is not None else ""
        failed = _delta(base, now, "vllm:nixl_num_failed_transfers_total") or 0.0
        count = _delta(base, now, "vllm:nixl_xfer_time_seconds_count") or 0.0
        secs = _delta(base, now, "vllm:nixl_xfer_time_seconds_sum") or 0.0
        nbytes = _delta(base, now, "vllm:nixl_bytes_transferred_sum") or 0.0
        if failed > 0:
            out.append(
                Finding(
                    CHECK,
                    Severity.CRIT,
                    host,
                    subj,
                    f"{pair}: {failed:.0f} KV transfer(s) failed{span} over {path}",
                    ACTION,
                    (f"nixl_num_failed_transfers +{failed:.0f}", f"path {path}"),
                )
            )
            continue
        if count <= 0:
            out.append(Finding(CHECK, Severity.OK, host, subj, f"{pair}: no KV transfers{span}"))
            continue
        mean = secs / count
        speeds = [g for g in (_gbps(h) for h in [*src, inv.hosts.get(host)]) if g]
        expect = (nbytes / count) / (min(speeds) * 1e9 / 8) if speeds else None
        evidence = (
            f"mean transfer {mean * 1000:.1f} ms over {count:.0f} transfers, {nbytes / count / 2**20:.1f} MiB each",
            f"path {path}",
        )
        if expect is not None and mean > max(factor * expect, floor):
            out.append(
                Finding(
                    CHECK,
                    Severity.WARN,
                    host,
                    subj,
                    f"{pair}: KV transfers slow{span}: {mean * 1000:.1f} ms each, "
                    f"{mean / expect:.1f}x what the link takes ({expect * 1000:.1f} ms at "
                    f"{min(speeds):g} Gbit/s) over {path}",
                    ACTION,
                    evidence,
                )
            )
        else:
            out.append(
                Finding(
                    CHECK,
                    Severity.OK,
                    host,
                    subj,
                    f"{pair}: KV transfers {mean * 1000:.1f} ms each{span}",
                    evidence=evidence,
                )
            )
    return out
