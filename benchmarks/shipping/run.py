"""Node programs shipped one way (clusterctl.fleet.ship) against the ways they travelled before.

On N light-mode lab hosts (its own light lab, ``--lab-dir``, addresses ``--base``.x.y), one
fleet, ``--rounds`` times interleaved, each case one fleet call over every host, timed here:

* ``deploy-argv`` / ``deploy-ship``: deploy's node program with a ``read`` job on stdin, as it
  travelled before (``python3 -I -B -c SOURCE``: 19.5 KB on every command line) and through
  ``ship.run`` (the loader, the program from the node cache);
* ``gateway-argv`` / ``gateway-ship``: the gateway's node program the same way (an unknown op:
  the program starts, reads its job and answers);
* ``stage-argv`` / ``stage-ship``: the staging package (the bootstrap on the command line
  before) with a ``status`` job for no model;
* ``preflight-stdin`` / ``preflight-ship``: pre-flight's reader (the script on stdin every
  time before) for no model.

Odd rounds run the cases in reverse order.  The light hosts share this machine's file system, so the node cache is primed once before the
rounds (what every run after a host's first sees).  Prints the medians and writes
``benchmarks/results/shipping-<date>.json``.  Needs root.

Example: nice -n 10 python3 benchmarks/shipping/run.py --hosts 100 --rounds 5
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))

from clusterctl import node  # noqa: E402
from clusterctl.config import load_user_config  # noqa: E402
from clusterctl.deploy.remote import node_program  # noqa: E402
from clusterctl.fleet import shell, ship  # noqa: E402
from clusterctl.fleet.factory import make_fleet  # noqa: E402
from clusterctl.inventory.loader import load_inventory  # noqa: E402
from clusterctl.lab import light  # noqa: E402
from clusterctl.stage import bundle  # noqa: E402


def argv_command(source: str, args: list[str]) -> str:
    return shell.require_python3(shell.join(["python3", "-I", "-B", "-c", source, *args]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fanout", type=int, default=32)
    ap.add_argument("--lab-dir", default="/var/lib/clusterctl-lab-42/bench-shipping")
    ap.add_argument("--base", default="127.42")
    a = ap.parse_args()
    lab = Path(a.lab_dir)
    if light._read_state(lab):
        light.down(lab)
    inv_path = light.up(lab, a.hosts, base=a.base)
    try:
        inv = load_inventory(inv_path)
        fleet = make_fleet(list(inv.hosts.values()), load_user_config(), fanout=a.fanout)
        names = [h.name for h in fleet.hosts]
        read = json.dumps({"op": "read", "salt": "0" * 32, "model_paths": [], "users": []}).encode() + b"\n"
        noop = json.dumps({"op": "no-such-op"}).encode() + b"\n"
        status = json.dumps({"op": "status", "models": [], "workers": 1, "verify_model": "/nonexistent"}).encode()
        status += b"\n"
        pre = json.dumps({"models": [], "ports": False, "engines": []})
        gw_prog, pre_prog = ship.build("gateway"), ship.build("preflight")
        cases = {
            "deploy-argv": lambda: fleet.run(argv_command(node.source("deploy"), []), stdin=read, sudo=True),
            "deploy-ship": lambda: ship.run(fleet, node_program(), stdin=read, sudo=True),
            "gateway-argv": lambda: fleet.run(
                {h: argv_command(node.source("gateway"), [h]) for h in names}, stdin=noop, sudo=True
            ),
            "gateway-ship": lambda: ship.run(fleet, gw_prog, {h: [h] for h in names}, stdin=noop, sudo=True),
            "stage-argv": lambda: fleet.run(argv_command(bundle.program().text, []), stdin=status, sudo=True),
            "stage-ship": lambda: ship.run(fleet, bundle.program(), stdin=status, sudo=True),
            "preflight-stdin": lambda: fleet.run(
                shell.python_script([pre]), stdin=node.path("preflight").read_bytes(), sudo=True, require_python=True
            ),
            "preflight-ship": lambda: ship.run(fleet, pre_prog, [pre], sudo=True),
        }
        for fn in cases.values():  # connections up, node cache primed
            fn()
        times: dict[str, list[float]] = {k: [] for k in cases}
        bad: dict[str, int] = {}
        loads = [os.getloadavg()[0]]
        for rnd in range(a.rounds):
            order = list(cases.items())
            for k, fn in order if rnd % 2 == 0 else order[::-1]:  # each pair both ways round
                t = time.perf_counter()
                res = list(fn())
                times[k].append(time.perf_counter() - t)
                bad[k] = bad.get(k, 0) + sum(1 for r in res if str(r.status) != "ok")
            loads.append(os.getloadavg()[0])
        fleet.close()
    finally:
        light.down(lab)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k in cases:
        print(f"{k:16s} median {med[k] * 1000:7.0f} ms  min {min(times[k]) * 1000:7.0f} ms  hosts not ok {bad[k]}")
    print(f"load {min(loads):.1f}-{max(loads):.1f}")
    out = REPO / "benchmarks" / "results" / f"shipping-{dt.datetime.now().strftime('%Y-%m-%dT%H%M')}.json"
    out.write_text(
        json.dumps(
            {
                "hosts": a.hosts,
                "rounds": a.rounds,
                "fanout": a.fanout,
                "seconds": times,
                "median_s": med,
                "hosts_not_ok": bad,
                "load": loads,
            },
            indent=1,
        )
        + "\n"
    )
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
