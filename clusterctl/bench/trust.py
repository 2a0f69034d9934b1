"""Can a level's numbers be trusted?  Signs that the load generator, not the server, shaped them.

A client that waits for a CPU (another process busy-polling the cores, as
vLLM's CPU engine does) reads each SSE chunk late: TTFT grows by the wait,
several chunks arrive in one read (ITL 0), and TPOT shrinks because the
tokens catch up at once.  The generator's own CPU share stays low, so it
does not show there.  Signals, each with the error it measures:

- **server** (when ``/metrics`` answers): the client's mean TTFT minus the
  server's own (``vllm:time_to_first_token_seconds``, from the request's
  arrival at vLLM's front end), and the client's mean TPOT against the
  server's (``vllm:request_time_per_output_token_seconds``);
- **loop lag**: how late the generator's event loop runs a 5 ms timer (a
  chunk waits in the socket that long before it is read and stamped);
- **coalesced chunks**: the share of inter-chunk gaps under 50 us, i.e.
  chunks of one stream read in the same wake-up (when over half, the ITL
  median is 0), unless the server's own TPOT says its tokens come that fast
  (under 1 ms: then the server sends them together, noted, not flagged);
- **generator CPU**: near one full core, the generator itself is the limit.

A signal past its limit flags the level: ``trusted`` false, the reasons, and
the measured errors; ``clusterctl bench`` then exits 3 (UNKNOWN), and a
release gate neither passes nor fails on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from clusterctl.bench.loadgen import RunResult
from clusterctl.bench.stats import percentile

#: TTFT: client minus server beyond max(ms, share of the server's TTFT).
TTFT_ERROR_MS, TTFT_ERROR_SHARE = 10.0, 0.25
#: TPOT: client against server beyond this share (and at least 0.5 ms apart).
TPOT_ERROR_SHARE, TPOT_ERROR_MS = 0.25, 0.5
#: Loop lag (mean, ms) beyond which chunks are stamped late by more than a scheduler time slice.
LAG_MS = 5.0
#: Gaps shorter than this (s) count as chunks read in one wake-up; flagged when they are over this share,
#: unless the server's TPOT is under SERVER_BURST_MS (it sends them that close together itself).
SAME_READ_S, COALESCED_SHARE, SERVER_BURST_MS = 50e-6, 0.5, 1.0
#: Generator CPU (% of one core) at or above which it is its own bottleneck.
CPU_PERCENT = 90.0


def _ms(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else round(x, 3)


def judge(
    run: RunResult, report: dict[str, Any], server_ttft_s: float | None = None, server_tpot_s: float | None = None
) -> dict[str, Any]:
    """The ``trust`` block of one level's report: ``trusted``, ``reasons`` and every measured error."""
    reasons: list[str] = []
    notes: list[str] = []
    out: dict[str, Any] = {}
    ttft = report["ttft_ms"]
    tpot = report["tpot_ms"]
    if server_ttft_s is not None and not math.isnan(ttft["mean"]):
        server = 1000 * server_ttft_s
        err = ttft["mean"] - server
        out["ttft_error_ms"] = _ms(err)
        limit = max(TTFT_ERROR_MS, TTFT_ERROR_SHARE * server)
        if abs(err) > limit:
            reasons.append(
                f"client TTFT {ttft['mean']:.1f} ms against the server's {server:.1f} ms "
                f"({err:+.1f} ms, limit {limit:.1f})"
            )
    if server_tpot_s is not None and server_tpot_s > 0 and not math.isnan(tpot["mean"]):
        server = 1000 * server_tpot_s
        share = (tpot["mean"] - server) / server
        out["tpot_error_pct"] = round(100 * share, 1)
        if abs(share) > TPOT_ERROR_SHARE and abs(tpot["mean"] - server) > TPOT_ERROR_MS:
            reasons.append(
                f"client TPOT {tpot['mean']:.2f} ms against the server's {server:.2f} ms ({100 * share:+.0f} %)"
            )
    if run.loop_lag:
        lag = 1000 * sum(run.loop_lag) / len(run.loop_lag)
        out["loop_lag_ms"] = {
            "mean": _ms(lag),
            "p99": _ms(1000 * percentile(run.loop_lag, 99)),
            "max": _ms(1000 * max(run.loop_lag)),
        }
        if lag > LAG_MS:
            reasons.append(
                f"generator's event loop {lag:.1f} ms late on average (limit {LAG_MS:g} ms): "
                "it waited for a CPU, so chunks were stamped late"
            )
    gaps = [g for r in run.results if r.ok for g in r.itl]
    if gaps:
        same = sum(1 for g in gaps if g < SAME_READ_S) / len(gaps)
        out["coalesced_share"] = round(same, 3)
        reads = sum(r.reads for r in run.results if r.ok)
        chunks = sum(len(r.itl) + 1 for r in run.results if r.ok)
        out["chunks_per_read"] = round(chunks / reads, 2) if reads else None
        if same > COALESCED_SHARE:
            text = (
                f"{100 * same:.0f} % of chunks arrived in the same read as the one before (ITL median "
                f"{report['itl_ms']['median']:.2f} ms)"
            )
            if server_tpot_s is not None and 1000 * server_tpot_s < SERVER_BURST_MS:
                notes.append(
                    f"{text}; the server's TPOT is {1000 * server_tpot_s:.2f} ms, so it sends them "
                    "that close together itself"
                )
            else:
                reasons.append(
                    f"{text}: the generator read late, or a proxy buffers the stream; ITL and TPOT are not the engine's"
                )
    cpu = report.get("generator_cpu_percent")
    if isinstance(cpu, (int, float)) and cpu >= CPU_PERCENT:
        reasons.append(f"generator used {cpu:.0f} % of a core: it is its own bottleneck")
    return {"trusted": not reasons, "reasons": reasons, "notes": notes, **out}


def untrusted(reports: Sequence[dict[str, Any]]) -> list[str]:
    """One line per untrusted level of ``reports`` (empty: all trusted or none judged)."""
    return [
        f"concurrency {r['concurrency']}: " + "; ".join(r["trust"]["reasons"])
        for r in reports
        if not r.get("trust", {}).get("trusted", True)
    ]
