"""A real release on the lab's nspawn hosts, phase by phase: pre-flight, drains, the gateway switch-over.

On a running lab (``CLUSTERCTL_LAB_*``; ``clusterctl lab up --hosts 8``): real systemd, sshd and
nginx (``clusterctl gateway``) on the first host in front of one replica of the tiny model on GPU 4 of
each of the first N hosts; the simulator serves at time scale 0 (requests are instant) and starts
at ``--startup-scale`` (its load and start-up delays scaled: a start takes seconds, as a load does).

For each host count of ``--hosts`` (e.g. 4,8): v1 deployed and put behind the gateway, then
releases of a one-flag change (``max-model-len`` 2048 <-> 1024, so every replica restarts) with
``clusterctl deploy --serial 1,25%,100% --json``, each release alternating:

* **before**: the drain path as it was before this round (a new SSH connection to the gateway
  host per mark-down and mark-up, each drain's mark-down its own render and reload, in turn);
* **after**: as it is (one connection for the run; a batch's instances marked down in one change
  before its drains, and marked up in one after its gates).

Both arms run the same deploy code otherwise (the "before" arm is ``deploy`` with the hook patched
back in this script's ``--cli-before`` mode).  While a release runs, one client sends one-token
completions through the gateway back to back (requests failed are counted).

Per release: the wall seconds, deploy's own ``timings`` (pre-flight, lock, re-read, per batch
staging, drain with its mark-down, stop/start, model load and gates, mark-up), the gateway's
applies, and the 1-minute load average at its start and end.  Writes
``benchmarks/results/release-lab-<date>.json`` (temp + rename).  Needs root.  Removes its units,
model and nginx at the end.

Example: nice -n 10 python3 benchmarks/release/lab.py --hosts 4,8 --reps 1
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(Path(__file__).resolve().parent)]

from labrelease import LabRelease  # noqa: E402

SERIAL = "1,25%,100%"


def cli_before(argv: list[str]) -> int:
    """``clusterctl`` with the drain path as before this round: a fleet (new SSH connections) per
    gateway change, each change applied alone, in turn, and no batch-wide mark-down (each drain
    marks its own instance down)."""
    from clusterctl.cli.main import main as cli_main
    from clusterctl.deploy.rollout import engine
    from clusterctl.gateway import hook as gwhook
    from clusterctl.ops import deploy as opsdeploy

    def apply_alone(self: gwhook.Hook, names: list[str], down: bool, reason: str) -> None:
        with self._apply_lock:
            self._apply_now([gwhook._Change(list(names), down, reason)])

    made = gwhook.gateway_hook

    def per_change(*a: Any, **kw: Any) -> Any:
        h = made(*a, **kw)
        if h is not None:
            h.keep_open = False
        return h

    gwhook.Hook._apply = apply_alone  # type: ignore[method-assign]
    engine.Deploy.mark_down_batch = lambda self, *a: None  # type: ignore[method-assign]
    opsdeploy.gateway_hook = per_change  # type: ignore[attr-defined]
    return int(cli_main(argv) or 0)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


class Bench(LabRelease):
    """The release under test on the first ``hosts`` lab hosts (replicas ``rl-1`` .. ``rl-N``)."""

    def __init__(self, lab: Any, root: Path, hosts: int, startup_scale: float) -> None:
        super().__init__(lab, root, hosts, startup_scale, "rl")

    def setup(self) -> dict[str, Any]:
        """v1 deployed (no gateway yet), then the gateway deployed and answering."""
        self.write(2048)
        t0 = time.time()
        self.cli("deploy", "--gate-timeout", "300")
        first = time.time() - t0
        self.cli("gateway", "deploy", self.gw_host)
        deadline = time.monotonic() + 120
        while not self.complete()[0]:
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway never answered")
            time.sleep(0.5)
        return {"first_deploy_s": round(first, 1), "load_1min": load1()}

    def release(self, arm: str, max_model_len: int) -> dict[str, Any]:
        """One release to ``max_model_len`` with the drain path of ``arm``, one client sending meanwhile."""
        self.write(max_model_len)
        stop = threading.Event()
        results: list[tuple[float, bool]] = []

        def client() -> None:
            while not stop.is_set():
                results.append((time.time(), self.complete()[0]))
                time.sleep(0.05)

        th = threading.Thread(target=client, daemon=True)
        th.start()
        time.sleep(1.0)
        l0, t0 = load1(), time.time()
        flags = ("--serial", SERIAL, "--gate-timeout", "300", "--drain-timeout", "30", "--json")
        head = [sys.executable, __file__, "--cli-before"] if arm == "before" else None
        out = json.loads(self.cli("deploy", *flags, head=head).stdout)
        t1, l1 = time.time(), load1()
        stop.set()
        th.join(timeout=60)
        window = [r for r in results if t0 <= r[0] <= t1]
        gates = [g for h in out["hosts"] for g in h.get("gates", [])]
        return {
            "arm": arm,
            "hosts": len(self.hosts),
            "result": out["result"],
            "wall_s": round(t1 - t0, 2),
            "deploy_s": out["seconds"],
            "timings": out.get("timings"),
            "batches": [len(b) for b in out["batches"]],
            "gate_s_per_instance": sorted(round(g["seconds"], 2) for g in gates),
            "gateway": out.get("gateway"),
            "requests": len(window),
            "failed": sum(1 for r in window if not r[1]),
            "load_1min": [l0, l1],
        }


def fit(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Least-squares lines over the "after" releases: pre-flight per host, switch-over per batch."""

    def line(pts: list[tuple[float, float]]) -> dict[str, float] | None:
        if len({x for x, _ in pts}) < 2:
            return None
        n = len(pts)
        mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
        b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        return {"c": round(my - b * mx, 3), "per": round(b, 4), "points": n}

    out: dict[str, Any] = {}
    for arm in ("before", "after"):
        rs = [r for r in runs if r["arm"] == arm and r.get("timings")]
        pre = [(r["hosts"], r["timings"]["preflight_s"]) for r in rs if "preflight_s" in r["timings"]]
        batches = [(b["hosts"], b) for r in rs for b in r["timings"].get("batches", [])]
        out[arm] = {
            "preflight_s_per_host": line(pre),
            "mark_down_s_per_batch_host": line([(n, b["mark_down_s"]) for n, b in batches]),
            "mark_up_s_per_batch_host": line([(n, b["mark_up_s"]) for n, b in batches]),
            "switch_over_s_per_batch_host": line([(n, b["mark_down_s"] + b["mark_up_s"]) for n, b in batches]),
            "drain_s_per_batch_host": line([(n, b["drain_s"]) for n, b in batches]),
            "apply_s_per_batch_host": line([(n, b["apply_s"]) for n, b in batches]),
            "gate_s_per_batch_host": line([(n, b["gate_s"]) for n, b in batches]),
        }
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--cli-before":
        return cli_before(sys.argv[2:])
    from clusterctl.lab.config import LabConfig
    from clusterctl.lab.session import LabSession

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="4,8", help="host counts, comma-separated (the lab must hold the largest)")
    ap.add_argument("--reps", type=int, default=1, help="before/after pairs per host count")
    ap.add_argument("--startup-scale", type=float, default=0.2)
    ap.add_argument("--out")
    args = ap.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    started = dt.datetime.now(dt.timezone.utc)
    lab = LabSession.start(LabConfig.from_env(), hosts=max(counts))
    if len(lab.names) < max(counts):
        raise SystemExit(f"the lab has {len(lab.names)} hosts, fewer than {max(counts)}")
    runs: list[dict[str, Any]] = []
    setups: dict[str, Any] = {}
    out = Path(args.out or REPO / "benchmarks" / "results" / f"release-lab-{started:%Y-%m-%dT%H%M}.json")

    def save() -> None:
        doc = {
            "benchmark": "release-lab",
            "started": started.isoformat(timespec="seconds"),
            "serial": SERIAL,
            "startup_scale": args.startup_scale,
            "machine": {"cpus": os.cpu_count(), "lab_hosts": len(lab.names)},
            "setups": setups,
            "runs": runs,
            "fit": fit(runs),
        }
        tmp_out = out.with_suffix(".tmp")
        tmp_out.write_text(json.dumps(doc, indent=1) + "\n")
        tmp_out.rename(out)

    for n in counts:
        with tempfile.TemporaryDirectory(prefix="release-lab-") as tmp:
            b = Bench(lab, Path(tmp), n, args.startup_scale)
            b.cleanup(lab.names)
            try:
                setups[str(n)] = b.setup()
                mml = 2048
                for rep in range(args.reps):
                    order = ("before", "after") if rep % 2 == 0 else ("after", "before")
                    for arm in order:
                        mml = 1024 if mml == 2048 else 2048
                        r = b.release(arm, mml)
                        runs.append(r)
                        save()
                        t = r["timings"] or {}
                        print(
                            f"{n:3d} hosts {arm:6s} {r['result']:6s} {r['wall_s']:6.1f} s  pre-flight "
                            f"{t.get('preflight_s')} s  batches "
                            + " | ".join(
                                f"drain {x['drain_s']} (down {x['mark_down_s']} x{x['mark_downs']}) "
                                f"apply {x['apply_s']} gate {x['gate_s']} up {x['mark_up_s']}"
                                for x in t.get("batches", [])
                            )
                            + f"  failed {r['failed']}/{r['requests']}  load {r['load_1min']}",
                            flush=True,
                        )
            finally:
                b.cleanup(lab.names)
    save()
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
