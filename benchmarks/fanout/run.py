"""Fan-out benchmark: `clusterctl exec all -- true` against its floor and other tools.

Starts its own light-mode lab hosts (sshd per host on 127.1.x.y, see
clusterctl/lab/light.py), then for each size runs, interleaved, ``--rounds``
times each:

* ``floor``: bare paramiko connect + ``true``, ThreadPoolExecutor(fanout);
* ``clusterctl-cli``: ``clusterctl exec -i INV all --fanout F --json -- true``;
* ``clusterctl-api``: ``Fleet(hosts, fanout=F).run("true")`` in a fresh process;
* ``pssh``, ``clush``, ``clush-curve25519`` (KEX pinned like paramiko's),
  ``ansible-raw`` (``ansible all -m raw -a true -f F``, pipelining on),
  when found in ``--tools-venv`` (``pip install ansible-core clustershell
  parallel-ssh`` there; the project's own environment is not touched).

Plus ``floor`` and ``clusterctl-cli`` through an asyncio delay proxy adding
``--delay-ms`` each way, on the first ``--delay-hosts`` hosts.

Every tool is a separate process, so interpreter start-up counts for all.
Writes ``benchmarks/results/fanout-<date>.json`` and ``docs/benchmarks-fanout.md``
(medians and ratios to the floor).  Needs root.

Example: python3 benchmarks/fanout/run.py --sizes 100 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from clusterctl.lab import light  # noqa: E402
from delayproxy import DelayProxy  # noqa: E402

LAB_DIR = Path("/var/lib/clusterctl-lab/bench-light")
#: Where benchmarks/facts/run.py's section of the markdown starts; kept on rewrite.
FACTS_MARK = "<!-- facts benchmark: written by benchmarks/facts/run.py -->"


def sh(
    cmd: list[str], env: dict[str, str] | None = None, timeout: float = 900
) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Run; return (wall seconds, client CPU seconds of the process tree reaped, result)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, p


def version_of(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"
    text = (p.stdout or p.stderr).strip().splitlines()
    return text[0] if text else f"unavailable (rc {p.returncode})"


def write_ansible_files(work: Path, n: int, addrs: list[str], key: str, forks: int) -> tuple[Path, Path]:
    """Ansible's inventory and config for ``addrs``: root with ``key``, forks as our
    fan-out, pipelining on, host keys not checked (as the other tools here)."""
    ans_dir = work / "ansible"
    ans_dir.mkdir(exist_ok=True)
    ans_inv = ans_dir / f"inv_{n}.ini"
    ans_inv.write_text(
        "[lab]\n" + "\n".join(addrs) + "\n\n[lab:vars]\nansible_user=root\n"
        f"ansible_ssh_private_key_file={key}\nansible_python_interpreter=/usr/bin/python3\n"
        "ansible_ssh_extra_args='-o UserKnownHostsFile=/dev/null'\n"
    )
    ans_cfg = ans_dir / "ansible.cfg"
    ans_cfg.write_text(f"[defaults]\nhost_key_checking = False\nforks = {forks}\n[ssh_connection]\npipelining = True\n")
    return ans_inv, ans_cfg


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.work = work
        self.home = work / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.venv = Path(args.tools_venv) if args.tools_venv else None
        self.runs: list[dict[str, object]] = []
        self.notes: list[str] = []
        self.delay_done = False

    # -- environment -------------------------------------------------------

    def tool_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        env["HOME"] = str(self.home)
        env["XDG_STATE_HOME"] = str(self.work / "state")
        env["XDG_CONFIG_HOME"] = str(self.work / "config")
        if self.venv:
            env["PATH"] = f"{self.venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        return env

    def has(self, exe: str) -> bool:
        return bool(self.venv and (self.venv / "bin" / exe).exists())

    def versions(self) -> dict[str, str]:
        v = {
            "python": platform.python_version(),
            "paramiko": __import__("paramiko").__version__,
            "openssh": version_of(["ssh", "-V"]),
            "kernel": platform.release(),
            "cpus": str(os.cpu_count()),
        }
        if self.venv:
            py = str(self.venv / "bin" / "python")
            for dist in ("ansible-core", "ClusterShell", "parallel-ssh", "ssh2-python"):
                v[dist] = version_of([py, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"])
        return v

    # -- one size --------------------------------------------------------------

    def size(self, n: int) -> None:
        lab = LAB_DIR
        if light._read_state(lab):
            light.down(lab)
        t0 = time.perf_counter()
        inv = light.up(lab, n, base="127.1")
        up_s = time.perf_counter() - t0
        self.notes.append(f"N={n}: light lab up in {up_s:.1f} s")
        try:
            self._size(n, inv)
        finally:
            t0 = time.perf_counter()
            light.down(lab)
            self.notes.append(f"N={n}: light lab down in {time.perf_counter() - t0:.1f} s")

    def _size(self, n: int, inv: Path) -> None:
        a = self.args
        key = str(LAB_DIR / "keys" / "id_ed25519")
        addrs = [light.address_for(i, "127.1") for i in range(n)]
        hosts_file = self.work / f"hosts_{n}.txt"
        hosts_file.write_text("\n".join(addrs) + "\n")
        ans_inv, ans_cfg = write_ansible_files(self.work, n, addrs, key, a.fanout)
        f = str(a.fanout)
        ssh_opts = f"-i {key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
        tools: dict[str, list[str]] = {
            "floor": [sys.executable, str(HERE / "floor.py"), str(hosts_file), key, f],
            "clusterctl-cli": [
                sys.executable,
                "-m",
                "clusterctl.cli.main",
                "exec",
                "-i",
                str(inv),
                "all",
                "--fanout",
                f,
                "--connect-timeout",
                "30",
                "--json",
                "--",
                "true",
            ],
            "clusterctl-api": [sys.executable, str(HERE / "core.py"), str(inv), f],
        }
        if self.has("python") and "pssh" not in a.skip:
            tools["pssh"] = [str(self.venv / "bin" / "python"), str(HERE / "pssh_run.py"), str(hosts_file), key, f]  # type: ignore[operator]
        if self.has("clush") and "clush" not in a.skip:
            tools["clush"] = [
                str(self.venv / "bin" / "clush"),
                "-f",
                f,
                "--hostfile",
                str(hosts_file),
                "-o",
                ssh_opts,
                "true",
            ]  # type: ignore[operator]
            tools["clush-curve25519"] = tools["clush"][:-3] + [
                "-o",
                ssh_opts + " -o KexAlgorithms=curve25519-sha256",
                "true",
            ]
        if self.has("ansible") and "ansible" not in a.skip:
            tools["ansible-raw"] = [
                str(self.venv / "bin" / "ansible"),
                "all",
                "-i",
                str(ans_inv),
                "-m",
                "raw",
                "-a",
                "true",
                "-f",
                f,
            ]  # type: ignore[operator]
        for missing in ("pssh", "clush", "ansible"):
            if not any(t.startswith(missing) for t in tools) and missing not in a.skip:
                self.notes.append(f"{missing}: not installed in --tools-venv; not measured")
        for r in range(a.rounds):
            for name, cmd in tools.items():
                self.one(name, n, r, cmd, ans_cfg if name.startswith("ansible") else None)
        if a.delay_ms > 0 and not self.delay_done:  # once, on the first size
            self.delayed(n, key)
            self.delay_done = True

    def one(self, name: str, n: int, rnd: int, cmd: list[str], ans_cfg: Path | None, tag: str = "") -> None:
        env = self.tool_env()
        cp_dir = None
        if ans_cfg is not None:
            env["ANSIBLE_CONFIG"] = str(ans_cfg)
            cp_dir = Path(tempfile.mkdtemp(prefix="cp-", dir=self.work))
            env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(cp_dir)
        time.sleep(1.0)
        load = os.getloadavg()[0]
        try:
            wall, cpu, p = sh(cmd, env, timeout=self.args.run_timeout)
            ok = self.count_ok(name, n, p)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            wall, cpu, ok, rc = float(self.args.run_timeout), 0.0, 0, -1
        finally:
            if cp_dir is not None:
                self.close_masters(cp_dir)
        row = {
            "tool": name + tag,
            "n": n,
            "round": rnd,
            "wall_s": round(wall, 3),
            "client_cpu_s": round(cpu, 2),
            "ok": ok,
            "rc": rc,
            "load1_before": round(load, 2),
        }
        self.runs.append(row)
        print(json.dumps(row), flush=True)

    @staticmethod
    def close_masters(cp_dir: Path) -> None:
        socks = [s for s in cp_dir.iterdir()]

        def stop(s: Path) -> None:
            subprocess.run(["ssh", "-o", f"ControlPath={s}", "-O", "exit", "x"], capture_output=True, timeout=30)

        with ThreadPoolExecutor(8) as ex:
            list(ex.map(stop, socks))
        shutil.rmtree(cp_dir, ignore_errors=True)

    @staticmethod
    def count_ok(name: str, n: int, p: subprocess.CompletedProcess[str]) -> int:
        if name.startswith(("floor", "clusterctl-api", "pssh")):
            try:
                return int(json.loads(p.stdout.strip().splitlines()[-1])["ok"])
            except (ValueError, IndexError, KeyError):
                return 0
        if name.startswith("clusterctl-cli"):
            try:
                return int(json.loads(p.stdout)["counts"].get("ok", 0))
            except (ValueError, KeyError):
                return 0
        if name.startswith("clush"):  # clush prints one "host: ..." line per failing host on stderr
            bad = {line.split(":")[0] for line in p.stderr.splitlines() if line.strip()}
            return n - len(bad)
        if name.startswith("ansible"):
            return sum(1 for line in p.stdout.splitlines() if "| CHANGED" in line or "| SUCCESS" in line)
        return 0

    def delayed(self, n: int, key: str) -> None:
        a = self.args
        m = min(n, a.delay_hosts)
        pairs = [(light.address_for(i, "127.2"), light.address_for(i, "127.1")) for i in range(m)]
        known = {}
        for line in (LAB_DIR / "known_hosts").read_text().splitlines():
            addr, rest = line.split(" ", 1)
            known[addr] = rest
        kh = self.work / f"known_hosts_proxy_{n}"
        kh.write_text("".join(f"{p} {known[t]}\n" for p, t in pairs))
        specs = [light.HostSpec(f"px{i + 1:04d}", p) for i, (p, _) in enumerate(pairs)]
        inv = self.work / f"inventory_proxy_{n}.yaml"
        inv.write_text(light.inventory_text(specs, identity_file=Path(key), known_hosts=kh))
        hosts_file = self.work / f"hosts_proxy_{n}.txt"
        hosts_file.write_text("\n".join(p for p, _ in pairs) + "\n")
        tag = f"+delay{a.delay_ms:g}ms"
        tools = {
            "floor": [sys.executable, str(HERE / "floor.py"), str(hosts_file), key, str(a.fanout)],
            "clusterctl-cli": [
                sys.executable,
                "-m",
                "clusterctl.cli.main",
                "exec",
                "-i",
                str(inv),
                "all",
                "--fanout",
                str(a.fanout),
                "--connect-timeout",
                "30",
                "--json",
                "--",
                "true",
            ],
        }
        with DelayProxy(pairs, a.delay_ms):
            for r in range(a.rounds):
                for name, cmd in tools.items():
                    self.one(name, m, r, cmd, None, tag)

    # -- output ------------------------------------------------------------

    def summary(self) -> list[dict[str, object]]:
        groups: dict[tuple[str, int], list[dict[str, object]]] = {}
        for row in self.runs:
            groups.setdefault((str(row["tool"]), int(row["n"])), []).append(row)  # type: ignore[call-overload]
        floors = {}
        for (tool, n), rows in groups.items():
            if tool.startswith("floor"):
                floors[(tool.replace("floor", ""), n)] = statistics.median(float(r["wall_s"]) for r in rows)  # type: ignore[arg-type]
        out = []
        for (tool, n), rows in groups.items():
            walls = [float(r["wall_s"]) for r in rows]  # type: ignore[arg-type]
            med = statistics.median(walls)
            tag = tool[tool.index("+") :] if "+" in tool else ""
            floor = floors.get((tag, n))
            out.append(
                {
                    "tool": tool,
                    "n": n,
                    "runs": len(rows),
                    "median_s": round(med, 2),
                    "min_s": round(min(walls), 2),
                    "max_s": round(max(walls), 2),
                    "ok_worst": min(int(r["ok"]) for r in rows),  # type: ignore[call-overload]
                    "client_cpu_s_median": round(statistics.median(float(r["client_cpu_s"]) for r in rows), 2),  # type: ignore[arg-type]
                    "ratio_to_floor": round(med / floor, 2) if floor else None,
                }
            )
        return out


def write_markdown(path: Path, data: dict[str, object]) -> None:
    v = data["versions"]  # type: ignore[index]
    lines = [
        "# Fan-out benchmark: `true` on N light-mode lab hosts",
        "",
        f"Measured {data['date']} by `benchmarks/fanout/run.py` on {v['cpus']} CPUs, kernel {v['kernel']}. "  # type: ignore[index]
        "Hosts: light-mode lab (one OpenSSH sshd per host on 127.1.x.y in private mount/UTS/PID "
        "namespaces, own /root). Client, sshds and every other process share the same CPUs, so the "
        "ratios mean more than the seconds. Each tool is a fresh process (interpreter start-up "
        f"included), fan-out {data['settings']['fanout']}, {data['settings']['rounds']} interleaved rounds; "  # type: ignore[index]
        "ratio = tool median / floor median at the same N.",
        "",
        "| tool | N | runs | median s | min s | max s | ok (worst run) | ratio to floor | client CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in data["summary"]:  # type: ignore[union-attr]
        ratio = f"{s['ratio_to_floor']}x" if s["ratio_to_floor"] is not None else "-"
        lines.append(
            f"| {s['tool']} | {s['n']} | {s['runs']} | {s['median_s']} | {s['min_s']} | "
            f"{s['max_s']} | {s['ok_worst']}/{s['n']} | {ratio} | {s['client_cpu_s_median']} |"
        )
    lines += [
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        "",  # type: ignore[union-attr]
        "Settings: " + json.dumps(data["settings"]),
        "",
        "Notes:",
        "",
    ]
    lines += [f"- {n}" for n in data["notes"]]  # type: ignore[union-attr]
    lines += ["", "Raw rows: `benchmarks/results/` (one JSON file per run of the script).", ""]
    old = path.read_text() if path.exists() else ""
    if FACTS_MARK in old:  # the facts benchmark's section (benchmarks/facts/run.py) stays
        lines += [FACTS_MARK + old.split(FACTS_MARK, 1)[1]]
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines))
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fanout", type=int, default=64)
    ap.add_argument(
        "--tools-venv",
        default="/var/tmp/fanout-venv",
        help="virtualenv holding ansible-core, clustershell, parallel-ssh",
    )
    ap.add_argument("--skip", nargs="*", default=[], choices=["pssh", "clush", "ansible"])
    ap.add_argument("--delay-ms", type=float, default=20.0, help="per-direction delay of the proxy run (0: none)")
    ap.add_argument("--delay-hosts", type=int, default=100)
    ap.add_argument("--run-timeout", type=float, default=600.0, help="seconds one tool run may take")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--markdown", default=str(REPO / "docs" / "benchmarks-fanout.md"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run.py needs root (it starts sshd hosts in new namespaces)", file=sys.stderr)
        return 3
    if args.tools_venv and not Path(args.tools_venv).exists():
        args.tools_venv = None
    work = Path(tempfile.mkdtemp(prefix="fanout-bench-"))
    bench = Bench(args, work)
    if not bench.venv:
        bench.notes.append("no --tools-venv: pssh, clush and Ansible not measured")
    t0 = time.perf_counter()
    try:
        for n in args.sizes:
            bench.size(n)
    finally:
        if light._read_state(LAB_DIR):
            light.down(LAB_DIR)
        shutil.rmtree(work, ignore_errors=True)
    bench.notes.append(f"whole benchmark: {time.perf_counter() - t0:.0f} s")
    bench.notes.append(
        "KEX: paramiko (floor, clusterctl) and libssh2 (pssh) negotiate curve25519-sha256; "
        "the OpenSSH client (clush, Ansible) defaults to sntrup761x25519-sha512, "
        "which costs ~65 ms client CPU per connection; clush-curve25519 pins curve25519"
    )
    date = dt.datetime.now().strftime("%Y-%m-%dT%H%M")
    data = {
        "date": date,
        "versions": bench.versions(),
        "settings": {
            "fanout": args.fanout,
            "rounds": args.rounds,
            "sizes": args.sizes,
            "delay_ms": args.delay_ms,
            "delay_hosts": args.delay_hosts,
            "ansible": "raw module, forks = fanout, pipelining on, host_key_checking off, "
            "default ssh_args (ControlPersist 60s), fresh ControlPath per run",
        },
        "runs": bench.runs,
        "summary": bench.summary(),
        "notes": bench.notes,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"fanout-{date}.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, target)
    write_markdown(Path(args.markdown), data)
    print(f"wrote {target} and {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
