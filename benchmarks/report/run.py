"""Report history benchmark: the cost of one `report run` against a full history.

Fills a scratch history with ``--days`` of runs every ``--every`` minutes
(35 days x 5 min = 10080 runs by default), each with ``--hosts`` hosts x
``--checks`` findings (a few WARN/CRIT among OK) and the 22 metrics per host a run
records on an 8-GPU RoCE node with one instance (:func:`metrics`),
then times ``--rounds`` further runs of :func:`clusterctl.report.run.report_run`
writing JSON, Markdown, HTML and a textfile (the work a timer does after
doctor has gathered its findings). Writes ``benchmarks/results/report-<date>.json``:
fill time, database size, wall seconds per round, HTML size. No root, no lab.

Example: python3 benchmarks/report/run.py --days 35 --every 5 --hosts 16 --checks 20 --rounds 5
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.report.history import History, Metric
from clusterctl.report.run import Options, report_run

RESULTS = Path(__file__).resolve().parents[1] / "results"


def findings(hosts: int, checks: int, i: int) -> list[Finding]:
    out = []
    for h in range(hosts):
        for c in range(checks):
            sev = (
                Severity.CRIT
                if (h + c + i // 50) % 97 == 0
                else Severity.WARN
                if (h * c + i // 20) % 53 == 0
                else Severity.OK
            )
            out.append(Finding(f"check.{c}", sev, f"gpu{h + 1:02d}", f"gpu:{c % 8}", f"state {sev.name}"))
    return out


def metrics(hosts: int, i: int, gpus: int = 8) -> list[Metric]:
    """What a run records per host of an 8-GPU RoCE node with one instance: memory and
    utilisation per GPU, paused fraction and CNP rate per data NIC (2), KV cache and queue."""
    out = []
    for h in range(hosts):
        host, x = f"gpu{h + 1:02d}", ((h + i) % 100) / 100
        out += [Metric(host, "gpu_utilization_ratio", x, f"gpu:{g}") for g in range(gpus)]
        out += [Metric(host, "gpu_memory_used_bytes", 7e10 * x, f"gpu:{g}") for g in range(gpus)]
        for nic in ("eth2", "eth3"):
            out += [
                Metric(host, "roce_paused_ratio", x / 10, f"nic:{nic}"),
                Metric(host, "roce_cnp_per_second", 1000 * x, f"nic:{nic}"),
            ]
        out += [
            Metric(host, "vllm_kv_cache_usage_ratio", x, f"instance:i{h}"),
            Metric(host, "vllm_requests_waiting", float(i % 7), f"instance:i{h}"),
        ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=float, default=35)
    ap.add_argument("--every", type=float, default=5, help="minutes between runs")
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--checks", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    n = int(a.days * 1440 / a.every)
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "report.db"
        t = time.monotonic()
        with History(db) as h:
            for i in range(n):
                start = now - (n - i) * a.every * 60 + 60  # the oldest is just inside retention
                h.record(findings(a.hosts, a.checks, i), started=start, finished=start + 5, metrics=metrics(a.hosts, i))
        fill_s = time.monotonic() - t
        size = sum(p.stat().st_size for p in Path(tmp).glob("report.db*"))
        rounds = []
        for r in range(a.rounds):
            t = time.monotonic()
            res = report_run(
                findings(a.hosts, a.checks, n + r),
                Options(db=db, out_dir=Path(tmp) / "out", textfile=Path(tmp) / "c.prom"),
                started=time.time(),
                metrics=metrics(a.hosts, n + r),
            )
            rounds.append(round(time.monotonic() - t, 3))
        html = (Path(tmp) / "out" / "report.html").stat().st_size
    doc = {
        "benchmark": "report-run",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_1m": os.getloadavg()[0]},
        "params": vars(a),
        "history_runs": n,
        "findings_per_run": a.hosts * a.checks,
        "metrics_per_run": len(metrics(a.hosts, 0)),
        "fill_s": round(fill_s, 1),
        "db_bytes": size,
        "round_s": rounds,
        "median_round_s": statistics.median(rounds),
        "html_bytes": html,
        "last_exit_code": res.exit_code,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"report-{dt.datetime.now():%Y-%m-%dT%H%M}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
