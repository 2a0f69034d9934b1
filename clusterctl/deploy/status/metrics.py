"""HTTP reads of a vLLM instance from the control machine: /health, /version, /metrics.

These three endpoints are open in vLLM even with ``--api-key`` (only ``/v1``
paths check it), so no secret travels here.  Every call has a short timeout
and never raises for network trouble: a dead or hung instance is a value,
not a stall.  ``/metrics`` is parsed with the doctor's parser
(:func:`clusterctl.diagnose.serving.parse_metrics`).

:func:`scrape_window` samples every instance twice, ``window`` seconds
apart, all instances at once: the difference of
``vllm:generation_tokens_total`` over the measured time is the generation
throughput (tokens/s) the load score uses.
"""

from __future__ import annotations

import concurrent.futures as cf
import http.client
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable, Mapping

from clusterctl.diagnose.serving import histogram_quantile, parse_metrics, peak, total

#: vLLM's time-to-first-token histogram (seconds; ``_bucket``/``_sum``/``_count``).
TTFT = "vllm:time_to_first_token_seconds"
from clusterctl.inventory.model import Instance, Inventory

#: Seconds for one HTTP request (connect + answer) to an instance.
DEFAULT_HTTP_TIMEOUT = 3.0
#: Threads used to reach instances at once.
MAX_PARALLEL = 64


def base_url(inv: Inventory, inst: Instance) -> str:
    """``http://ADDRESS:PORT`` of an instance, from the control machine.

    The address is the instance's ``--host`` argument when it names one
    (vLLM then listens only there), else its first host's inventory address.
    """
    bind = inst.args.get("host")
    if isinstance(bind, str) and bind not in ("", "0.0.0.0", "::"):
        addr = bind
    else:
        host = inv.hosts.get(inst.placement[0].host) if inst.placement else None
        addr = host.address if host else (inst.placement[0].host if inst.placement else "127.0.0.1")
    if ":" in addr and not addr.startswith("["):
        addr = f"[{addr}]"
    return f"http://{addr}:{inst.port}"


@dataclass(frozen=True)
class HttpAnswer:
    """One GET: ``status`` (HTTP code, 0 when no answer), ``body``, ``error`` (why no answer)."""

    status: int
    body: bytes = b""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def refused(self) -> bool:
        """Nothing listens (vLLM listens only once loaded); a timeout is not a refusal."""
        return self.status == 0 and is_refused(self.error or "")


def is_refused(reason: str) -> bool:
    """Whether an error text from :func:`http_get` / :func:`fetch_sample` is a refused connection."""
    return reason.startswith("ConnectionRefusedError")


