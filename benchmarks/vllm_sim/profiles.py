"""Latency-profile benchmark: the field report's operating points at 1x, and each profile's curves.

Part 1 runs the three 8B INT8 operating points of docs/latency-profiles.md in
real time (``--time-scale 1``): the threaded step engine
(``clusterctl.lab.vllm_sim.batching.StepEngine``, the one ``vllm serve`` uses)
with N closed-loop client threads for ``--seconds`` after ``--warmup``;
TTFT, ITL and output tokens/s are measured by the clients on the wall clock,
CPU idle (from /proc/stat, the whole machine, shared with others) and the
benchmark's own CPU use (getrusage: engine + client threads) show the CPU
was not the bottleneck (the engine waits out step times, it does not
compute them).

Part 2 computes each profile's curve (TTFT and output tokens/s against
concurrent users) on the virtual clock (``latency.measure``) and draws
docs/latency-profiles.svg (no plotting library needed).

Writes ``benchmarks/results/vllm-sim-profiles-<date>.json``.

Example: python3 benchmarks/vllm_sim/profiles.py --seconds 60 --warmup 15
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from clusterctl.lab.vllm_sim import latency as L  # noqa: E402
from clusterctl.lab.vllm_sim.batching import StepEngine  # noqa: E402
from clusterctl.lab.vllm_sim.engine import GenRequest  # noqa: E402
from clusterctl.lab.vllm_sim.profiles import PROFILES  # noqa: E402
from clusterctl.lab.vllm_sim.scheduler import Scheduler  # noqa: E402
from clusterctl.lab.vllm_sim.toylm import ToyLM  # noqa: E402


def cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of all CPUs."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return f[3] + f[4], sum(f[:8])


def real_time_point(s: L.Scenario, seconds: float, warmup: float) -> dict[str, Any]:
    """Closed-loop clients against the threaded engine at 1x; figures from the clients' wall clock."""
    w = s.workload
    sched = Scheduler(
        PROFILES[s.profile],
        L.MODELS[s.model],
        ToyLM(noise=False),
        num_blocks=w.num_blocks,
        max_num_seqs=w.max_num_seqs,
        max_num_batched_tokens=w.max_num_batched_tokens,
    )
    eng = StepEngine(sched, vocab=151936, scale=1.0)
    t0 = time.monotonic()
    t_measure, t_end = t0 + warmup, t0 + warmup + seconds
    lock = threading.Lock()
    ttfts: list[float] = []
    itls: list[float] = []
    tokens = [0]

    def client(u: int) -> None:
        k = 0
        while time.monotonic() < t_end:
            k += 1
            toks = [f" u{u}r{k}w{i}" for i in range(w.prompt_len)]
            req = GenRequest(
                prompt="".join(toks),
                prompt_tokens=toks,
                max_tokens=w.output_len,
                temperature=0.0,
                seed=k,
                ignore_eos=True,
            )
            sent = time.monotonic()
            first = last = None
            n = 0
            for _ev in eng.generate(req):
                now = time.monotonic()
                if first is None:
                    first = now
                last = now
                n += 1
                if t_measure <= now <= t_end:
                    with lock:
                        tokens[0] += 1
            if sent >= t_measure and first is not None and last is not None and last <= t_end:
                with lock:
                    ttfts.append(first - sent)
                    if n > 1:
                        itls.append((last - first) / (n - 1))

    idle0, total0 = cpu_times()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(u,), daemon=True) for u in range(w.users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(warmup + seconds + 120)
    idle1, total1 = cpu_times()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    own = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / max(1e-9, time.monotonic() - w0)
    eng.close()
    itl = sum(itls) / len(itls) if itls else 0.0
    return {
        "scenario": s.name,
        "users": w.users,
        "prompt_len": w.prompt_len,
        "output_len": w.output_len,
        "max_num_seqs": w.max_num_seqs,
        "max_num_batched_tokens": w.max_num_batched_tokens,
        "requests": len(ttfts),
        "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else None,
        "itl_mean_s": itl,
        "per_user_tps": 1 / itl if itl else None,
        "output_tps": tokens[0] / seconds,
        "cpu_idle_pct": 100.0 * (idle1 - idle0) / max(1, total1 - total0),
        "own_cpu_pct_of_one_core": 100.0 * own,
        "target": s.target,
        "virtual_clock": L.run(s).as_dict(),
    }


CURVES = [
    ("l40s-48g 8B INT8, report's initial budget (4 seqs / 512 tokens)", L.REPORT[1], [1, 2, 4, 8, 12, 16]),
    ("l40s-48g 8B INT8, vLLM default budget (256 / 2048)", L.REPORT[2], [1, 2, 4, 8, 12, 16]),
    ("l40s-48g x4 TP 27B AWQ, bursts (prompt 4096)", L.REPORT[3], [1, 5, 10, 15, 20, 30]),
    (
        "h100-sxm 8B BF16, 1024 / 8192, prompt 1024, output 128",
        L.Scenario(
            "h100-8b",
            "h100-sxm",
            "8b-bf16",
            L.Workload(1, 1024, 128, 1024, 8192, L.BLOCKS_H100_8B, duration=120, warmup=20),
            {},
        ),
        [1, 4, 16, 32, 64, 128],
    ),
]
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]


