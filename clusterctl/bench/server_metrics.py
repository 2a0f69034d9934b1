"""Read a vLLM server's own latency histograms from ``/metrics`` (Prometheus text format).

Used to check the load generator against the server: the difference of
``_sum``/``_count`` between two scrapes is the server-side mean over the
requests in between (seconds).  A scrape is bounded in time (``timeout`` for
the whole answer) and size (:data:`MAX_BYTES`), whatever the server does.

The lab's vLLM simulator observes its histograms on a simulated clock (as at
1x) and sends the factor in an ``x-sim-time-scale`` header; the scrape then
holds it as ``CLOCK_SCALE`` so :func:`histogram_mean` gives wall seconds.
"""

from __future__ import annotations

import http.client
import math

from clusterctl.errors import ClusterctlError
from clusterctl.vllmclient import Deadline, Endpoint, headers

#: Largest /metrics page read (a vLLM server's is about 100 KB).
MAX_BYTES = 16 << 20
#: Key of the simulator's clock factor in a scrape (absent for a real vLLM: 1).
CLOCK_SCALE = "x-sim-time-scale"


def scrape(ep: Endpoint, timeout: float = 10.0) -> dict[str, float]:
    """Every sample in ``/metrics``, summed over label sets: ``{"vllm:x_sum": 1.5, ...}``; ClusterctlError when
    it cannot be read."""
    conn = ep.connect(timeout)
    with Deadline(conn, timeout) as dl:
        try:
            conn.request("GET", ep.base_path + "/metrics", headers=headers(ep))
            resp = conn.getresponse()
            raw = resp.read(MAX_BYTES + 1)
            scale_header = resp.getheader(CLOCK_SCALE)
            if dl.expired:
                raise TimeoutError
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise ClusterctlError(f"{ep.url}/metrics: {dl.error(e)}") from None
        finally:
            conn.close()
    if resp.status != 200 or len(raw) > MAX_BYTES:
        raise ClusterctlError(
            f"{ep.url}/metrics: HTTP {resp.status}"
            if resp.status != 200
            else f"{ep.url}/metrics: over {MAX_BYTES >> 20} MiB"
        )
    out: dict[str, float] = {}
    for line in raw.decode(errors="replace").splitlines():
        if not line or line.startswith("#"):
            continue
        if "}" in line:
            name_labels, _, rest = line.rpartition("}")
        else:
            name_labels, _, rest = line.partition(" ")
        name = name_labels.split("{", 1)[0].strip()
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        if math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    try:
        scale = float(scale_header) if scale_header is not None else None
    except ValueError:
        scale = None
    if scale is not None and math.isfinite(scale) and scale >= 0:
        out[CLOCK_SCALE] = scale
    return out


def histogram_mean(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    """Mean (wall s) of the observations of histogram ``name`` between two scrapes; None if none."""
    n = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    if n <= 0:
        return None
    return after.get(CLOCK_SCALE, 1.0) * (after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)) / n
