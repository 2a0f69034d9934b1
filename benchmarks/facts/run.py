"""Facts benchmark: `clusterctl facts all --json` against its floor and Ansible `-m setup`.

Starts its own light-mode lab hosts (one sshd per host on 127.6.x.y, see
clusterctl/lab/light.py), then for each size runs, interleaved, ``--rounds``
times each (every tool a fresh process, fan-out ``--fanout``):

* ``floor``: bare paramiko connect + the probe command clusterctl runs
  (``python3 -I -B - --nvml-budget ...``) fed the SAME payload bytes
  (``clusterctl.probe.payload.payload().data``) on stdin, ThreadPoolExecutor(fanout);
* ``floor-python-pass``: the same connection carrying the same payload to
  ``python3 -c pass`` (connection + interpreter start-up + transfer, no collector);
* ``clusterctl-cli``: ``clusterctl facts -i INV all --fanout F --json``;
* ``clusterctl-api``: ``collect_facts(Fleet(hosts, fanout=F))`` in a fresh process;
* ``ansible-setup``: ``ansible all -m setup -f F`` (gather_subset=all, the module's
  default gather_timeout=10, pipelining on, forks = fan-out), and
  ``ansible-setup-min`` (``-a gather_subset=min``), from ``--tools-venv``.

A host counts as ok when the tool returned its facts (clusterctl: a document
with ``schema``; Ansible: a ``SUCCESS`` line).  Writes
``benchmarks/results/facts-<date>.json`` and the facts section of
``docs/benchmarks-fanout.md`` (medians, ratios to the floor and to Ansible).
Needs root.

Example: python3 benchmarks/facts/run.py --sizes 100 --rounds 3
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

from clusterctl.lab import light  # noqa: E402
from clusterctl.probe.payload import payload, probe_command  # noqa: E402
from clusterctl.probe.run import DEFAULT_TIMEOUT_S  # noqa: E402

_spec = importlib.util.spec_from_file_location("fanout_run", HERE.parent / "fanout" / "run.py")
assert _spec and _spec.loader
fanout_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fanout_run)  # its sh(), version_of() and Bench.close_masters()
sh, version_of, FanoutBench = fanout_run.sh, fanout_run.version_of, fanout_run.Bench

LAB_DIR = Path("/var/lib/clusterctl-lab/bench-facts")
BASE = "127.6"
MARK = fanout_run.FACTS_MARK
TOOLS = ("floor", "floor-python-pass", "clusterctl-cli", "clusterctl-api", "ansible-setup", "ansible-setup-min")


class FactsBench:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.work = work
        self.venv = Path(args.tools_venv) if args.tools_venv else None
        self.runs: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.payload_file = work / "payload.py"
        self.payload_file.write_bytes(payload().data)
        # The exact command collect_facts sends with its default timeout.
        self.command = probe_command(nvml_budget=max(1.0, DEFAULT_TIMEOUT_S * 0.6))

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        env.update(
            HOME=str(self.work / "home"),
            XDG_STATE_HOME=str(self.work / "state"),
            XDG_CONFIG_HOME=str(self.work / "config"),
            CLUSTERCTL_SSH_CONFIG="none",
        )
        Path(env["HOME"]).mkdir(exist_ok=True)
        return env

    def size(self, n: int) -> None:
        if light._read_state(LAB_DIR):
            light.down(LAB_DIR)
        t0 = time.perf_counter()
        inv = light.up(LAB_DIR, n, base=BASE)
        self.notes.append(f"N={n}: light lab up in {time.perf_counter() - t0:.1f} s")
        try:
            self._size(n, inv)
        finally:
            t0 = time.perf_counter()
            light.down(LAB_DIR)
            self.notes.append(f"N={n}: light lab down in {time.perf_counter() - t0:.1f} s")

    def _size(self, n: int, inv: Path) -> None:
        a = self.args
        key = str(LAB_DIR / "keys" / "id_ed25519")
        addrs = [light.address_for(i, BASE) for i in range(n)]
        hosts_file = self.work / f"hosts_{n}.txt"
        hosts_file.write_text("\n".join(addrs) + "\n")
        ans_inv, ans_cfg = fanout_run.write_ansible_files(self.work, n, addrs, key, a.fanout)
        f = str(a.fanout)
        py = sys.executable
        tools: dict[str, list[str]] = {
            "floor": [py, str(HERE / "floor.py"), str(hosts_file), key, f, str(self.payload_file), self.command],
            "floor-python-pass": [
                py,
                str(HERE / "floor.py"),
                str(hosts_file),
                key,
                f,
                str(self.payload_file),
                "python3 -c pass",
            ],
            "clusterctl-cli": [
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
            ],
            "clusterctl-api": [py, str(HERE / "core.py"), str(inv), f],
        }
        if self.venv and (self.venv / "bin" / "ansible").exists() and not a.no_ansible:
            ansible = str(self.venv / "bin" / "ansible")
            tools["ansible-setup"] = [ansible, "all", "-i", str(ans_inv), "-m", "setup", "-f", f]
            tools["ansible-setup-min"] = [
                ansible,
                "all",
                "-i",
                str(ans_inv),
                "-m",
                "setup",
                "-a",
                "gather_subset=min",
                "-f",
                f,
            ]
        elif not a.no_ansible:
            self.notes.append("Ansible: not installed in --tools-venv; not measured")
        if a.tools:
            tools = {k: v for k, v in tools.items() if k in a.tools}
        for r in range(a.rounds):
            for name, cmd in tools.items():
                self.one(name, n, r, cmd, ans_cfg if name.startswith("ansible") else None)

    def one(self, name: str, n: int, rnd: int, cmd: list[str], ans_cfg: Path | None) -> None:
        env = self.env()
        cp_dir = None
        if ans_cfg is not None:
            env["ANSIBLE_CONFIG"] = str(ans_cfg)
            cp_dir = Path(tempfile.mkdtemp(prefix="cp-", dir=self.work))
            env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(cp_dir)
        time.sleep(1.0)
        load = os.getloadavg()[0]
        try:
            wall, cpu, p = sh(cmd, env, timeout=self.args.run_timeout)
            ok, rc = self.count_ok(name, p), p.returncode
        except subprocess.TimeoutExpired:
            wall, cpu, ok, rc = float(self.args.run_timeout), 0.0, 0, -1
        finally:
            if cp_dir is not None:
                FanoutBench.close_masters(cp_dir)
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

    @staticmethod
    def count_ok(name: str, p: subprocess.CompletedProcess[str]) -> int:
        if name.startswith(("floor", "clusterctl-api")):
            try:
                return int(json.loads(p.stdout.strip().splitlines()[-1])["ok"])
            except (ValueError, IndexError, KeyError):
                return 0
        if name == "clusterctl-cli":
            try:
                return sum(1 for doc in json.loads(p.stdout).values() if "schema" in doc)
            except (ValueError, AttributeError):
                return 0
        if name.startswith("ansible"):
            return sum(1 for line in p.stdout.splitlines() if "| SUCCESS" in line)
        return 0

    def summary(self) -> list[dict[str, Any]]:
        groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for row in self.runs:
            groups.setdefault((str(row["tool"]), int(row["n"])), []).append(row)
        med = {k: statistics.median(float(r["wall_s"]) for r in rows) for k, rows in groups.items()}
        out = []
        for (tool, n), rows in groups.items():
            walls = [float(r["wall_s"]) for r in rows]
            m = med[(tool, n)]
            floor = med.get(("floor", n))
            ansible = med.get(("ansible-setup", n))
            out.append(
                {
                    "tool": tool,
                    "n": n,
                    "runs": len(rows),
                    "median_s": round(m, 2),
                    "min_s": round(min(walls), 2),
                    "max_s": round(max(walls), 2),
                    "ok_worst": min(int(r["ok"]) for r in rows),
                    "client_cpu_s_median": round(statistics.median(float(r["client_cpu_s"]) for r in rows), 2),
                    "ratio_to_floor": round(m / floor, 2) if floor else None,
                    "ansible_setup_over_tool": round(ansible / m, 2) if ansible else None,
                    "load1_range": [
                        min(min(r["load1_before"], r["load1_after"]) for r in rows),
                        max(max(r["load1_before"], r["load1_after"]) for r in rows),
                    ],
                }
            )
        return out


def section(data: dict[str, Any]) -> str:
    s = data["settings"]
    lines = [
        MARK,
        "",
        "## Facts benchmark: one probe round trip on N light-mode lab hosts",
        "",
        f"Measured {data['date']} by `benchmarks/facts/run.py`, fan-out {s['fanout']}, "
        f"{s['rounds']} interleaved round(s) (runs column: how many), every tool a fresh process. "
        f"The probe payload (collector + carried pynvml) was {s['payload_bytes']} bytes"
        + "".join(
            f", {v['payload_bytes']} bytes in the merged {k.split()[-1]}"
            for k, v in s.items()
            if k.startswith("merged from")
        )
        + "; light hosts have no GPU, "
        "no systemd and no kernel log, so the collector records those as reasons. "
        "ratio = median / floor median; \"Ansible / tool\" = ansible-setup median / tool median.",
        "",
        "| tool | N | runs | median s | min s | max s | ok (worst run) | ratio to floor | Ansible / tool | client CPU s | load 1-min |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["summary"]:
        ratio = f"{r['ratio_to_floor']}x" if r["ratio_to_floor"] is not None else "-"
        ans = f"{r['ansible_setup_over_tool']}x" if r["ansible_setup_over_tool"] is not None else "-"
        lo, hi = r["load1_range"]
        lines.append(
            f"| {r['tool']} | {r['n']} | {r['runs']} | {r['median_s']} | {r['min_s']} | {r['max_s']} | "
            f"{r['ok_worst']}/{r['n']} | {ratio} | {ans} | {r['client_cpu_s_median']} | {lo:.1f}-{hi:.1f} |"
        )
    lines += ["", "Settings: " + json.dumps(s), "", "Notes:", ""]
    lines += [f"- {n}" for n in data["notes"]]
    lines += ["", "Raw rows: `benchmarks/results/facts-*.json`.", ""]
    return "\n".join(lines)


def merged(data: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """``data`` with the summary rows, notes and settings of earlier results whose
    sizes it did not measure (earlier sizes first); for the table only."""
    shown = dict(data)
    for path in paths:
        old = json.loads(Path(path).read_text())
        sizes = {r["n"] for r in data["summary"]}
        shown["summary"] = [*(r for r in old["summary"] if r["n"] not in sizes), *shown["summary"]]
        shown["notes"] = [*shown["notes"], *(f"{old['date']} (`{Path(path).name}`): {n}" for n in old["notes"])]
        shown["settings"] = {**shown["settings"], f"merged from {Path(path).name}": old["settings"]}
    return shown


def write_section(path: Path, text: str) -> None:
    """Replace the facts section of ``path`` (from MARK to the end), or append it."""
    old = path.read_text() if path.exists() else ""
    head = old.split(MARK)[0].rstrip("\n")
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text((head + "\n\n" if head else "") + text)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fanout", type=int, default=64)
    ap.add_argument("--tools-venv", default="/var/tmp/fanout-venv", help="virtualenv holding ansible-core")
    ap.add_argument("--no-ansible", action="store_true")
    ap.add_argument("--tools", nargs="+", choices=TOOLS, help="measure only these (default: all)")
    ap.add_argument(
        "--merge",
        nargs="*",
        default=[],
        metavar="RESULTS_JSON",
        help="earlier results whose other sizes join this run's table (e.g. 1000 hosts, 1 round)",
    )
    ap.add_argument("--run-timeout", type=float, default=600.0, help="seconds one tool run may take")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--markdown", default=str(REPO / "docs" / "benchmarks-fanout.md"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run.py needs root (it starts sshd hosts in new namespaces)", file=sys.stderr)
        return 3
    if args.tools_venv and not Path(args.tools_venv).exists():
        args.tools_venv = None
    work = Path(tempfile.mkdtemp(prefix="facts-bench-"))
    bench = FactsBench(args, work)
    t0 = time.perf_counter()
    try:
        for n in args.sizes:
            bench.size(n)
    finally:
        if light._read_state(LAB_DIR):
            light.down(LAB_DIR)
        shutil.rmtree(work, ignore_errors=True)
    bench.notes.append(f"whole benchmark: {time.perf_counter() - t0:.0f} s")
    versions = {
        "python": platform.python_version(),
        "paramiko": __import__("paramiko").__version__,
        "openssh": version_of(["ssh", "-V"]),
        "kernel": platform.release(),
        "cpus": str(os.cpu_count()),
    }
    if bench.venv:
        versions["ansible-core"] = version_of(
            [
                str(bench.venv / "bin" / "python"),
                "-c",
                "import importlib.metadata as m; print(m.version('ansible-core'))",
            ]
        )
    date = dt.datetime.now().strftime("%Y-%m-%dT%H%M")
    data: dict[str, Any] = {
        "date": date,
        "versions": versions,
        "settings": {
            "fanout": args.fanout,
            "rounds": args.rounds,
            "sizes": args.sizes,
            "payload_bytes": len(payload().data),
            "payload_sha256": payload().digest,
            "source": version_of(["git", "-C", str(REPO), "describe", "--always", "--dirty"]),
            "probe_command": bench.command,
            "ansible": "ad-hoc -m setup (gather_subset=all; -min: gather_subset=min), module default "
            "gather_timeout=10, forks = fanout, pipelining on, host_key_checking off, "
            "ansible_python_interpreter=/usr/bin/python3, default ssh_args "
            "(ControlPersist 60s), fresh ControlPath per run",
        },
        "runs": bench.runs,
        "summary": bench.summary(),
        "notes": bench.notes,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"facts-{date}.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, target)
    write_section(Path(args.markdown), section(merged(data, args.merge)))
    print(f"wrote {target} and {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
