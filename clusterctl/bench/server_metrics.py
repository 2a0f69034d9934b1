"""Read a vLLM server's own latency histograms from ``/metrics`` (Prometheus text format).

Used to check the load generator against the server: the difference of
``_sum``/``_count`` between two scrapes is the server-side mean over the
requests in between (seconds).
"""

from __future__ import annotations

import urllib.request

from clusterctl.bench.loadgen import Endpoint


def scrape(ep: Endpoint, timeout: float = 10.0) -> dict[str, float]:
    """Every sample in ``/metrics``, summed over label sets: ``{"vllm:x_sum": 1.5, ...}``."""
    with urllib.request.urlopen(ep.url + "/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, rest = line.rpartition(" ") if "}" not in line else line.partition("} ")
        name = name_labels.split("{", 1)[0]
        try:
            value = float(rest.split()[0]) if "}" in line else float(rest)
        except (ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def histogram_mean(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    """Mean (s) of the observations of histogram ``name`` between two scrapes; None if none."""
    n = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    if n <= 0:
        return None
    return (after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)) / n
