"""Serving health of vLLM instances: ``/metrics`` samples and the engine's log.

``serving.metrics`` reads ``<instance>.metrics`` (and ``<instance>.metrics.2``,
taken ``ctx.interval_s`` seconds later): KV-cache usage pinned near full,
a waiting queue that grows, preemptions rising, TTFT p99 (from the
histogram's buckets, over the interval when there are two samples) above the
SLO of ``checks/gpu.yaml``.  Both KV metric names are read
(``vllm:kv_cache_usage_perc``, older ``vllm:gpu_cache_usage_perc``).  Requests
running in both samples with ``vllm:generation_tokens_total`` not moving is a
hung engine (``/health`` does not see it).

``serving.engine`` reads ``<instance>.log``: engine death, NCCL watchdog
timeouts, and V0 preemption warnings.
"""

from __future__ import annotations

import math
import re
from typing import Any

from clusterctl.diagnose import sources
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.oom import kv_capacity_advice
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.diagnose.thresholds import number, section
from clusterctl.diagnose.vllmlog import parse_log

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL_NAME = re.compile(r'[\s,]*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"')
_QUOTE_OR_ESCAPE = re.compile(r'["\\]')


def parse_labels(text: str) -> dict[str, str]:
    """``a="x",b="y\\"z"`` -> ``{a: x, b: y\\"z}`` (escapes kept as written), in one linear scan.

    No regular expression with a repeated alternation: that one backtracked and
    used about 160 bytes of memory per character of a long label value.  A
    malformed rest (no closing quote) is ignored."""
    out: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        m = _LABEL_NAME.match(text, i)
        if not m:
            break
        start = i = m.end()
        while True:
            q = _QUOTE_OR_ESCAPE.search(text, i)
            if q is None:
                return out
            k = q.start()
            if text[k] == '"':
                out.setdefault(m.group(1), text[start:k])
                i = k + 1
                break
            i = k + 2
    return out


