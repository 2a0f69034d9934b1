"""vLLM's Prometheus metrics per emulated version, in prometheus_client's text format.

Counters are exposed as ``<name>_total`` plus a ``<name>_created`` gauge, and
histograms as ``_bucket``/``_count``/``_sum`` plus ``_created``, with labels
sorted, as prometheus_client 0.2x writes them (samples/metrics_v0.11.0.prom).
Every engine metric carries ``engine`` and ``model_name`` labels.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

_TOK = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0]
_ITER = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0]
_TTFT = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
_REQ = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]

GAUGES = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
}
DEPRECATED_GAUGES = {  # hidden in 0.11 (shown with --show-hidden-metrics-for-version=0.10), gone later
    "vllm:gpu_cache_usage_perc": "GPU KV-cache usage. 1 means 100 percent usage."
    "DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
}
COUNTERS = {
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
}
DEPRECATED_COUNTERS = {
    "vllm:gpu_prefix_cache_queries": "GPU prefix cache queries, in terms of number of queried tokens."
    "DEPRECATED: Use vllm:prefix_cache_queries instead.",
    "vllm:gpu_prefix_cache_hits": "GPU prefix cache hits, in terms of number of cached tokens."
    "DEPRECATED: Use vllm:prefix_cache_hits instead.",
}
HISTOGRAMS: dict[str, tuple[str, list[float]]] = {
    "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", _TOK),
    "vllm:request_generation_tokens": ("Number of generation tokens processed.", _TOK),
    "vllm:iteration_tokens_total": ("Histogram of number of tokens per engine_step.", _ITER),
    "vllm:request_max_num_generation_tokens": ("Histogram of maximum number of requested generation tokens.", _TOK),
    "vllm:request_params_n": ("Histogram of the n request parameter.", [1.0, 2.0, 5.0, 10.0, 20.0]),
    "vllm:request_params_max_tokens": ("Histogram of the max_tokens request parameter.", _TOK),
    "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", _TTFT),
    "vllm:time_per_output_token_seconds": (
        "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
        _ITL,
    ),
    "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", _ITL),
    "vllm:request_time_per_output_token_seconds": ("Histogram of time_per_output_token_seconds per request.", _ITL),
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", _REQ),
    "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.", _REQ),
    "vllm:request_inference_time_seconds": ("Histogram of time spent in RUNNING phase for request.", _REQ),
    "vllm:request_prefill_time_seconds": ("Histogram of time spent in PREFILL phase for request.", _REQ),
    "vllm:request_decode_time_seconds": ("Histogram of time spent in DECODE phase for request.", _REQ),
}
#: Histograms that only some versions have.
ONLY_IN = {"vllm:time_per_output_token_seconds": ("0.11",), "vllm:request_num_preemptions": ("0.33",)}
#: The NIXL connector's metrics (vLLM 0.32 distributed/kv_transfer/kv_connector/v1/nixl/stats.py),
#: shown when the instance runs a Nixl connector.
NIXL_HISTOGRAMS: dict[str, tuple[str, list[float]]] = {
    "vllm:nixl_xfer_time_seconds": (
        "Histogram of transfer duration for NIXL KV Cache transfers.",
        [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0],
    ),
    "vllm:nixl_bytes_transferred": (
        "Histogram of bytes transferred per NIXL KV Cache transfers.",
        [float(2 ** (10 + i)) for i in range(1, 25, 2)],
    ),
}
NIXL_COUNTERS = {
    "vllm:nixl_num_failed_transfers": "Number of failed NIXL KV Cache transfers, including handshake and "
    "notification failures. NOTE: KV expiry is tracked separately in "
    "vllm:nixl_num_kv_expired_reqs.",
}
FINISHED_REASONS = {"0.11": ("stop", "length", "abort"), "0.33": ("stop", "length", "abort", "error", "repetition")}


def fmt(v: float) -> str:
    """A sample value as prometheus_client writes it (``1.0``, ``3.104729e+06``, ``+Inf``)."""
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v))


def _labels(d: dict[str, str]) -> str:
    esc = lambda s: s.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in sorted(d.items())) + "}"


class _Hist:
    def __init__(self, buckets: list[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.sum += v
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
                return
        self.counts[-1] += 1


class Metrics:
    """The engine's metrics; thread-safe; :meth:`render` gives the /metrics body."""

    def __init__(
        self, version: str, model_name: str, cache_info: dict[str, str], show_hidden_for: str | None = None
    ) -> None:
        self.version = version
        self.base = {"engine": "0", "model_name": model_name}
        self.cache_info = cache_info
        self.hidden = version == "0.11" and show_hidden_for == "0.10"
        self.created = time.time()
        self._lock = threading.Lock()
        self.gauges = {k: 0.0 for k in GAUGES}
        self.counters = {k: 0.0 for k in [*COUNTERS, *DEPRECATED_COUNTERS]}
        self.success = {r: 0.0 for r in FINISHED_REASONS[version]}
        self.hists = {k: _Hist(b) for k, (_h, b) in HISTOGRAMS.items()}
        self.hists["vllm:request_num_preemptions"] = _Hist(_TOK)
        self.http: dict[tuple[str, str, str], float] = {}
        self.nixl = False

    def enable_nixl(self) -> None:
        """Expose the NIXL connector's metrics (an instance with a Nixl ``--kv-transfer-config``)."""
        with self._lock:
            self.nixl = True
            self.hists.update({k: _Hist(b) for k, (_h, b) in NIXL_HISTOGRAMS.items()})
            self.counters.update({k: 0.0 for k in NIXL_COUNTERS})

    def set_gauge(self, name: str, value: float) -> None:
        with self._lock:
            self.gauges[name] = value

    def add(self, name: str, value: float = 1.0) -> None:
        with self._lock:
            self.counters[name] += value

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            self.hists[name].observe(value)

    def finished(self, reason: str) -> None:
        with self._lock:
            self.success[reason] = self.success.get(reason, 0.0) + 1

    def http_request(self, handler: str, method: str, status: int) -> None:
        key = (handler, method, f"{status // 100}xx")
        with self._lock:
            self.http[key] = self.http.get(key, 0.0) + 1

    def render(self) -> str:
        """The exposition text (``text/plain; version=0.0.4``)."""
        out: list[str] = []
        lb, cr = _labels(self.base), fmt(self.created)

        def head(name: str, help_: str, typ: str) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {typ}")

        with self._lock:
            gauges = dict(GAUGES, **(DEPRECATED_GAUGES if self.hidden else {}))
            for name, help_ in gauges.items():
                value = self.gauges.get(name, self.gauges["vllm:kv_cache_usage_perc"])
                head(name, help_, "gauge")
                out.append(f"{name}{lb} {fmt(value)}")
            if self.version == "0.33":
                name = "vllm:num_requests_waiting_by_reason"
                head(name, "Number of requests waiting, by reason.", "gauge")
                for reason, v in (("capacity", self.gauges["vllm:num_requests_waiting"]), ("deferred", 0.0)):
                    out.append(f"{name}{_labels(dict(self.base, reason=reason))} {fmt(v)}")
            counters = dict(
                COUNTERS, **(DEPRECATED_COUNTERS if self.hidden else {}), **(NIXL_COUNTERS if self.nixl else {})
            )
            for name, help_ in counters.items():
                head(f"{name}_total", help_, "counter")
                out.append(f"{name}_total{lb} {fmt(self.counters[name])}")
                head(f"{name}_created", help_, "gauge")
                out.append(f"{name}_created{lb} {cr}")
            name = "vllm:request_success"
            help_ = "Count of successfully processed requests."
            head(f"{name}_total", help_, "counter")
            for r, v in self.success.items():
                out.append(f"{name}_total{_labels(dict(self.base, finished_reason=r))} {fmt(v)}")
            head(f"{name}_created", help_, "gauge")
            for r in self.success:
                out.append(f"{name}_created{_labels(dict(self.base, finished_reason=r))} {cr}")
            hists = dict(
                HISTOGRAMS,
                **{"vllm:request_num_preemptions": ("Number of preemptions per request.", _TOK)},
                **(NIXL_HISTOGRAMS if self.nixl else {}),
            )
            for name, (help_, _b) in hists.items():
                if self.version not in ONLY_IN.get(name, (self.version,)):
                    continue
                h = self.hists[name]
                head(name, help_, "histogram")
                acc = 0
                for b, c in zip([*h.buckets, math.inf], h.counts):
                    acc += c
                    out.append(f"{name}_bucket{_labels(dict(self.base, le=fmt(b)))} {fmt(acc)}")
                out.append(f"{name}_count{lb} {fmt(acc)}")
                out.append(f"{name}_sum{lb} {fmt(h.sum)}")
                head(f"{name}_created", help_, "gauge")
                out.append(f"{name}_created{lb} {cr}")
            head("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge")
            out.append(f"vllm:cache_config_info{_labels(dict(self.cache_info, engine='0'))} 1.0")
            help_ = "Total number of requests by method, status and handler."
            head("http_requests_total", help_, "counter")
            for (handler, method, status), v in sorted(self.http.items()):
                out.append(
                    f"http_requests_total{_labels({'handler': handler, 'method': method, 'status': status})} {fmt(v)}"
                )
            head("http_requests_created", help_, "gauge")
            for handler, method, status in sorted(self.http):
                out.append(
                    f"http_requests_created{_labels({'handler': handler, 'method': method, 'status': status})} {cr}"
                )
        return "\n".join(out) + "\n"


def cache_config_labels(
    *,
    block_size: int,
    cache_dtype: str,
    util: float,
    prefix: bool,
    num_gpu_blocks: int,
    version: str,
    kv_memory_bytes: Any = None,
) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` (every CacheConfig field, as strings)."""
    labels = {
        "block_size": str(block_size),
        "cache_dtype": cache_dtype,
        "calculate_kv_scales": "False",
        "cpu_kvcache_space_bytes": "None",
        "cpu_offload_gb": "0",
        "enable_prefix_caching": str(prefix),
        "gpu_memory_utilization": str(util),
        "is_attention_free": "False",
        "kv_cache_memory_bytes": str(kv_memory_bytes),
        "kv_sharing_fast_prefill": "False",
        "mamba_cache_dtype": "auto",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "0",
        "num_gpu_blocks": str(num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
    }
    if version == "0.11":
        labels.update(swap_space="4", swap_space_bytes="4294967296")
    return labels