def http_get(url: str, timeout: float = DEFAULT_HTTP_TIMEOUT) -> HttpAnswer:
    """GET ``url`` within ``timeout`` seconds (per socket operation); never raises for I/O."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "", u.port or 80, timeout=timeout)
    try:
        conn.request("GET", u.path or "/", headers={"Accept": "*/*"})
        r = conn.getresponse()
        return HttpAnswer(r.status, r.read())
    except (OSError, http.client.HTTPException) as e:
        return HttpAnswer(0, error=f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
    finally:
        conn.close()


def version_of(answer: HttpAnswer) -> str | None:
    """The version in a ``/version`` answer (``{"version": "0.11.0"}``), else ``None``."""
    if not answer.ok:
        return None
    try:
        v = json.loads(answer.body).get("version")
    except (ValueError, AttributeError):
        return None
    return str(v) if v is not None else None


@dataclass(frozen=True)
class MetricsSample:
    """The numbers status needs from one ``/metrics`` text, taken at ``at`` (monotonic s).

    Counts are summed over engines; ``kv_usage`` is the fullest engine's
    (0..1, ``vllm:kv_cache_usage_perc`` or 0.10's ``gpu_cache_usage_perc``).
    A field is ``None`` when the metric is absent.
    """

    at: float
    kv_usage: float | None
    running: float | None
    waiting: float | None
    generation_tokens: float | None
    num_gpu_blocks: int | None = None
    #: ``vllm:prompt_tokens_total`` (prefill progress; ``None`` when absent)
    prompt_tokens: float | None = None
    #: ``vllm:time_to_first_token_seconds``: cumulative ``(le, count)`` buckets summed over
    #: engines, and its ``_sum``/``_count`` (``None``/empty when absent).
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    ttft_sum: float | None = None
    ttft_count: float | None = None

    @property
    def in_flight(self) -> float | None:
        """Requests running + waiting (``None`` when neither is reported)."""
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0.0) + (self.waiting or 0.0)


def parse_sample(text: str, at: float) -> MetricsSample:
    """A :class:`MetricsSample` from Prometheus text (absent metrics are ``None``)."""
    m = parse_metrics(text)
    blocks = None
    for labels, _ in m.get("vllm:cache_config_info", []):
        try:
            blocks = (blocks or 0) + int(labels.get("num_gpu_blocks", ""))
        except ValueError:
            pass
    buckets: dict[float, float] = {}
    for labels, v in m.get(TTFT + "_bucket", []):
        try:
            le = float(labels.get("le", ""))  # "+Inf" parses as inf
        except ValueError:
            continue
        buckets[le] = buckets.get(le, 0.0) + v
    return MetricsSample(
        at=at,
        kv_usage=peak(m, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        running=total(m, "vllm:num_requests_running"),
        waiting=total(m, "vllm:num_requests_waiting"),
        generation_tokens=total(m, "vllm:generation_tokens_total"),
        num_gpu_blocks=blocks,
        prompt_tokens=total(m, "vllm:prompt_tokens_total"),
        ttft_buckets=tuple(sorted(buckets.items())),
        ttft_sum=total(m, TTFT + "_sum"),
        ttft_count=total(m, TTFT + "_count"),
    )


def fetch_sample(
    url: str, timeout: float = DEFAULT_HTTP_TIMEOUT, clock: Callable[[], float] = time.monotonic
) -> MetricsSample | str:
    """``GET url/metrics`` parsed, or the reason it could not be read (a string)."""
    at = clock()
    a = http_get(url + "/metrics", timeout)
    if not a.ok:
        return a.error or f"/metrics answered HTTP {a.status}"
    sample = parse_sample(a.body.decode("utf-8", "replace"), at)
    if sample.running is None and sample.kv_usage is None:
        return "/metrics has no vllm: metrics"
    return sample


@dataclass(frozen=True)
class WindowedMetrics:
    """Two samples ``window`` apart: ``last`` is the newest good one (``None``: none).

    ``tokens_per_s``: generation throughput between the two samples
    (``None`` without two good samples or with a counter reset).
    ``error``: why the newest sample is missing.
    """

    first: MetricsSample | None
    last: MetricsSample | None
    error: str | None = None

    @property
    def tokens_per_s(self) -> float | None:
        a, b = self.first, self.last
        if a is None or b is None or a is b or a.generation_tokens is None or b.generation_tokens is None:
            return None
        dt = b.at - a.at
        delta = b.generation_tokens - a.generation_tokens
        if dt <= 0 or delta < 0:
            return None
        return delta / dt

    def _ttft_delta(self) -> tuple[float, float, list[tuple[float, float]]] | None:
        """``(requests, seconds summed, buckets)`` of the first tokens between the two samples;
        ``None`` without two samples, with no request in between or after a counter reset."""
        a, b = self.first, self.last
        if a is None or b is None or a is b or None in (a.ttft_count, b.ttft_count, a.ttft_sum, b.ttft_sum):
            return None
        n = b.ttft_count - a.ttft_count  # type: ignore[operator]
        s = b.ttft_sum - a.ttft_sum  # type: ignore[operator]
        before = dict(a.ttft_buckets)
        buckets = [(le, c - before.get(le, 0.0)) for le, c in b.ttft_buckets]
        if n <= 0 or s < 0 or any(c < 0 for _, c in buckets):
            return None
        return n, s, buckets

    @property
    def ttft_requests(self) -> float | None:
        """Requests that got their first token between the two samples (``None``: not known)."""
        d = self._ttft_delta()
        return d[0] if d else None

    @property
    def ttft_mean_s(self) -> float | None:
        """Mean time to first token (s) of the requests between the two samples."""
        d = self._ttft_delta()
        return d[1] / d[0] if d else None

    @property
    def ttft_p90_s(self) -> float | None:
        """90th percentile of the time to first token (s) between the two samples, Prometheus-style
        (linear inside the histogram bucket that holds it)."""
        d = self._ttft_delta()
        return histogram_quantile(d[2], 0.9) if d and d[2] else None


Fetch = Callable[[str], "MetricsSample | str"]


def scrape_window(
    urls: Mapping[str, str],
    *,
    window: float = 10.0,
    fetch: Fetch | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, WindowedMetrics]:
    """Sample ``/metrics`` of every ``{name: base_url}`` at once, twice, ``window`` s apart.

    ``window=0`` takes one sample (no throughput).  An instance whose first
    sample failed is not asked again.  Takes about ``window`` plus two HTTP
    timeouts at most, whatever the number of instances.
    """
    get: Fetch = fetch or fetch_sample
    names = list(urls)
    if not names:
        return {}
    with cf.ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(names))) as pool:
        t0 = clock()
        first = dict(zip(names, pool.map(lambda n: get(urls[n]), names)))
        again = [n for n in names if isinstance(first[n], MetricsSample)]
        second: dict[str, MetricsSample | str] = {}
        if window > 0 and again:
            rest = window - (clock() - t0)
            if rest > 0:
                sleep(rest)
            second = dict(zip(again, pool.map(lambda n: get(urls[n]), again)))
    out: dict[str, WindowedMetrics] = {}
    for n in names:
        a, b = first[n], second.get(n)
        s1 = a if isinstance(a, MetricsSample) else None
        s2 = b if isinstance(b, MetricsSample) else None
        err = b if isinstance(b, str) else (a if isinstance(a, str) else None)
        out[n] = WindowedMetrics(first=s1, last=s2 or (s1 if b is None else None), error=err)
    return out
