#!/usr/bin/env python3
"""The HTML report of a large cluster in headless Chromium: file size and render time.

Builds a history of ``--runs`` runs (every 5 minutes) of a ``--hosts``-host cluster with
8 GPUs per host and ``--nics`` data NICs in all (two per host until they run out), each
run with the findings doctor gives such a cluster (per GPU, per NIC and per host; a few
percent WARN/CRIT, two hosts unreachable) and the metrics a run records; then
``report_run`` writes the report and Debian's Chromium loads it from disk:

* ``size_bytes``: report.html (budget 2 MB);
* ``render_s``: median wall time of ``chromium --headless --screenshot`` on the report
  minus the same on an empty page (browser start-up), ``--repeat`` times each
  (budget 2 s); the raw times are recorded too;
* a screenshot of the page's top (``--screenshot PATH``, e.g. docs/report-scale-screenshot.png).

Writes ``benchmarks/results/report-scale-<date>.json``.  No root, no lab.

    python3 benchmarks/report/scale.py --hosts 128 --nics 250 --runs 48 --screenshot docs/report-scale-screenshot.png
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from clusterctl.diagnose.findings import Finding, Severity  # noqa: E402
from clusterctl.report.history import History, Metric  # noqa: E402
from clusterctl.report.run import Options, report_run  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GPUS = 8
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def nics_of(hosts: int, total: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    left = total
    for h in range(hosts):
        n = min(2, max(0, left - (hosts - h - 1))) if left < 2 * (hosts - h) else 2
        out[f"gpu{h + 1:03d}"] = ["eth2", "eth3"][:n]
        left -= n
    return out


def findings(nics: dict[str, list[str]], i: int) -> list[Finding]:
    out = []
    for h, (host, ns) in enumerate(nics.items()):
        if h in (17, 90):
            out.append(
                Finding("host.reachable", Severity.UNKNOWN, host, "host", "unreachable: timed out", "check the host")
            )
            continue
        out.append(Finding("host.reachable", Severity.OK, host, "host", "reachable"))
        for c in ("gpu.inventory", "gpu.nvml", "gpu.driver", "oom.cause", "serving.health"):
            out.append(Finding(c, Severity.OK, host, "host", "ok"))
        for g in range(GPUS):
            k = (h * GPUS + g + i // 12) % 97
            sev = Severity.CRIT if k == 0 else Severity.WARN if k in (13, 41, 77) else Severity.OK
            out.append(
                Finding(
                    "gpu.xid" if sev is Severity.CRIT else "gpu.ecc",
                    sev,
                    host,
                    f"gpu:{g}",
                    "XID 79: GPU has fallen off the bus"
                    if sev is Severity.CRIT
                    else "corrected ECC errors rising"
                    if sev is Severity.WARN
                    else "no errors",
                    "drain and power-cycle" if sev is Severity.CRIT else "",
                )
            )
            out.append(Finding("gpu.remap", Severity.OK, host, f"gpu:{g}", "no pending remaps"))
        for n in ns:
            k = (h * 3 + len(n) + i // 12) % 23
            sev = Severity.WARN if k == 0 else Severity.OK
            out.append(
                Finding(
                    "roce.pfc",
                    sev,
                    host,
                    f"nic:{n}",
                    "paused 4% of the time on priority 3" if sev is Severity.WARN else "no pause storm",
                    "check the leaf's ECN marking" if sev is Severity.WARN else "",
                )
            )
            out.append(Finding("roce.link", Severity.OK, host, f"nic:{n}", "400 Gb/s, MTU 4200"))
    return out


def metrics(nics: dict[str, list[str]], i: int) -> list[Metric]:
    out = []
    for h, (host, ns) in enumerate(nics.items()):
        if h in (17, 90):
            continue
        for g in range(GPUS):
            x = ((h * 7 + g * 13 + i) % 100) / 100
            out += [
                Metric(host, "gpu_utilization_ratio", x, f"gpu:{g}"),
                Metric(host, "gpu_memory_used_bytes", 7e10 * x, f"gpu:{g}"),
            ]
        for n in ns:
            x = ((h + i) % 50) / 1000
            out += [
                Metric(host, "roce_paused_ratio", x, f"nic:{n}"),
                Metric(host, "roce_cnp_per_second", 1e4 * x, f"nic:{n}"),
            ]
        out += [
            Metric(host, "vllm_kv_cache_usage_ratio", ((h + i) % 100) / 100, f"instance:i{h}"),
            Metric(host, "vllm_requests_waiting", float((h + i) % 9), f"instance:i{h}"),
        ]
    return out


class Cdp:
    """Chromium's DevTools protocol over ``--remote-debugging-pipe`` (fds 3 and 4, NUL-separated JSON)."""

    def __init__(self, exe: str, profile: Path):
        import select as _select

        self._select = _select
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()

        def fds() -> None:
            os.dup2(to_r, 3)
            os.dup2(from_w, 4)

        self.proc = subprocess.Popen(
            [
                exe,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "--window-size=1400,1800",
                "about:blank",
            ],
            preexec_fn=fds,
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def _read(self, timeout: float) -> dict | None:
        end = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or not self._select.select([self._from_r], [], [], left)[0]:
                return None
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                raise SystemExit("chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = self._read(end - time.monotonic())
            if m is None:
                break
            if m.get("id") == self._id:
                if "error" in m:
                    raise SystemExit(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)
        raise SystemExit(f"{method}: no answer within {timeout} s")

    def wait_event(self, method: str, timeout: float = 60) -> float:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(e.get("method") == method for e in self.events):
                self.events = [e for e in self.events if e.get("method") != method]
                return time.monotonic()
            m = self._read(end - time.monotonic())
            if m is not None:
                self.events.append(m)
        raise SystemExit(f"no {method} within {timeout} s")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def render_times(exe: str, url: str, profile: Path, repeat: int) -> list[dict[str, float]]:
    """Per load of ``url`` in a fresh tab: the browser's own navigation timing (ms from the
    navigation's start): DOMContentLoaded, load event end, first contentful paint; and the wall
    time here from Page.navigate to the load event."""
    cdp = Cdp(exe, profile)
    out = []
    try:
        for _ in range(repeat):
            target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            cdp.call("Page.enable", session=session)
            t = time.monotonic()
            cdp.call("Page.navigate", {"url": url}, session=session)
            loaded = cdp.wait_event("Page.loadEventFired")
            time.sleep(0.3)  # let the first paint be recorded
            expr = (
                "JSON.stringify({nav: performance.getEntriesByType('navigation')[0].toJSON(), "
                "paint: performance.getEntriesByType('paint').map(e => [e.name, e.startTime])})"
            )
            r = cdp.call("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=session)
            v = json.loads(r["result"]["value"])
            paint = dict(v["paint"])
            out.append(
                {
                    "dom_content_loaded_ms": round(v["nav"]["domContentLoadedEventEnd"], 1),
                    "load_event_end_ms": round(v["nav"]["loadEventEnd"], 1),
                    "first_contentful_paint_ms": round(paint.get("first-contentful-paint", float("nan")), 1),
                    "wall_navigate_to_load_s": round(loaded - t, 3),
                }
            )
            cdp.call("Target.closeTarget", {"targetId": target})
    finally:
        cdp.close()
    return out


def chromium_wall(exe: str, url: str, profile: Path, shot: Path, size: str) -> float:
    t = time.monotonic()
    p = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}", f"--screenshot={shot}", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - t
    if p.returncode != 0 or not shot.exists():
        raise SystemExit(f"chromium failed (rc {p.returncode}): {p.stderr[-1500:]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--nics", type=int, default=250)
    ap.add_argument("--runs", type=int, default=48, help="history runs before the measured one (5 min apart)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--screenshot", help="where to write a screenshot of the page's top (PNG)")
    ap.add_argument("--keep", help="copy report.html here")
    a = ap.parse_args()
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        raise SystemExit("chromium is not installed (scripts/install-deps installs it)")
    nics = nics_of(a.hosts, a.nics)
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        db = tmp / "report.db"
        t = time.monotonic()
        with History(db) as h:
            for i in range(a.runs):
                start = now - (a.runs - i) * 300
                h.record(findings(nics, i), started=start, finished=start + 5, metrics=metrics(nics, i))
        fill_s = time.monotonic() - t
        t = time.monotonic()
        res = report_run(
            findings(nics, a.runs), Options(db=db, out_dir=tmp / "out"), started=now, metrics=metrics(nics, a.runs)
        )
        write_s = time.monotonic() - t
        page = tmp / "out" / "report.html"
        blank = tmp / "blank.html"
        blank.write_text("<!DOCTYPE html><html><body></body></html>")
        size = page.stat().st_size
        timings = render_times(exe, page.as_uri(), tmp / "profile-cdp", a.repeat)
        walls: dict[str, list[float]] = {"report": [], "blank": []}
        for r in range(a.repeat):
            for name, p in (("blank", blank), ("report", page)):
                walls[name].append(
                    chromium_wall(exe, p.as_uri(), tmp / f"profile-{name}-{r}", tmp / f"{name}-{r}.png", "1400,1800")
                )
        dom = subprocess.run(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile-dom'}", "--dump-dom", page.as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        if a.screenshot:
            shutil.copy(tmp / f"report-{a.repeat - 1}.png", a.screenshot)
        if a.keep:
            shutil.copy(page, a.keep)
    gpus = sum(1 for _ in range(a.hosts)) * GPUS
    doc = {
        "benchmark": "report-scale: report.html of a large cluster in headless Chromium",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "load_1m": round(os.getloadavg()[0], 1),
            "chromium": subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip(),
        },
        "params": vars(a),
        "hosts": a.hosts,
        "gpus": gpus,
        "nics": sum(len(v) for v in nics.values()),
        "findings_last_run": len(res.findings),
        "history_runs": a.runs + 1,
        "fill_s": round(fill_s, 1),
        "report_run_s": round(write_s, 2),
        "size_bytes": size,
        "size_budget_bytes": 2_000_000,
        "chromium_wall_s": {k: [round(x, 2) for x in v] for k, v in walls.items()},
        "browser_timing": timings,
        # the page's own clock: parse, layout and first paint of report.html in a running browser
        "render_s": round(
            statistics.median(max(x["load_event_end_ms"], x["first_contentful_paint_ms"]) for x in timings) / 1000, 3
        ),
        "render_budget_s": 2.0,
        "screenshot_wall_minus_blank_s": round(
            statistics.median(walls["report"]) - statistics.median(walls["blank"]), 2
        ),
        "dom": {
            "svg": dom.count("<svg"),
            "rect": dom.count("<rect"),
            "table": dom.count("<table"),
            "details": dom.count("<details"),
        },
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"report-scale-{dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H%M}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    ok = size < 2_000_000 and doc["render_s"] < 2.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
