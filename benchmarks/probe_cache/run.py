"""Probe payload cache: `clusterctl facts` and `clusterctl doctor` with the payload
cached on the nodes against shipping it every run, and against the floors, on N
light-mode lab hosts.

Starts its own light lab (``--lab-dir``, addresses ``--base``.x.y), then, ``--rounds``
times, interleaved (every tool a fresh process, fan-out ``--fanout``, the 1-minute
load average recorded before and after each run):

* ``exec-floor``: bare paramiko connect + ``python3 -I -B -c pass`` (nothing on
  stdin): connection + interpreter start, no work;
* ``collector-floor``: bare paramiko connect + the cached collector run by the loader
  (``clusterctl.fleet.cached.loader_command(digest, "run", ARGS)``, nothing on stdin):
  the least a probe can cost with this collector;
* ``shipped-floor``: bare paramiko connect + ``python3 -I -B - ARGS`` with the payload
  on stdin (the floor of the old way);
* ``facts-shipped`` / ``facts-cached``: ``clusterctl facts all --json`` with
  ``CLUSTERCTL_NODE_CACHE=off`` / on (caches primed once before the rounds);
* ``doctor-shipped`` / ``doctor-cached``: ``clusterctl doctor all --interval 0 --json``
  the same way (doctor ships its node script with the probe inside);
* ``cheap-floor`` / ``facts-cheap``: the collector-floor and ``facts-cached`` with the
  payload built around ``cheap_collector.py`` (no work, the smallest facts document):
  what a probe costs above the exec floor when the collector itself is cheap (the
  loader, the payload's start, the control side).

Ratios are medians over the same run's floor medians, so the shared machine's load
hits both sides.  Writes ``benchmarks/results/probe-cache-<date>.json`` and prints a
Markdown table (docs/facts.md quotes it).  Needs root.

Example: python3 benchmarks/probe_cache/run.py --sizes 100 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from clusterctl.probe.snapshot import node_program  # noqa: E402
from clusterctl.fleet.cached import digest, loader_command  # noqa: E402
from clusterctl.lab import light  # noqa: E402
from clusterctl.probe.payload import build_payload, payload, probe_args  # noqa: E402
from clusterctl.probe.run import DEFAULT_TIMEOUT_S  # noqa: E402

_spec = importlib.util.spec_from_file_location("fanout_run", HERE.parent / "fanout" / "run.py")
assert _spec and _spec.loader
fanout_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fanout_run)
sh, version_of = fanout_run.sh, fanout_run.version_of

TOOLS = (
    "exec-floor",
    "collector-floor",
    "shipped-floor",
    "facts-shipped",
    "facts-cached",
    "doctor-shipped",
    "doctor-cached",
    "cheap-floor",
    "facts-cheap",
)
CHEAP = HERE / "cheap_collector.py"
# `clusterctl ...` with the payload built around the cheap collector (argv after -c: the CLI's)
CHEAP_CLI = (
    "import pathlib, runpy, sys; import clusterctl.probe.payload as p; "
    f"p.COLLECTOR_PATH = pathlib.Path({str(CHEAP)!r}); sys.argv[0] = 'clusterctl'; "
    "runpy.run_module('clusterctl.cli.main', run_name='__main__', alter_sys=True)"
)


def count_ok(name: str, p: subprocess.CompletedProcess[str]) -> int:
    try:
        if name.endswith("floor"):
            return int(json.loads(p.stdout.strip().splitlines()[-1])["ok"])
        doc = json.loads(p.stdout)
    except (ValueError, IndexError, KeyError):
        return 0
    if name.startswith("facts"):
        return sum(1 for d in doc.values() if isinstance(d, dict) and "schema" in d)
    # doctor: hosts that gave facts (host.reachable OK; a host without facts is UNKNOWN there)
    return sum(1 for f in doc.get("findings") or [] if f.get("check") == "host.reachable" and f.get("severity") == "OK")


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        self.runs: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.payload_file = work / "payload.py"
        self.payload_file.write_bytes(payload().data)
        self.pargs = probe_args(nvml_budget=max(1.0, DEFAULT_TIMEOUT_S * 0.6))
        self.cached_command = loader_command(payload().digest, "run", self.pargs)
        self.shipped_command = " ".join(["python3", "-I", "-B", "-", *self.pargs])
        self.cheap_command = loader_command(build_payload(collector=CHEAP.read_bytes()).digest, "run", self.pargs)

    def env(self, cache: bool) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "CLUSTERCTL_NODE_CACHE_DIR")}
        env.update(
            HOME=str(self.work / "home"),
            XDG_STATE_HOME=str(self.work / "state"),
            XDG_CONFIG_HOME=str(self.work / "config"),
            CLUSTERCTL_SSH_CONFIG="none",
            PYTHONPATH=str(REPO),
            CLUSTERCTL_NODE_CACHE="on" if cache else "off",
        )
        Path(env["HOME"]).mkdir(exist_ok=True)
        return env

    def size(self, n: int) -> None:
        lab = Path(self.args.lab_dir)
        if light._read_state(lab):
            light.down(lab)
        t0 = time.perf_counter()
        inv = light.up(lab, n, base=self.args.base)
        self.notes.append(f"N={n}: light lab up in {time.perf_counter() - t0:.1f} s")
        try:
            self._size(n, inv, lab)
        finally:
            t0 = time.perf_counter()
            light.down(lab)
            self.notes.append(f"N={n}: light lab down in {time.perf_counter() - t0:.1f} s")

    def _size(self, n: int, inv: Path, lab: Path) -> None:
        a, py, f = self.args, sys.executable, str(self.args.fanout)
        key = str(lab / "keys" / "id_ed25519")
        hosts_file = self.work / f"hosts_{n}.txt"
        hosts_file.write_text("\n".join(light.address_for(i, a.base) for i in range(n)) + "\n")
        floor = [py, str(HERE.parent / "facts" / "floor.py"), str(hosts_file), key, f]
        facts = [
            py,
            "-m",
            "clusterctl.cli.main",
            "facts",
            "-i",
            str(inv),
            "all",
            "--fanout",
            f,
            "--connect-timeout",
            "30",
            "--json",
        ]
        doctor = [
            py,
            "-m",
            "clusterctl.cli.main",
            "doctor",
            "all",
            "-i",
            str(inv),
            "--fanout",
            f,
            "--interval",
            "0",
            "--json",
        ]
        cheap = [py, "-c", CHEAP_CLI] + facts[3:]
        tools: dict[str, tuple[list[str], bool]] = {
            "exec-floor": (floor + ["/dev/null", "python3 -I -B -c pass"], True),
            "collector-floor": (floor + ["/dev/null", self.cached_command], True),
            "shipped-floor": (floor + [str(self.payload_file), self.shipped_command], True),
            "facts-shipped": (facts, False),
            "facts-cached": (facts, True),
            "doctor-shipped": (doctor, False),
            "doctor-cached": (doctor, True),
            "cheap-floor": (floor + ["/dev/null", self.cheap_command], True),
            "facts-cheap": (cheap, True),
        }
        tools = {k: v for k, v in tools.items() if k in a.tools}
        # prime every host's cache (the collector alone and doctor's node script), untimed
        for name, cmd in (("facts-cached", facts), ("doctor-cached", doctor), ("facts-cheap", cheap)):
            if name not in tools and not (name == "facts-cheap" and "cheap-floor" in tools):
                continue
            wall, _, p = sh(cmd, self.env(True), timeout=a.run_timeout)
            self.notes.append(
                f"N={n}: priming with {name} (first run: every host ships): {wall:.2f} s, "
                f"{count_ok(name, p)}/{n} ok, load {os.getloadavg()[0]:.1f}"
            )
        for r in range(a.rounds):
            for name, (cmd, cache) in tools.items():
                self.one(name, n, r, cmd, cache)

    def one(self, name: str, n: int, rnd: int, cmd: list[str], cache: bool) -> None:
        time.sleep(1.0)
        load = os.getloadavg()[0]
        try:
            wall, cpu, p = sh(cmd, self.env(cache), timeout=self.args.run_timeout)
            ok, rc = count_ok(name, p), p.returncode
        except subprocess.TimeoutExpired:
            wall, cpu, ok, rc = float(self.args.run_timeout), 0.0, 0, -1
        row = {
            "tool": name,
            "n": n,
            "round": rnd,
            "wall_s": round(wall, 3),
            "client_cpu_s": round(cpu, 2),
            "ok": ok,
            "rc": rc,
            "load1_before": round(load, 2),
            "load1_after": round(os.getloadavg()[0], 2),
        }
        self.runs.append(row)
        print(json.dumps(row), flush=True)

    def summary(self) -> list[dict[str, Any]]:
        groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for row in self.runs:
            groups.setdefault((str(row["tool"]), int(row["n"])), []).append(row)
        med = {k: statistics.median(float(r["wall_s"]) for r in rows) for k, rows in groups.items()}
        out = []
        for (tool, n), rows in groups.items():
            m = med[(tool, n)]
            ex, co = med.get(("exec-floor", n)), med.get(("collector-floor", n))
            out.append(
                {
                    "tool": tool,
                    "n": n,
                    "runs": len(rows),
                    "median_s": round(m, 2),
                    "min_s": round(min(float(r["wall_s"]) for r in rows), 2),
                    "max_s": round(max(float(r["wall_s"]) for r in rows), 2),
                    "ok_worst": min(int(r["ok"]) for r in rows),
                    "over_exec_floor": round(m / ex, 2) if ex else None,
                    "over_collector_floor": round(m / co, 2) if co else None,
                    "load1_range": [
                        min(min(r["load1_before"], r["load1_after"]) for r in rows),
                        max(max(r["load1_before"], r["load1_after"]) for r in rows),
                    ],
                }
            )
        return out


def table(data: dict[str, Any]) -> str:
    lines = [
        "| tool | N | runs | median s | min-max s | ok (worst) | / exec floor | / collector floor | load 1-min |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["summary"]:
        lo, hi = r["load1_range"]
        lines.append(
            f"| {r['tool']} | {r['n']} | {r['runs']} | {r['median_s']} | {r['min_s']}-{r['max_s']} | "
            f"{r['ok_worst']}/{r['n']} | {r['over_exec_floor']}x | {r['over_collector_floor']}x | "
            f"{lo:.1f}-{hi:.1f} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fanout", type=int, default=64)
    ap.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    ap.add_argument(
        "--lab-dir", default=os.environ.get("CLUSTERCTL_LAB_DIR", "/var/lib/clusterctl-lab-pc") + "/light-probe-cache"
    )
    ap.add_argument("--base", default="127.31", help="light hosts' addresses: BASE.x.y")
    ap.add_argument("--run-timeout", type=float, default=900.0)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run.py needs root (it starts sshd hosts in new namespaces)", file=sys.stderr)
        return 3
    work = Path(tempfile.mkdtemp(prefix="probe-cache-bench-"))
    bench = Bench(args, work)
    t0 = time.perf_counter()
    try:
        for n in args.sizes:
            bench.size(n)
    finally:
        if light._read_state(Path(args.lab_dir)):
            light.down(Path(args.lab_dir))
        shutil.rmtree(work, ignore_errors=True)
    bench.notes.append(f"whole benchmark: {time.perf_counter() - t0:.0f} s")
    doctor_program = node_program(payload().data).data
    date = dt.datetime.now().strftime("%Y-%m-%dT%H%M")
    data: dict[str, Any] = {
        "date": date,
        "versions": {
            "python": platform.python_version(),
            "kernel": platform.release(),
            "cpus": str(os.cpu_count()),
            "source": version_of(["git", "-C", str(REPO), "describe", "--always", "--dirty"]),
        },
        "settings": {
            "fanout": args.fanout,
            "rounds": args.rounds,
            "sizes": args.sizes,
            "payload_bytes": len(payload().data),
            "payload_sha256": payload().digest,
            "doctor_program_bytes": len(doctor_program),
            "doctor_program_sha256": digest(doctor_program),
            "cached_command_bytes": len(bench.cached_command),
        },
        "runs": bench.runs,
        "summary": bench.summary(),
        "notes": bench.notes,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"probe-cache-{date}.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, target)
    print(table(data))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