def svg(curves: list[dict[str, Any]]) -> str:
    """Two panels (TTFT, output tokens/s against users), log-scaled y, one line per curve."""
    import math

    W, H, M = 900, 380, 60
    pw = (W - 3 * M) / 2
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H + 110}" font-family="sans-serif" '
        'font-size="11">',
        f'<rect width="{W}" height="{H + 110}" fill="white"/>',
    ]
    for panel, (key, label) in enumerate((("ttft_mean", "mean TTFT (s)"), ("output_tps", "output tokens/s"))):
        x0 = M + panel * (pw + M)
        vals = [p[key] for c in curves for p in c["points"] if p[key] > 0]
        lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
        maxu = max(p["users"] for c in curves for p in c["points"])

        def X(u: float) -> float:
            return x0 + pw * math.log2(u) / math.log2(maxu)

        def Y(v: float) -> float:
            return M + (H - 2 * M) * (1 - (math.log10(v) - lo) / (hi - lo))

        out.append(f'<rect x="{x0}" y="{M}" width="{pw}" height="{H - 2 * M}" fill="none" stroke="#888"/>')
        for e in range(lo, hi + 1):
            out.append(f'<line x1="{x0}" x2="{x0 + pw}" y1="{Y(10**e):.1f}" y2="{Y(10**e):.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{x0 - 5}" y="{Y(10**e) + 4:.1f}" text-anchor="end">{10**e:g}</text>')
        u = 1
        while u <= maxu:
            out.append(f'<text x="{X(u):.1f}" y="{H - M + 15}" text-anchor="middle">{u}</text>')
            u *= 2
        out.append(f'<text x="{x0 + pw / 2}" y="{H - M + 32}" text-anchor="middle">concurrent users (log2)</text>')
        out.append(f'<text x="{x0 + pw / 2}" y="{M - 10}" text-anchor="middle" font-size="13">{label}</text>')
        for c, colour in zip(curves, COLOURS):
            pts = " ".join(f"{X(p['users']):.1f},{Y(p[key]):.1f}" for p in c["points"] if p[key] > 0)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
            for p in c["points"]:
                if p[key] > 0:
                    out.append(f'<circle cx="{X(p["users"]):.1f}" cy="{Y(p[key]):.1f}" r="3" fill="{colour}"/>')
    for i, (c, colour) in enumerate(zip(curves, COLOURS)):
        y = H + 10 + 22 * i
        out.append(f'<line x1="{M}" x2="{M + 30}" y1="{y}" y2="{y}" stroke="{colour}" stroke-width="3"/>')
        out.append(f'<text x="{M + 38}" y="{y + 4}">{c["label"]}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Example: python3 benchmarks/vllm_sim/profiles.py --seconds 60"
    )
    ap.add_argument("--seconds", type=float, default=60.0, help="measured seconds per real-time point")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring")
    ap.add_argument("--skip-real-time", action="store_true", help="only the virtual-clock curves")
    ap.add_argument("--svg", type=Path, default=REPO / "docs" / "latency-profiles.svg")
    a = ap.parse_args()
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": len(Path("/proc/stat").read_text().split("\ncpu")) - 1,
    }
    if not a.skip_real_time:
        result["real_time"] = []
        for s in L.REPORT[:3]:
            pt = real_time_point(s, a.seconds, a.warmup)
            print(json.dumps(pt), flush=True)
            result["real_time"].append(pt)
    curves = []
    for label, s, users in CURVES:
        curves.append(
            {
                "label": label,
                "scenario": s.name,
                "profile": s.profile,
                "model": s.model,
                "workload": {k: v for k, v in vars(s.workload).items()},
                "points": [L.run(s, users=u).as_dict() for u in users],
            }
        )
    result["curves"] = curves
    out = REPO / "benchmarks" / "results" / f"vllm-sim-profiles-{dt.datetime.now():%Y-%m-%dT%H%M}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.rename(out)
    stmp = a.svg.with_suffix(".tmp")
    stmp.write_text(svg(curves))
    stmp.rename(a.svg)
    print(f"wrote {out.relative_to(REPO)} and {a.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
