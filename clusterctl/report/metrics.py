"""Per-host numbers worth a trend, taken from what doctor already gathered.

From the probe's facts (``snapshot.facts[host]``, the raw facts document):
``gpu_memory_used_bytes`` and ``gpu_utilization_ratio`` (0..1) per GPU.  From
each instance's /metrics sample (``snapshot.raw[host]["<instance>.metrics"]``):
``vllm_kv_cache_usage_ratio`` and ``vllm_requests_waiting`` (summed over
engines).  From each RoCE NIC's node-timed counter samples (the doctor probe
takes two): ``roce_paused_ratio`` (0..1, the largest fraction of the
interval the port was paused on any priority, ``rx_prioN_pause_duration``
in µs per second) and ``roce_cnp_per_second`` (CNPs sent or handled,
whichever is higher, as ``roce.congestion`` judges them) per NIC.  Anything missing or malformed is skipped: trends are best effort,
findings report what could not be checked.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterator

from clusterctl.diagnose.counters import nic_rates
from clusterctl.probe.factgroups import GpusFact, NicsFact
from clusterctl.report.history import Metric

_SAMPLE = re.compile(
    r"^(vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc|vllm:num_requests_waiting)"
    r"(?:\{[^}]*\})?\s+(\S+)",
    re.M,
)
_NAMES = {
    "vllm:kv_cache_usage_perc": "vllm_kv_cache_usage_ratio",
    "vllm:gpu_cache_usage_perc": "vllm_kv_cache_usage_ratio",  # before vLLM 0.10
    "vllm:num_requests_waiting": "vllm_requests_waiting",
}


def _gpu_metrics(host: str, doc: dict[str, Any]) -> Iterator[Metric]:
    if not isinstance(doc, dict):
        return
    for d in GpusFact.parse(doc).devices:
        if d.index is None:
            continue
        subject = f"gpu:{d.index}"
        if d.memory_used is not None:
            yield Metric(host, "gpu_memory_used_bytes", float(d.memory_used), subject)
        if d.utilization_gpu is not None:
            yield Metric(host, "gpu_utilization_ratio", float(d.utilization_gpu) / 100.0, subject)


_PAUSE_PRIORITIES = [f"prio{p}" for p in range(8)] + ["global"]


def _roce_metrics(host: str, doc: dict[str, Any]) -> Iterator[Metric]:
    if not isinstance(doc, dict):
        return
    for nic in NicsFact.parse(doc).roce:
        r, _ = nic_rates(nic)
        if r is None:
            continue
        subject = f"nic:{nic.netdev}"
        paused = [d / 1e6 for d in (r.get(f"rx_{p}_pause_duration") for p in _PAUSE_PRIORITIES) if d is not None]
        if paused:
            yield Metric(host, "roce_paused_ratio", min(1.0, max(paused)), subject)
        cnp = [c for c in (r.get("np_cnp_sent"), r.get("rp_cnp_handled")) if c is not None]
        if cnp:
            yield Metric(host, "roce_cnp_per_second", max(cnp), subject)


def vllm_metrics(host: str, instance: str, text: str) -> list[Metric]:
    """KV-cache usage and waiting requests of one instance's /metrics text."""
    sums: dict[str, float] = {}
    for name, value in _SAMPLE.findall(text):
        try:
            v = float(value)
        except ValueError:
            continue
        if math.isfinite(v):
            key = _NAMES[name]
            sums[key] = max(sums.get(key, 0.0), v) if key.endswith("ratio") else sums.get(key, 0.0) + v
    return [Metric(host, k, v, f"instance:{instance}") for k, v in sorted(sums.items())]


def from_snapshot(facts: dict[str, Any], raw: dict[str, dict[str, str]]) -> list[Metric]:
    """Every metric above for every host of a doctor snapshot."""
    out: list[Metric] = []
    for host, doc in sorted(facts.items()):
        out += _gpu_metrics(host, doc)
        out += _roce_metrics(host, doc)
    for host, files in sorted(raw.items()):
        for name, text in sorted(files.items()):
            if name.endswith(".metrics") and isinstance(text, str):
                out += vllm_metrics(host, name[: -len(".metrics")], text)
    return out
