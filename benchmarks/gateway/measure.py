"""What the gateway costs and how fast it follows a change, on the lab.

Sets up what ``tests/lab/test_gateway.py`` sets up (nginx + njs on the first
lab host, four simulator units on the next two, ``gateway deploy``), then:

* overhead: ``--requests`` sequential one-token completions straight to an
  instance and through the gateway (njs reads the body, routes, proxies);
  p50/p95 latency in ms of each and the difference;
* concurrency: ``--concurrency`` clients at once through the gateway, all
  answered 200 or not;
* mark-down: how long the drain hook's ``mark_down`` and ``mark_up`` take
  (render, SSH, write, ``nginx -t``, graceful reload, the new config seen on
  8 fresh connections), median and max of ``--repeat``;
* sync without change: ``gateway sync --window 0`` when nothing changed.

Run as root with the lab's environment (``CLUSTERCTL_LAB_*``; the lab is
brought up if needed and left up).  Usage:
``python benchmarks/gateway/measure.py [--requests 200] [--repeat 5] [--concurrency 32]``.
Writes ``benchmarks/results/gateway-<date>.json`` (temp file + rename).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "lab")]

from clusterctl.cli.main import main  # noqa: E402
from clusterctl.inventory.loader import load_inventory  # noqa: E402
from clusterctl.lab.config import LabConfig  # noqa: E402
from clusterctl.lab.session import LabSession  # noqa: E402
from support.http import wait_healthy  # noqa: E402
from test_gateway import GW_PORT, INSTANCES, MODEL_DIR, _install  # noqa: E402


def _post(url: str, session: str | None = None) -> float:
    body = json.dumps({"model": "tiny", "prompt": "hello there", "max_tokens": 1}).encode()
    req = urllib.request.Request(
        url + "/v1/completions",
        data=body,
        headers={"Content-Type": "application/json", **({"X-Session-ID": session} if session else {})},
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
        assert r.status == 200
    return (time.perf_counter() - t0) * 1000


def _pct(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50_ms": round(statistics.median(xs), 2), "p95_ms": round(xs[int(0.95 * (len(xs) - 1))], 2)}


def setup(lab: LabSession, work: Path) -> dict[str, Any]:
    names = lab.names
    hosts = {n: names[i] for n, (i, _, _, _) in INSTANCES.items()}
    text = Path(lab.inventory).read_text() + (
        "models:\n"
        f"  tiny: {{path: {MODEL_DIR}, served_name: tiny}}\n"
        f"  tiny-v2: {{path: {MODEL_DIR}, served_name: tiny}}\n"
        "instances:\n"
    )
    for n, (_, gpu, port, model) in INSTANCES.items():
        if model == "tiny":
            text += f"  {n}: {{model: {model}, engine: vllm-0.11, placement: '{hosts[n]}:{gpu}', port: {port}}}\n"
    text += f"gateway:\n  hosts: {names[0]}\n  port: {GW_PORT}\n  max_conns: 64\n  sync_interval_s: 1\n  auth: none\n"
    inv = work / "inventory.yaml"
    inv.write_text(text)
    for n, (_, gpu, port, model) in INSTANCES.items():
        if model == "tiny":
            _install(lab, hosts[n], n, gpu, port, model)
            wait_healthy(
                lab,
                hosts[n],
                f"http://{lab.host(hosts[n]).address}:{port}/health",
                f"clusterctl-{n}.service",
                timeout=90,
            )
    state = work / "state"
    assert main(["gateway", "deploy", names[0], "-i", str(inv), "--state-dir", str(state)]) == 0
    return {
        "inv": str(inv),
        "state": str(state),
        "hosts": hosts,
        "gw": f"http://{lab.host(names[0]).address}:{GW_PORT}",
        "direct": f"http://{lab.host(hosts['g-a1']).address}:{INSTANCES['g-a1'][2]}",
    }


def teardown(lab: LabSession, env: dict[str, Any]) -> None:
    for n, host in env["hosts"].items():
        lab.run(
            host,
            f"systemctl stop clusterctl-{n}.service; rm -f /etc/systemd/system/clusterctl-{n}.service; "
            "systemctl daemon-reload; systemctl reset-failed",
            timeout=120,
        )
    lab.run(lab.names[0], "systemctl disable --now nginx.service", timeout=60)


def measure(env: dict[str, Any], requests: int, repeat: int, concurrency: int) -> dict[str, Any]:
    from clusterctl.gateway.hook import gateway_hook

    for _ in range(20):  # warm connections, njs, keepalive to the upstreams
        _post(env["gw"])
        _post(env["direct"])
    direct = [_post(env["direct"]) for _ in range(requests)]
    via = [_post(env["gw"]) for _ in range(requests)]
    sticky = [_post(env["gw"], "bench-session") for _ in range(requests)]
    with cf.ThreadPoolExecutor(concurrency) as pool:
        ok = sum(1 for _ in pool.map(lambda i: _post(env["gw"], f"c-{i}"), range(concurrency * 4)))
    os.environ["CLUSTERCTL_STATE_DIR"] = env["state"]
    hook = gateway_hook(load_inventory(env["inv"]))
    assert hook is not None
    down, up = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        hook.mark_down("g-a3", "benchmark")
        down.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        hook.mark_up("g-a3")
        up.append(time.perf_counter() - t0)
    argv = ["gateway", "sync", "-i", env["inv"], "--state-dir", env["state"], "--window", "0", "--json"]
    main(argv + ["--force"])  # settle weights from the status
    t0 = time.perf_counter()
    rc = main(argv)
    nochange = time.perf_counter() - t0
    return {
        "requests": requests,
        "direct": _pct(direct),
        "gateway_least_conn": _pct(via),
        "gateway_sticky": _pct(sticky),
        "overhead_p50_ms": round(statistics.median(via) - statistics.median(direct), 2),
        "concurrent": {"clients": concurrency, "requests": concurrency * 4, "ok": ok},
        "mark_down_s": {"median": round(statistics.median(down), 3), "max": round(max(down), 3)},
        "mark_up_s": {"median": round(statistics.median(up), 3), "max": round(max(up), 3)},
        "sync_no_change_s": round(nochange, 3),
        "sync_no_change_rc": rc,
    }


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    lab = LabSession.start(LabConfig.from_env(), hosts=int(os.environ.get("CLUSTERCTL_LAB_HOSTS", "3")))
    with tempfile.TemporaryDirectory() as d:
        env = setup(lab, Path(d))
        try:
            res = measure(env, args.requests, args.repeat, args.concurrency)
        finally:
            teardown(lab, env)
    out = {
        "benchmark": "gateway",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "setup": "nginx 1.22 + njs 0.7.9 on a lab host; 3 simulator instances (time scale 0.05) on two others",
        **res,
    }
    dest = REPO / "benchmarks" / "results" / f"gateway-{datetime.now(timezone.utc):%Y-%m-%dT%H%M}.json"
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.rename(dest)
    print(json.dumps(out, indent=2))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main_()
