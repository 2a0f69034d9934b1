"""Requests failed and serving capacity during a release: in place against ``deploy --surge``.

On a running lab (``CLUSTERCTL_LAB_*``, at least 2 hosts; ``clusterctl lab up --hosts 2``):
real nginx (``clusterctl gateway``) on the first host in front of one instance of the tiny
model on GPU 4 of each of the first ``--replicas`` hosts (the lab's 8 simulated GPUs leave
spare ones).  The simulator serves at time scale 0 (requests are instant) but starts at
``--startup-scale`` (default 1: a start takes seconds, as a real load does).

Then, while ``--clients`` threads send one-token completions through the gateway back to back
and a sampler counts every 0.25 s the replicas that serve (``/health`` 200 on their port and
not marked down at the gateway; a surge unit counts while it is up), two releases of a
one-flag change with ``--serial 1``:

* **in place** (``clusterctl deploy``): each replica drained, restarted, gated, put back;
* **surge** (``clusterctl deploy --surge-strict``): each replica's new version first as
  ``NAME.surge`` on a spare GPU, gated, added; then the replica restarted in place; then the
  surge unit removed.

Per release: seconds, requests sent / failed, the least serving replicas seen, the mean
(time-weighted) serving replicas relative to the replicas wanted, and the seconds below full
capacity.  Writes ``benchmarks/results/release-surge-<date>.json`` (temp + rename).  Needs root.
Removes its units, model and nginx at the end.

Example: nice -n 10 python3 benchmarks/release/surge.py --replicas 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(Path(__file__).resolve().parent)]

from clusterctl.lab.config import LabConfig  # noqa: E402
from clusterctl.lab.session import LabSession  # noqa: E402
from labrelease import PORT, LabRelease  # noqa: E402


class Bench(LabRelease):
    def __init__(self, lab: Any, root: Path, replicas: int, startup_scale: float) -> None:
        super().__init__(lab, root, replicas, startup_scale, "sb", gateway={"max_conns": 8})

    def marked_down(self) -> set[str]:
        path = self.state_dir / "gateway.json"
        try:
            return set(json.loads(path.read_text()).get("marked_down", {}))
        except (OSError, ValueError):
            return set()

    def serving(self, endpoints: dict[str, str]) -> int:
        down = self.marked_down()
        n = 0
        for name, url in endpoints.items():
            if name in down:
                continue
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    n += r.status == 200
            except (urllib.error.URLError, OSError):
                pass
        return n

    def release(self, label: str, max_model_len: int, *flags: str, clients: int) -> dict[str, Any]:
        """Deploy the change under load; what the clients and the sampler saw."""
        self.write(max_model_len)
        endpoints = {n: f"http://{self.lab.host(h).address}:{PORT}" for n, h in zip(self.names, self.hosts)}
        if "--surge-strict" in flags:  # the surge units' ports, from the plan
            plan = json.loads(self.cli("deploy", "--plan", "--surge", "--json").stdout)
            endpoints.update(
                {
                    s["surge"]: f"http://{self.lab.host(s['host']).address}:{s['port']}"
                    for s in plan["surge"]
                    if s["mode"] == "surge"
                }
            )
        stop = threading.Event()
        results: list[tuple[float, bool, str]] = []
        samples: list[tuple[float, int]] = []

        def client() -> None:
            while not stop.is_set():
                ok, who = self.complete()
                results.append((time.time(), ok, who))

        def sampler() -> None:
            while not stop.is_set():
                samples.append((time.time(), self.serving(endpoints)))
                time.sleep(0.25)

        threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
        threads.append(threading.Thread(target=sampler, daemon=True))
        for t in threads:
            t.start()
        time.sleep(2.0)
        t0 = time.time()
        out = json.loads(
            self.cli(
                "deploy", "--serial", "1", "--gate-timeout", "300", "--drain-timeout", "30", "--json", *flags
            ).stdout
        )
        t1 = time.time()
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        during = [s for s in samples if t0 <= s[0] <= t1]
        wanted = len(self.names)
        below = sum(b[0] - a[0] for a, b in zip(during, during[1:]) if a[1] < wanted)
        weighted = sum((b[0] - a[0]) * min(a[1], wanted) for a, b in zip(during, during[1:]))
        span = (during[-1][0] - during[0][0]) if len(during) > 1 else 0.0
        window = [r for r in results if t0 <= r[0] <= t1]
        failed = [r for r in window if not r[1]]
        return {
            "release": label,
            "result": out["result"],
            "seconds": round(t1 - t0, 1),
            "requests": len(window),
            "failed": len(failed),
            "failed_examples": sorted({r[2] for r in failed})[:5],
            "answered_by": {
                w: sum(1 for r in window if r[1] and r[2] == w) for w in sorted({r[2] for r in window if r[1]})
            },
            "replicas": wanted,
            "least_serving": min((s[1] for s in during), default=None),
            "most_serving": max((s[1] for s in during), default=None),
            "mean_capacity": round(weighted / span / wanted, 3) if span else None,
            "seconds_below_full": round(below, 1),
            "samples": len(during),
            "surge": out.get("surge"),
            "load_1min": os.getloadavg()[0],
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=2, help="one replica on each of this many lab hosts")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--startup-scale", type=float, default=1.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    started = dt.datetime.now(dt.timezone.utc)
    lab = LabSession.start(LabConfig.from_env(), hosts=max(2, args.replicas))
    if len(lab.names) < args.replicas:
        raise SystemExit(f"the lab has {len(lab.names)} hosts, fewer than --replicas {args.replicas}")
    with tempfile.TemporaryDirectory(prefix="surge-bench-") as tmp:
        b = Bench(lab, Path(tmp), args.replicas, args.startup_scale)
        b.cleanup()
        runs = []
        try:
            b.write(2048)
            b.cli("deploy", "--gate-timeout", "300")
            b.cli("gateway", "deploy", b.gw_host)
            deadline = time.monotonic() + 120
            while not b.complete()[0]:
                if time.monotonic() > deadline:
                    raise RuntimeError("the gateway never answered")
                time.sleep(0.5)
            runs.append(b.release("in place", 1024, clients=args.clients))
            runs.append(b.release("surge", 2048, "--surge-strict", clients=args.clients))
        finally:
            b.cleanup()
    doc = {
        "benchmark": "release-surge",
        "started": started.isoformat(timespec="seconds"),
        "replicas": args.replicas,
        "clients": args.clients,
        "startup_scale": args.startup_scale,
        "machine": {"cpus": os.cpu_count()},
        "runs": runs,
    }
    out = Path(args.out or REPO / "benchmarks" / "results" / f"release-surge-{started:%Y-%m-%dT%H%M}.json")
    tmp_out = out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps(doc, indent=1) + "\n")
    tmp_out.rename(out)
    for r in runs:
        print(
            f"{r['release']:8s} {r['result']:6s} {r['seconds']:6.1f} s  requests {r['requests']:5d}  "
            f"failed {r['failed']:4d}  least serving {r['least_serving']}/{r['replicas']}  "
            f"mean capacity {r['mean_capacity']}  below full {r['seconds_below_full']} s"
        )
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
