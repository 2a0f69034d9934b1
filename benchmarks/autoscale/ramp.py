"""The autoscaler under a load ramp on the lab: replicas, the signal and TTFT over time.

The scenario of tests/support/autoscale_ramp.py (nginx on the first lab host, a
template of TP-1 simulator replicas on the second, ``clusterctl autoscale
daemon --interval 1``, signal ``queue``), with ``max: 3`` and a longer ramp of
``clusterctl bench --request-rate`` phases through the gateway: rising, a
plateau, falling. Per phase: rate, requests completed and failed, TTFT p50/p90
and E2E p90 (the bench's own numbers). From the autoscaler's audit
(``autoscale/history.jsonl``): every decision (time, signal value, replica count,
rule, outcome). Writes ``benchmarks/results/autoscale-ramp-<date>.json`` and
``docs/autoscale-ramp.svg`` (replicas, the queue with its band, request rate and
TTFT p90 against time; temp file + rename).

Run as root with the lab's environment (``CLUSTERCTL_LAB_*``; brought up with 2
hosts if needed, left up). Usage: ``python benchmarks/autoscale/ramp.py
[--phases 1:20,3:30,5:40,3:30,0.5:50] [--time-scale 2]``; ``--real`` runs the short version on real vLLM
(CPU) replicas, one per lab host (``--phases 0.3:30,3:150,0.1:120``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from clusterctl.files import write_atomic  # noqa: E402
from clusterctl.lab.config import LabConfig  # noqa: E402
from clusterctl.lab.session import LabSession  # noqa: E402
from clusterctl.report.svg import line_chart  # noqa: E402
from support.autoscale_ramp import Ramp  # noqa: E402


def phases(text: str) -> list[tuple[float, float]]:
    return [(float(r), float(d)) for r, d in (p.split(":") for p in text.split(","))]


def plot(result: dict[str, Any]) -> str:
    t0 = 0.0  # absolute times: the charts label the x axis as UTC clock times
    hist = result["decisions"]
    rep: list[tuple[float, float]] = []
    for i, h in enumerate(hist):  # the count measured at the decision; a change counts once it is done
        rep.append((h["ts"] - t0, float(h["current"])))
        if h["outcome"] == "ok" and h["action"] != "none":
            # ``seconds`` also counts the measurement before ``ts``: never past the next decision
            at = min(h["ts"] + (h["seconds"] or 0.0), hist[i + 1]["ts"] if i + 1 < len(hist) else 1e18) - t0
            rep += [(at - 1e-3, float(h["current"])), (at, float(h["target"]))]  # a step, not a slope
    rep.sort(key=lambda p: p[0])
    sig = [(h["ts"] - t0, float(h["value"])) for h in hist if h["value"] is not None]
    band = result["policy"]
    rate, ttft = [], []
    for p in result["phases"]:
        for t in (p["started"] - t0, p["ended"] - t0):
            rate.append((t, p["rate"]))
            if p["ttft_p90_ms"] is not None:
                ttft.append((t, p["ttft_p90_ms"] / 1000.0))
    span = [x for x, _ in sig] or [0.0]
    charts = [
        line_chart("replicas (autoscaler decisions)", {"replicas": rep}, width=620, height=180),
        line_chart(
            "queue: waiting requests per replica, and the band",
            {
                "queue": sig,
                "high": [(span[0], band["high"]), (span[-1], band["high"])],
                "low": [(span[0], band["low"]), (span[-1], band["low"])],
            },
            colours={"queue": "#1f77b4", "high": "#d62728", "low": "#2ca02c"},
            width=620,
            height=180,
        ),
        line_chart("load: request rate sent (req/s)", {"rate": rate}, width=620, height=160),
        line_chart("TTFT p90 per phase (s)", {"ttft p90": ttft}, width=620, height=160),
    ]
    body = "".join(f'<g transform="translate(0,{sum((180, 180, 160, 160)[:i])})">{c}</g>' for i, c in enumerate(charts))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="620" height="680" viewBox="0 0 620 680">'
        f'<rect width="620" height="680" fill="#fff"/>{body}</svg>\n'
    )


def main() -> None:
    if sys.argv[1:2] == ["--replot"]:  # redraw the SVG from a results file
        write_atomic(REPO / "docs" / "autoscale-ramp.svg", plot(json.loads(Path(sys.argv[2]).read_text())))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--phases", default="0.5:20,1.5:30,3:40,4.5:40,1.5:30,0.3:60", help="RATE:SECONDS,... of bench phases"
    )
    ap.add_argument("--time-scale", type=float, default=5.0)
    ap.add_argument("--max", type=int, default=3)
    ap.add_argument(
        "--real",
        action="store_true",
        help="replicas of the real vLLM CPU engine, one per lab host "
        "(max 2 on 2 hosts); writes autoscale-ramp-real-*.json and docs/autoscale-ramp-real.svg",
    )
    ap.add_argument("--output-len", type=int, default=None, help="output tokens per request")
    args = ap.parse_args()
    lab = LabSession.start(LabConfig.from_env(), hosts=int(os.environ.get("CLUSTERCTL_LAB_HOSTS", "2")))
    root = Path(tempfile.mkdtemp(prefix="autoscale-ramp-"))
    policy: dict[str, Any] = {"max": args.max}
    if args.real:  # a real replica starts in 1-4 minutes on this shared machine: gates and holds to match
        policy.update(max=min(args.max, len(lab.names)), gate_timeout_s=600, scale_in_after_s=20, cooldown_in_s=20)
    r = Ramp(
        lab,
        root,
        name="asr" if args.real else "asb",
        time_scale=args.time_scale,
        policy=policy,
        port_base=8950,
        real=args.real,
    )
    if args.output_len:
        r.output_len = args.output_len
    tag = "autoscale-ramp-real" if args.real else "autoscale-ramp"
    r.cleanup()
    result: dict[str, Any] = {
        "phases": [],
        "policy": r.policy,
        "time_scale": None if args.real else args.time_scale,
        "engine": "vllm-0.32 (real, CPU)" if args.real else "simulator 0.11",
        "output_len": r.output_len,
        "lab_hosts": len(lab.names),
        "load_1m_before": os.getloadavg()[0],
    }
    try:
        r.start()
        r.start_daemon()
        result["started"] = time.time()
        for rate, duration in phases(args.phases):
            b = r.bench(rate, duration)
            res = b["results"][0]
            row = {
                "rate": rate,
                "duration_s": duration,
                "started": b["started"],
                "ended": b["ended"],
                "completed": res["completed"],
                "failed": res["failed"],
                "bench_rc": b["rc"],
                "trusted": b.get("trusted"),
                "ttft_p50_ms": (res.get("ttft_ms") or {}).get("median"),
                "ttft_p90_ms": (res.get("ttft_ms") or {}).get("p90"),
                "e2e_p90_ms": (res.get("e2e_ms") or {}).get("p90"),
            }
            result["phases"].append(row)
            print(json.dumps(row), flush=True)
        r.wait_for("in", result["phases"][-1]["started"], timeout=300 if args.real else 60)
        result["daemon_rc"] = r.stop_daemon()
        result["decisions"] = [
            {
                k: h.get(k)
                for k in ("ts", "value", "current", "target", "action", "rule", "outcome", "detail", "seconds")
            }
            for h in r.history()
        ]
    finally:
        r.cleanup()
    result["load_1m_after"] = os.getloadavg()[0]
    result["requests_sent"] = sum(p["completed"] + p["failed"] for p in result["phases"])
    result["requests_failed"] = sum(p["failed"] for p in result["phases"])
    acts = [h for h in result["decisions"] if h["action"] != "none"]
    result["actions"] = [
        {
            "t_s": round(h["ts"] - result["started"], 1),
            "action": h["action"],
            "replicas": f"{h['current']} -> {h['target']}",
            "rule": h["rule"],
            "outcome": h["outcome"],
            "seconds": h["seconds"],
        }
        for h in acts
    ]
    stamp = f"{datetime.now(timezone.utc):%Y-%m-%dT%H%M}"
    dest = REPO / "benchmarks" / "results" / f"{tag}-{stamp}.json"
    write_atomic(dest, json.dumps(result, indent=1) + "\n")
    write_atomic(REPO / "docs" / f"{tag}.svg", plot(result))
    print(f"wrote {dest} and docs/{tag}.svg")


if __name__ == "__main__":
    main()