#: Parsed Prometheus text: metric name -> [(labels, value)] (:func:`parse_metrics`).
Metrics = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Metrics:
    """Prometheus text exposition -> name -> [(labels, value)]; comments and junk are skipped."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        out.setdefault(m["name"], []).append((parse_labels(m["labels"] or ""), value))
    return out


def total(metrics: Metrics, *names: str) -> float | None:
    """Sum over label sets of the first name present (engines of one server add up)."""
    for n in names:
        if n in metrics:
            return sum(v for _, v in metrics[n])
    return None


def peak(metrics: dict[str, list[tuple[dict[str, str], float]]], *names: str) -> float | None:
    for n in names:
        if n in metrics:
            return max(v for _, v in metrics[n])
    return None


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus-style quantile from cumulative ``(le, count)`` buckets (linear in the bucket)."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 1.0)
        prev_le, prev_c = le, c
    return prev_le


def _buckets(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for labels, v in metrics.get(name + "_bucket", []):
        le = float(labels.get("le", "inf").replace("+Inf", "inf"))
        out[le] = out.get(le, 0.0) + v
    return out


@analyzer("serving.metrics")
def check_metrics(ctx: AnalysisContext) -> list[Finding]:
    lim = section(ctx.thresholds, "gpu", "serving")
    out: list[Finding] = []
    for host, name, text in sources.raw_instances(ctx, ".metrics"):
        later_text = ctx.raw.get(host, {}).get(name + ".metrics.2")
        out.extend(
            _instance(ctx, lim, host, name, parse_metrics(text), parse_metrics(later_text) if later_text else None)
        )
    return out


def _instance(
    ctx: AnalysisContext, lim: dict[str, Any], host: str, name: str, m0: Metrics, m1: Metrics | None
) -> list[Finding]:
    subj = f"instance:{name}"
    now = m1 or m0
    found: list[Finding] = []
    if not any(k.startswith("vllm:") for k in now):
        return [
            Finding(
                "serving.metrics",
                Severity.UNKNOWN,
                host,
                subj,
                "the /metrics sample has no vllm: metrics",
                "check that the URL is the vLLM server's /metrics",
            )
        ]
    kv = peak(now, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    kv_warn, kv_crit = number(lim, "kv_cache_usage_warn", 0.9), number(lim, "kv_cache_usage_crit", 0.98)
    if kv is not None and kv >= kv_warn:
        pinned = m1 is not None and (peak(m0, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc") or 0) >= kv_warn
        found.append(
            Finding(
                "serving.metrics",
                Severity.CRIT if kv >= kv_crit and pinned else Severity.WARN,
                host,
                subj,
                f"KV cache {kv * 100:.0f} % full" + (" in both samples" if pinned else ""),
                "add capacity (more replicas or TP), lower --max-num-seqs, or route load elsewhere",
                (f"kv_cache_usage_perc={kv:.3f}",),
            )
        )
    w1 = total(now, "vllm:num_requests_waiting")
    if m1 is not None:
        w0 = total(m0, "vllm:num_requests_waiting")
        if w0 is not None and w1 is not None and w1 - w0 >= number(lim, "waiting_warn", 1) and w1 > 0:
            found.append(
                Finding(
                    "serving.metrics",
                    Severity.WARN,
                    host,
                    subj,
                    f"waiting queue growing: {w0:.0f} -> {w1:.0f} in {ctx.interval_s:g} s",
                    "the instance is saturated: add replicas or shed load",
                    (f"num_requests_waiting {w0:.0f} -> {w1:.0f}",),
                )
            )
        p0, p1 = total(m0, "vllm:num_preemptions_total"), total(m1, "vllm:num_preemptions_total")
        if p0 is not None and p1 is not None and p1 > p0:
            rate = (p1 - p0) / ctx.interval_s if ctx.interval_s else float(p1 - p0)
            if rate >= number(lim, "preemptions_per_s_warn", 0.1):
                found.append(
                    Finding(
                        "serving.metrics",
                        Severity.WARN,
                        host,
                        subj,
                        f"preemptions rising: +{p1 - p0:.0f} in {ctx.interval_s:g} s (KV cache too small for the load)",
                        f"{_kv_advice(ctx, name)}, lower --max-num-seqs, or add replicas",
                        (f"num_preemptions_total {p0:.0f} -> {p1:.0f}",),
                    )
                )
    if m1 is not None:
        r0, r1 = total(m0, "vllm:num_requests_running"), total(m1, "vllm:num_requests_running")
        g0, g1 = total(m0, "vllm:generation_tokens_total"), total(m1, "vllm:generation_tokens_total")
        q0, q1 = total(m0, "vllm:num_requests_waiting"), total(m1, "vllm:num_requests_waiting")
        hung = engine_hung(
            r0, r1, g0, g1, q0, q1, total(m0, "vllm:prompt_tokens_total"), total(m1, "vllm:prompt_tokens_total")
        )
        if hung:
            found.append(
                Finding(
                    "serving.metrics",
                    Severity.CRIT,
                    host,
                    subj,
                    f"engine hung: {hung_words(hung, r1, q1)} in {ctx.interval_s:g} s",
                    "restart the instance; check serving.engine and the TP group's GPUs (a hung collective or GPU)",
                    (
                        f"generation_tokens_total {g0:.0f} -> {g1:.0f}, running {r0:.0f} -> {r1:.0f}, "
                        f"waiting {q0 or 0:.0f} -> {q1 or 0:.0f}",
                    ),
                )
            )
    b1 = _buckets(now, "vllm:time_to_first_token_seconds")
    if m1 is not None:
        b0 = _buckets(m0, "vllm:time_to_first_token_seconds")
        b1 = {le: c - b0.get(le, 0.0) for le, c in b1.items()}
    p99 = histogram_quantile(list(b1.items()), 0.99)
    slo = number(lim, "ttft_p99_slo_s", 5.0)
    if p99 is not None and p99 > slo:
        found.append(
            Finding(
                "serving.metrics",
                Severity.WARN,
                host,
                subj,
                f"TTFT p99 {p99:.2f} s above the SLO {slo:g} s" + (" over the interval" if m1 else ""),
                "long queues or prefill contention: add replicas, lower --max-num-batched-tokens",
                (f"ttft_p99={p99:.3f}s",),
            )
        )
    return found or [Finding("serving.metrics", Severity.OK, host, subj, "serving metrics within limits")]


def _kv_advice(ctx: AnalysisContext, name: str) -> str:
    inv = ctx.inventory
    return kv_capacity_advice(inv.instances.get(name) if inv is not None else None, inv)


def engine_hung(
    running0: float | None,
    running1: float | None,
    generated0: float | None,
    generated1: float | None,
    waiting0: float | None = None,
    waiting1: float | None = None,
    prompt0: float | None = None,
    prompt1: float | None = None,
) -> str | None:
    """How an engine is hung between two ``/metrics`` samples, which ``/health`` does not see
    (``None``: not hung).  The one rule of doctor's ``serving.metrics`` and of ``clusterctl
    status`` (which ``gateway sync`` follows):

    * ``"running"``: requests running in both samples and ``vllm:generation_tokens_total`` not
      moving between them;
    * ``"waiting"``: no request running in either sample, requests waiting in both, and neither
      ``vllm:generation_tokens_total`` nor ``vllm:prompt_tokens_total`` moving.  vLLM's scheduler
      admits a waiting request at its next step whenever a seat and KV blocks are free, and with
      nothing running every seat and block is free: a queue that stays put with nothing running
      is an engine whose steps do not complete (``num_requests_waiting`` is ``len(waiting)`` in
      vLLM V1's ``Scheduler.make_stats``; it also counts requests waiting for a remote prefill's KV
      cache, so a decode instance of a stalled prefill/decode transfer is caught too).
      Requests that finish between the samples move the token counters: not hung.
    """
    if generated0 is None or generated1 is None or generated1 > generated0:
        return None
    if running0 and running1:
        return "running"
    if (
        running0 == 0
        and running1 == 0
        and waiting0
        and waiting1
        and (prompt0 is None or prompt1 is None or prompt1 <= prompt0)
    ):
        return "waiting"
    return None


def hung_words(how: str, running: float | None, waiting: float | None) -> str:
    """What :func:`engine_hung`'s answer means, with the last sample's counts."""
    if how == "waiting":
        return f"{waiting or 0:.0f} request(s) waiting, none running or admitted, no token generated"
    return f"{running or 0:.0f} requests running but no token generated"


@analyzer("serving.engine")
def check_engine(ctx: AnalysisContext) -> list[Finding]:
    out: list[Finding] = []
    for host, name, text in sources.raw_instances(ctx, ".log"):
        ev = parse_log(text)
        subj = f"instance:{name}"
        if ev.nccl:
            out.append(
                Finding(
                    "serving.engine",
                    Severity.CRIT,
                    host,
                    subj,
                    "NCCL collective timed out or failed in the TP group",
                    "check the TP group's GPUs (gpu.*) and the data network; restart the instance",
                    tuple(ev.nccl[:2]),
                )
            )
        if ev.engine_dead:
            started = "after it was serving" if ev.ready else "during start-up"
            inst = ctx.inventory.instances.get(name) if ctx.inventory is not None else None
            if ev.dead_worker is not None and inst is not None and len(inst.placement) > 1:
                from clusterctl.diagnose.tp import dead_member, dead_worker_message  # start-up: --help reaches this

                gpu = dead_member(inst, ev.dead_worker)
                out.append(
                    Finding(
                        "serving.engine",
                        Severity.CRIT,
                        host,
                        subj,
                        f"{dead_worker_message(inst, ev.dead_worker, gpu, ctx)} {started}: the TP group of "
                        f"{len(inst.placement)} is UNAVAILABLE",
                        f"check {gpu or 'the group'}'s GPU findings (gpu.*) and the kernel log (XIDs), "
                        "then restart the instance",
                        (ev.dead_worker["line"], *ev.engine_dead[:1]),
                    )
                )
            else:
                why = "oom.cause and " if ev.cuda_oom or ev.kv_short or ev.no_kv or ev.free_mem else ""
                out.append(
                    Finding(
                        "serving.engine",
                        Severity.CRIT,
                        host,
                        subj,
                        f"the vLLM engine died {started}",
                        f"see {why}the log's first error; restart the instance once the cause is fixed",
                        tuple(ev.engine_dead[:2]),
                    )
                )
        if ev.preemptions_v0:
            out.append(
                Finding(
                    "serving.engine",
                    Severity.WARN,
                    host,
                    subj,
                    f"requests preempted for KV cache space ({ev.preemptions_v0} so far)",
                    f"{_kv_advice(ctx, name)}, or lower --max-num-seqs",
                )
            )
        if not (ev.nccl or ev.engine_dead or ev.preemptions_v0):
            out.append(
                Finding(
                    "serving.engine",
                    Severity.OK,
                    host,
                    subj,
                    "engine log shows no failure" + ("" if ev.ready else " (not ready yet)"),
                )
            )
    return out
