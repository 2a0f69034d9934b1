"""Release benchmark: from "new version" to every replica serving it, on N light-mode lab hosts.

For each host count N (default 8, 16, 32; never more than 100 while others share
the machine), on a light lab (one real sshd per host on a loopback address, real
SSH, a private ``/root`` per host, so each host has its own model directory
``/root/models/bench``):

* the source is nginx in a network namespace of its own (``--netns``), serving
  random-byte models of ``--size`` (64 MiB shards) over a veth pair
  (``NET.250.0/30``) that tbf limits to B = ``--rate`` both ways, so the head of a
  chain reads at B; the hops between hosts are loopback, not shaped (the lab
  cannot shape a light host's link): what the chain adds per hop here is SSH,
  start-up, hashing and relay copies on 2 shared cores;
* the version in use (v1) is staged and a **stand-in replica** is started on every
  host: a stdlib HTTP server that, before it answers, waits the time a real engine
  would take to load ``--real-gb`` of weights at the simulator's rates (3.5 GiB/s from
  the page cache, 1.0 GiB/s from storage, ``clusterctl.lab.vllm_sim.startup``),
  weighted by the fraction of the staged files resident in the page cache
  (``mincore``), times ``--time-scale``; it then answers ``/health``,
  ``/v1/models`` and a one-token ``/v1/completions``, so the real deploy gates
  (``clusterctl.deploy.rollout.gates.wait_gates``) gate it;
* **release A, in the window** (what ``clusterctl deploy`` does): batches of
  ``--serial`` (``clusterctl.deploy.rollout.batches.batches``); per batch: stage the new
  version on the batch's hosts (chain, switch), restart their replicas (one fan-out
  command), gate them;
* **release B, pre-staged**: before the window ``stage --no-switch --warm`` of the
  next version on every host (one chain); in the window per batch: the same staging
  call (the version is already present: it only switches), restart, gate.

Also per N: one fan-out round (``true`` on every host: what the deploy's read, lock,
re-read and unlock each cost at least), and on one host the lab disk's read rate of
the staged files cold (``fdatasync`` + ``DONTNEED`` first) and from the page cache.

Every phase records its seconds and the 1-minute load average; staging rows carry
the node timings (first/last chunk written, head lag).  A model is fitted to the
measurements (least squares over N) and used for the 125 hosts x 8 GPUs figure:
see ``model()``.  Writes ``benchmarks/results/release-<date>.json`` (temp + rename);
``plot.py`` draws it.  Needs root.  Tears down its lab, nginx and stand-ins.

Example: nice -n 10 python3 benchmarks/release/run.py --hosts 8,16,32 --rate 50mbit --size 64M
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from clusterctl.deploy.rollout import gates, batches as rollout  # noqa: E402
from clusterctl.fleet import Fleet  # noqa: E402
from clusterctl.inventory.loader import load_inventory  # noqa: E402
from clusterctl.inventory.model import Model  # noqa: E402
from clusterctl.lab import light, netfaults  # noqa: E402
from clusterctl.lab.vllm_sim.startup import COLD_BPS, HOT_BPS  # noqa: E402
from clusterctl.node.stage import manifest as mf  # noqa: E402
from clusterctl.stage.plan import load_manifest, parse_source, write_manifest  # noqa: E402
from clusterctl.stage.run import stage_model  # noqa: E402

_spec = importlib.util.spec_from_file_location("staging_run", HERE.parent / "staging" / "run.py")
assert _spec and _spec.loader
staging_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(staging_run)
sh = staging_run.sh

MODEL_PATH = "/root/models/bench"
SERVED = "bench"
REPLICA_PORT = 8000
SRC_PORT = 8080
SHARD = 64 << 20


# The stand-in replica (runs on a lab host; stdlib only).  argv: address port model_path
# served_name real_bytes time_scale hot_Bps cold_Bps.  Writes /run/standin.pid first.
STANDIN = r'''
import ctypes, ctypes.util, http.server, json, mmap, os, sys, time
a = sys.argv
addr, port, path, name = a[1], int(a[2]), a[3], a[4]
real, scale, hot, cold = float(a[5]), float(a[6]), float(a[7]), float(a[8])
open("/run/standin.pid", "w").write(str(os.getpid()))
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
res = tot = 0
for f in sorted(os.listdir(path)):
    p = os.path.join(path, f)
    if not f.endswith(".safetensors"):
        continue
    size = os.path.getsize(p)
    fd = os.open(p, os.O_RDONLY)
    m = libc.mmap(None, size, 1, 1, fd, 0)
    n = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * n)()
    libc.mincore(ctypes.c_void_p(m), size, vec)
    res += sum(1 for b in vec if b & 1) * mmap.PAGESIZE
    tot += size
    libc.munmap(ctypes.c_void_p(m), size)
    os.close(fd)
frac = min(1.0, res / tot) if tot else 0.0
load = real * (frac / hot + (1 - frac) / cold)
time.sleep(load * scale)
info = json.dumps({"resident_fraction": round(frac, 3), "load_s_unscaled": round(load, 2),
                   "version": os.readlink(path)}).encode()
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *x):
        pass
    def reply(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/v1/models":
            self.reply(json.dumps({"data": [{"id": name}]}).encode())
        elif self.path == "/standin":
            self.reply(info)
        else:
            self.reply(b"")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply(json.dumps({"choices": [{"text": "x"}]}).encode())
http.server.ThreadingHTTPServer((addr, port), H).serve_forever()
'''


def load1() -> float:
    return round(os.getloadavg()[0], 2)


class Source(staging_run.SourceNetns):  # type: ignore[misc,name-defined]
    """nginx in a network namespace of its own (``ns``), reached from the host's namespace
    (where the light hosts are) over a veth pair whose both ends tbf limits to ``rate``
    (the staging benchmark's source, without the lab bridge: light hosts are not on one)."""

    def __init__(self, ns: str, net: str, root: Path, rate: str):
        self.ns, self.root, self.rate = ns, root, rate
        self.veth = f"v{ns}"[:15]
        self.here, self.addr = f"{net}.250.1", f"{net}.250.2"
        self.tmp = Path(tempfile.mkdtemp(prefix="release-nginx-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, version: str) -> str:  # type: ignore[override]
        return f"http://{self.addr}:{SRC_PORT}/{version}/"

    def __enter__(self) -> "Source":
        bps = netfaults.parse_rate(self.rate)
        tbf = [
            "root",
            "tbf",
            "rate",
            f"{bps}bit",
            "burst",
            str(netfaults.tbf_burst_bytes(bps)),
            "latency",
            netfaults.TBF_LATENCY,
        ]
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        sh("ip", "addr", "add", f"{self.here}/30", "dev", self.veth)
        sh("ip", "link", "set", self.veth, "up")
        sh("ip", "-n", self.ns, "addr", "add", f"{self.addr}/30", "dev", "eth0")
        sh("ip", "-n", self.ns, "link", "set", "eth0", "up")
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")
        sh("tc", "qdisc", "replace", "dev", self.veth, *tbf)
        sh("ip", "netns", "exec", self.ns, "tc", "qdisc", "replace", "dev", "eth0", *tbf)
        conf = self.tmp / "nginx.conf"
        conf.write_text(staging_run.NGINX_CONF.format(tmp=self.tmp, addr=self.addr, port=SRC_PORT, root=self.root))
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "nginx", "-c", str(conf), "-p", str(self.tmp)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(100):
            try:
                urllib.request.urlopen(self.url("v1") + mf.MANIFEST_NAME, timeout=1).read()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"nginx did not answer: {(self.tmp / 'error.log').read_text()[-500:]}")


def write_random_model(out: Path, total: int) -> None:
    out.mkdir(parents=True)
    (out / "config.json").write_text('{"architectures": ["Bench"]}\n')
    n = -(-total // SHARD)
    for i in range(n):
        (out / f"model-{i + 1:05d}-of-{n:05d}.safetensors").write_bytes(os.urandom(min(SHARD, total - i * SHARD)))


def stage_row(rep: Any, secs: float, bound: float) -> dict[str, Any]:
    """Staging's seconds, ratio to S/B and the per-node timings (head lag: when the
    head forwarded its last chunk after writing it, the tail's wall)."""
    nodes = [
        {
            "host": r.host,
            "wall_s": round(r.duration_s, 3),
            "node_s": r.data.get("seconds"),
            "already_present": bool(r.data.get("already_present")),
            "timings": r.data.get("timings"),
            "warm": r.data.get("warm"),
        }
        for r in rep.rows
    ]
    return {
        "seconds": round(secs, 3),
        "ratio_to_S_over_B": round(secs / bound, 3) if bound else None,
        "ok": rep.ok,
        "failures": [r.to_dict() for r in rep.rows if not r.ok],
        "nodes": nodes,
    }


class Bench:
    def __init__(self, args: argparse.Namespace, inv: Any, src: Source, mans: dict[str, mf.Manifest], size: int):
        self.args, self.inv, self.src, self.mans, self.size = args, inv, src, mans, size
        self.model = Model("bench", MODEL_PATH)
        self.bound = size * 8 / netfaults.parse_rate(args.rate)

    def fleet(self, names: list[str]) -> Fleet:
        return Fleet([self.inv.hosts[h] for h in names], fanout=max(1, len(names)), command_timeout=1800)

    def stage(self, names: list[str], version: str, **kw: Any) -> dict[str, Any]:
        source = parse_source(self.src.url(version))
        with self.fleet(names) as fl:
            t0 = time.monotonic()
            rep = stage_model(
                fl,
                [self.inv.hosts[h] for h in names],
                self.model,
                source,
                self.mans[version],
                relay="chain",
                workers=self.args.workers,
                **kw,
            )
            secs = time.monotonic() - t0
        row = stage_row(rep, secs, self.bound)
        if not rep.ok:
            raise RuntimeError(f"staging {version} failed: {row['failures'][:2]}")
        return row

    def restart(self, names: list[str]) -> dict[str, Any]:
        """Stop each host's replica, start the new one, gate them all: one fan-out, then the gates."""
        prog = shlex.quote(STANDIN)
        cmds = {}
        for h in names:
            addr = self.inv.hosts[h].address
            argv = " ".join(
                shlex.quote(str(x))
                for x in (
                    addr,
                    REPLICA_PORT,
                    MODEL_PATH,
                    SERVED,
                    self.args.real_gb * 1e9,
                    self.args.time_scale,
                    HOT_BPS,
                    COLD_BPS,
                )
            )
            cmds[h] = (
                "p=$(cat /run/standin.pid 2>/dev/null); if [ -n \"$p\" ]; then kill \"$p\"; "
                "while kill -0 \"$p\" 2>/dev/null; do sleep 0.02; done; fi; rm -f /run/standin.pid; "
                f"setsid -f python3 -c {prog} {argv} </dev/null >/run/standin.log 2>&1"
            )
        t0 = time.monotonic()
        with self.fleet(names) as fl:
            res = fl.run(cmds, timeout=60)
        t_apply = time.monotonic() - t0
        bad = [r for r in res if not r.ok]
        if bad:
            raise RuntimeError(f"restart failed: {[(r.host, r.error, r.stderr[-200:]) for r in bad[:3]]}")
        targets = [gates.GateTarget(f"bench-{h}", h, self.inv.hosts[h].address, REPLICA_PORT, SERVED) for h in names]
        results = gates.wait_gates(targets, timeout_s=600)
        t_all = time.monotonic() - t0
        if not all(g.ok for g in results):
            raise RuntimeError(f"gates failed: {[g.to_dict() for g in results if not g.ok][:3]}")
        info = [json.loads(gates.request(t, "/standin", None, 5)[1]) for t in targets[:1]]
        return {
            "hosts": len(names),
            "apply_s": round(t_apply, 3),
            "gated_s": round(t_all, 3),
            "gate_after_apply_s": round(t_all - t_apply, 3),
            "replica": info[0],
            "load1": load1(),
        }

    def release(self, names: list[str], version: str, prestaged: bool) -> dict[str, Any]:
        """One release to ``version`` over ``names`` in batches of ``--serial``."""
        out: dict[str, Any] = {"version": version, "prestaged": prestaged, "load1_before": load1()}
        if prestaged:
            t0 = time.monotonic()
            out["prestage"] = self.stage(names, version, switch=False, warm=True)
            out["prestage"]["load1"] = load1()
            out["prestage_s"] = round(time.monotonic() - t0, 3)
        t0 = time.monotonic()
        with self.fleet(names) as fl:
            r0 = time.monotonic()
            fl.run("true", timeout=60)
            out["fanout_round_s"] = round(time.monotonic() - r0, 3)
        out["batches"] = []
        for batch in rollout.batches(names, self.args.serial.split(",")):
            b: dict[str, Any] = {"hosts": len(batch)}
            s0 = time.monotonic()
            b["stage"] = self.stage(batch, version)
            b["stage_s"] = round(time.monotonic() - s0, 3)
            b.update(self.restart(batch))
            b["seconds"] = round(time.monotonic() - s0, 3)
            out["batches"].append(b)
            print(
                f"  batch {len(batch)} hosts: stage {b['stage_s']} s, restart+gates {b['gated_s']} s "
                f"(load1 {b['load1']})",
                file=sys.stderr,
            )
        out["window_s"] = round(time.monotonic() - t0, 3)
        out["load1_after"] = load1()
        return out

    def disk_rates(self, host: str, version: str) -> dict[str, Any]:
        """Read rate of the staged shards on ``host``: cold (evicted first) and from the page cache."""
        prog = (
            "import os,sys,time\nfds=[os.open(p,os.O_RDONLY) for p in sys.argv[2:]]\n"
            "if sys.argv[1]=='cold':\n for fd in fds: os.fdatasync(fd); os.posix_fadvise(fd,0,0,4)\n"
            "t=time.monotonic();n=0\nfor fd in fds:\n while True:\n  b=os.read(fd,1<<22)\n"
            "  if not b: break\n  n+=len(b)\nprint(n/(time.monotonic()-t))"
        )
        files = [
            f"/root/models/.versions/bench/{version}/{f.path}"
            for f in self.mans[version].files
            if f.path.endswith(".safetensors")
        ]
        out = {}
        with self.fleet([host]) as fl:
            for kind in ("cold", "cached"):  # the best of 3: the machine is shared
                rates = [
                    float(
                        fl.run(f"python3 -c {shlex.quote(prog)} {kind} {' '.join(files)}", timeout=300)[
                            host
                        ].stdout.strip()
                    )
                    for _ in range(3)
                ]
                out[f"{kind}_Bps"] = round(max(rates))
        out["load1"] = load1()
        return out


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def rising_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """:func:`fit_line`, but never falling with the host count: a negative slope (noise over a
    cost that does not grow measurably, e.g. pre-flight from 4 to 16 hosts with its two rounds at
    once) would shrink the cost at 125 hosts below anything measured; then the mean, flat."""
    a, b = fit_line(xs, ys)
    return (a, b) if b >= 0 else (sum(ys) / len(ys), 0.0)


def model(runs: list[dict[str, Any]], bound: float, args: argparse.Namespace) -> dict[str, Any]:
    """Fit the release model to the runs and state it at 125 hosts x 8 GPUs.

    staging(N) = S/B + c + h x N  (chain: the source read once at B; c: start-up, SSH,
                                   the last chunk's verify; h per hop);
    batch(n)   = apply(n) + load + gate,  apply(n) = c + d x n  (one fan-out command);
    release    = rounds x round(N) + sum over batches of [switch(n) + batch(n)]   (pre-staged)
               + prestage(N) once before the window (staging without switching, then the
                 warm-up: fitted on the pre-staging runs, prestage(N) = S/B + c_p + h_p x N);
    surge      = the pre-staged release with each batch's apply + load + gate paid (1 + f)
                 times: a surge copy starts, passes its gates and joins the gateway before the
                 replica restarts in place; f is the surge benchmark's measured extra over in
                 place, gateway syncs included (``surge_factor``: the newest surge sweep's
                 per-batch fit, else a single surge run's ratio).
    preflight  = c + h x N once per release, switch-over(n) = c + d x n per batch (its drain:
                 mark-down at the gateway and the wait for requests in flight; its mark-up after
                 the gates): fitted on the nspawn lab's real releases (``lab_terms``), which the
                 light hosts (no systemd, no gateway) cannot measure.
    The load time in the lab is the stand-in's scaled wait; at scale it is the real
    one (``--real-gb`` at 3.5 GiB/s warm, 1.0 GiB/s cold)."""
    ns = [r["hosts"] for r in runs]
    # Staging fitted on every cold chain measured: the first version on all N hosts and
    # release A's per-batch chains (1 host up to 3/4 of N), all with a switch and no warm-up.
    chain_n = [r["hosts"] for r in runs] + [b["hosts"] for r in runs for b in r["A"]["batches"]]
    chain_s = [r["initial_stage"]["seconds"] for r in runs] + [
        b["stage"]["seconds"] for r in runs for b in r["A"]["batches"]
    ]
    a_s, h_s = fit_line(chain_n, chain_s)
    c_s = a_s - bound
    # Per batch in B: switch (already present) and restart + gates, against the batch size.
    bx, switch, apply_, gate_extra = [], [], [], []
    scaled_load = None
    for r in runs:
        for b in r["B"]["batches"]:
            bx.append(b["hosts"])
            switch.append(b["stage_s"])
            apply_.append(b["apply_s"])
            gate_extra.append(b["gate_after_apply_s"])
            scaled_load = b["replica"]["load_s_unscaled"] * args.time_scale
    sw_c, sw_d = fit_line(bx, switch)
    ap_c, ap_d = fit_line(bx, apply_)
    gate_over = [g - (scaled_load or 0) for g in gate_extra]
    g_c, g_d = fit_line(bx, gate_over)
    rnd_c, rnd_d = fit_line(ns, [r["B"]["fanout_round_s"] for r in runs])
    p_a, h_p = fit_line(ns, [r["B"]["prestage"]["seconds"] for r in runs])
    c_p = p_a - bound
    surge_f, surge_src = surge_factor(getattr(args, "surge_result", None))
    lab = lab_terms(getattr(args, "lab_result", None))
    pf_c, pf_h = lab["preflight_s"]
    so_c, so_d = lab["switch_over_s"]

    def predict(
        n_hosts: int, s_bytes: float, b_bps: float, load_s: float, serial: str | None = None, real: bool = True
    ) -> dict[str, Any]:
        """``real``: with the pre-flight and switch-over terms (False: as on the light hosts, which have
        no gateway and whose pre-flight is not run: what the checks compare with)."""
        so = (so_c, so_d) if real else (0.0, 0.0)
        sizes = [len(b) for b in rollout.batches(list(range(n_hosts)), (serial or args.serial).split(","))]
        staging = s_bytes * 8 / b_bps + c_s + h_s * n_hosts
        prestaged = s_bytes * 8 / b_bps + c_p + h_p * n_hosts
        # each batch: drained at the gateway first (mark-down, the wait for requests in flight), put
        # back after its gates (mark-up): the switch-over, measured on the nspawn lab (lab.py)
        restart = [(ap_c + ap_d * n) + load_s + (g_c + g_d * n) + (so[0] + so[1] * n) for n in sizes]
        per = [(sw_c + sw_d * n) + r for n, r in zip(sizes, restart)]
        # read, lock, re-read, unlock; pre-flight (on the nspawn lab: real node checks per host)
        rounds = 4 * (rnd_c + rnd_d * n_hosts) + ((pf_c + pf_h * n_hosts) if real else 0.0)
        # Without pre-staging each batch's chain reads the source again (deploy stages per batch).
        in_window = [s_bytes * 8 / b_bps + c_s + h_s * n + r for n, r in zip(sizes, restart)]
        surge = [(sw_c + sw_d * n) + (1 + surge_f) * r for n, r in zip(sizes, restart)]
        return {
            "batches": len(sizes),
            "batch_sizes": sizes,
            "staging_s": round(staging, 1),
            "prestage_with_warm_s": round(prestaged, 1),
            "window_s": round(rounds + sum(per), 1),
            "window_surge_s": round(rounds + sum(surge), 1),
            "window_without_prestage_s": round(rounds + sum(in_window), 1),
            "per_batch_s": [round(p, 1) for p in per],
            "preflight_s": round(pf_c + pf_h * n_hosts, 1),
            "switch_over_s": [round(so[0] + so[1] * n, 1) for n in sizes],
            "serving_at_least": round(1 - max(sizes) / n_hosts, 3),
        }

    checks = []
    for r in runs:
        n = r["hosts"]
        p = predict(n, r["bytes"], netfaults.parse_rate(args.rate), scaled_load or 0, real=False)
        checks.append(
            {
                "hosts": n,
                "predicted_staging_s": p["staging_s"],
                "measured_staging_s": r["initial_stage"]["seconds"],
                "predicted_prestage_with_warm_s": p["prestage_with_warm_s"],
                "measured_prestage_with_warm_s": r["B"]["prestage"]["seconds"],
                "predicted_window_s": p["window_s"],
                "measured_window_s": r["B"]["window_s"],
                "predicted_window_without_prestage_s": p["window_without_prestage_s"],
                "measured_window_without_prestage_s": r["A"]["window_s"],
            }
        )
    real = args.real_gb * 1e9
    at_scale = {}
    for link in ("25gbit", "100gbit"):
        bps = netfaults.parse_rate(link)
        at_scale[link] = {
            "warm": predict(125, real, bps, real / HOT_BPS),
            "cold": predict(125, real, bps, real / COLD_BPS),
            "warm_serial_1,25%": predict(125, real, bps, real / HOT_BPS, "1,25%"),
            "warm_serial_1,10%": predict(125, real, bps, real / HOT_BPS, "1,10%"),
        }
    return {
        "staging": {
            "fixed_s": round(c_s, 3),
            "per_hop_s": round(h_s, 4),
            "ratio_to_S_over_B": {r["hosts"]: r["initial_stage"]["ratio_to_S_over_B"] for r in runs},
        },
        "prestage_with_warm": {"fixed_s": round(c_p, 3), "per_host_s": round(h_p, 4)},
        "surge_extra_factor": round(surge_f, 3),
        "surge_result": surge_src,
        "switch_s": [round(sw_c, 3), round(sw_d, 4)],
        "apply_s": [round(ap_c, 3), round(ap_d, 4)],
        "gate_over_load_s": [round(g_c, 3), round(g_d, 4)],
        "fanout_round_s": [round(rnd_c, 3), round(rnd_d, 4)],
        "preflight_s": [round(pf_c, 3), round(pf_h, 4)],
        "switch_over_s": [round(so_c, 3), round(so_d, 4)],
        "lab_result": lab["source"],
        "checks": checks,
        "at_125_hosts_x_8_gpus": at_scale,
        "assumptions": f"one TP-8 replica per host of a {args.real_gb:g} GB model; load at 3.5 GiB/s from the "
        "page cache, 1.0 GiB/s from storage (the simulator's rates); the per-hop and fan-out "
        "costs fitted here on 2 shared cores; staging at B with the fitted factor f",
    }


def lab_terms(path: Path | None) -> dict[str, Any]:
    """Pre-flight per release and the gateway switch-over per batch, from the nspawn lab's real
    releases (``benchmarks/release/lab.py``: pre-flight from every release, the switch-over from the
    "after" arm, the drain path as it is; every release-lab result when ``path`` is None): ``preflight_s`` = (c, per host), ``switch_over_s`` = (c, per batch host), the batch's drain
    (mark-down and the wait for requests in flight) plus its mark-up.  Without a result: zeros."""
    paths = [Path(path)] if path is not None else sorted((REPO / "benchmarks" / "results").glob("release-lab-*.json"))
    if not paths:
        return {"preflight_s": (0.0, 0.0), "switch_over_s": (0.0, 0.0), "source": None}
    every = [r for p in paths for r in json.loads(p.read_text())["runs"] if r.get("timings")]
    # pre-flight is the same code in both arms: every release measured counts
    pf = rising_line([float(r["hosts"]) for r in every], [r["timings"]["preflight_s"] for r in every])
    bs = [b for r in every if r["arm"] == "after" for b in r["timings"]["batches"]]
    so = rising_line([float(b["hosts"]) for b in bs], [b["drain_s"] + b["mark_up_s"] for b in bs])
    return {"preflight_s": pf, "switch_over_s": so, "source": [p.name for p in paths]}


def surge_factor(path: Path | None) -> tuple[float, str | None]:
    """f of the surge term (each batch paid ``1 + f`` times) and the file it came from.

    From a surge sweep (``benchmarks/surge/sweep.py``: releases of 2, 4, 8 ... replicas, ``fit.f`` =
    the surge release's seconds per batch over in place's, less 1) when there is one, else from a
    single surge run (``benchmarks/release/surge.py``: its seconds over in place's, less 1).  With
    ``path`` None: the newest ``surge-sweep-*.json``, else the newest ``release-surge-*.json``;
    neither: 1.0 (one more start per batch, nothing else) and no source."""
    if path is None:
        results = REPO / "benchmarks" / "results"
        found = sorted(results.glob("surge-sweep-*.json")) or sorted(results.glob("release-surge-*.json"))
        if not found:
            return 1.0, None
        path = found[-1]
    doc = json.loads(Path(path).read_text())
    if "f" in (doc.get("fit") or {}):
        return float(doc["fit"]["f"]), Path(path).name
    runs = {r["release"]: r for r in doc["runs"]}
    return float(runs["surge"]["seconds"]) / float(runs["in place"]["seconds"]) - 1, Path(path).name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", default="8,16,32", help="host counts, comma-separated (at most 100)")
    ap.add_argument("--rate", default="50mbit", help="B: the source's rate (the head's reads together)")
    ap.add_argument("--size", default="64M", help="model size S (random bytes in 64 MiB shards)")
    ap.add_argument("--workers", type=int, default=8, help="ranged reads per node (the source's connections)")
    ap.add_argument("--serial", default="1,25%,100%", help="deploy --serial of the rollout")
    ap.add_argument("--real-gb", type=float, default=140.0, help="the real model's size the load stands for (GB)")
    ap.add_argument("--time-scale", type=float, default=0.05, help="the stand-in's load wait = real load x this")
    ap.add_argument("--lab-dir", default="/var/lib/clusterctl-lab-27/release")
    ap.add_argument("--base", default="127.27", help="light hosts' addresses: BASE.x.y")
    ap.add_argument(
        "--net",
        default=os.environ.get("CLUSTERCTL_LAB_NET", "10.27"),
        help="the source's link is NET.250.0/30 (default: $CLUSTERCTL_LAB_NET)",
    )
    ap.add_argument("--netns", default="ccrel27src", help="the source's network namespace")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--surge-result",
        type=Path,
        default=None,
        help="the model's surge term: a surge sweep (benchmarks/surge/sweep.py, its fit.f) or one surge.py "
        "result (default: the newest surge-sweep-*.json, else the newest release-surge-*.json)",
    )
    ap.add_argument(
        "--lab-result",
        type=Path,
        default=None,
        help="the nspawn lab's release result (benchmarks/release/lab.py) the pre-flight and switch-over "
        "terms come from (default: every release-lab-*.json)",
    )
    ap.add_argument(
        "--refit",
        type=Path,
        nargs="?",
        const=Path(),
        default=None,
        help="recompute only the model of a result JSON written earlier (rewrites its 'model'; no path: "
        "the newest release-<date>.json), from the surge and nspawn lab results as they are now",
    )
    args = ap.parse_args()
    if args.refit is not None:
        if args.refit == Path():
            found = sorted((REPO / "benchmarks" / "results").glob("release-2*.json"))
            found = [p for p in found if "-linger" not in p.name]
            if not found:
                ap.error("--refit: no benchmarks/results/release-<date>.json to refit")
            args.refit = found[-1]
        doc = json.loads(args.refit.read_text())
        for k in ("serial", "real_gb", "time_scale", "rate"):
            setattr(args, k, doc[k])
        doc["model"] = model(doc["runs"], doc["S_over_B_s"], args)
        tmp = args.refit.with_name(args.refit.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, args.refit)
        print(json.dumps(doc["model"], indent=1))
        return 0
    counts = [int(x) for x in args.hosts.split(",")]
    if max(counts) > 100:
        ap.error("--hosts: at most 100 hosts on this shared machine")
    total = int(float(args.size[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[args.size[-1].upper()])
    lab = Path(args.lab_dir)
    if light._read_state(lab):
        light.down(lab)
    work = Path(tempfile.mkdtemp(prefix="release-bench-"))
    os.chmod(work, 0o755)
    mans = {}
    for i, v in enumerate(("v1", "v2", "v3")):
        write_random_model(work / v, total)
        mans[v] = mf.compute(str(work / v), "bench", v, 1 << 20)
        write_manifest(str(work / v), mans[v])
    runs: list[dict[str, Any]] = []
    started = dt.datetime.now(dt.timezone.utc)
    load_start = [round(x, 2) for x in os.getloadavg()]
    inv_path = light.up(lab, max(counts), base=args.base, prefix="rl")
    try:
        inv = load_inventory(str(inv_path))
        names_all = sorted(inv.hosts)
        with Source(args.netns, args.net, work, args.rate) as src:
            mans = {v: load_manifest(parse_source(src.url(v)), "bench", v) for v in mans}
            bench = Bench(args, inv, src, mans, total)
            for n in counts:
                names = names_all[:n]
                with bench.fleet(names) as fl:
                    fl.run(
                        "p=$(cat /run/standin.pid 2>/dev/null); [ -n \"$p\" ] && kill \"$p\"; "
                        "rm -rf /root/models /run/standin.pid; true",
                        timeout=60,
                    )
                print(f"N={n}: staging v1 and starting the replicas", file=sys.stderr)
                row: dict[str, Any] = {"hosts": n, "bytes": total, "load1_before": load1()}
                row["initial_stage"] = bench.stage(names, "v1")
                row["initial_start"] = bench.restart(names)
                print(f"N={n}: release A (staging in the window)", file=sys.stderr)
                row["A"] = bench.release(names, "v2", prestaged=False)
                print(f"N={n}: release B (pre-staged)", file=sys.stderr)
                row["B"] = bench.release(names, "v3", prestaged=True)
                row["disk"] = bench.disk_rates(names[0], "v3")
                row["load1_after"] = load1()
                print(
                    json.dumps(
                        {k: row[k] for k in ("hosts", "load1_before", "load1_after")}
                        | {
                            "A_window_s": row["A"]["window_s"],
                            "B_window_s": row["B"]["window_s"],
                            "prestage_s": row["B"]["prestage_s"],
                        }
                    ),
                    file=sys.stderr,
                )
                runs.append(row)
                with bench.fleet(names) as fl:
                    fl.run(
                        "p=$(cat /run/standin.pid 2>/dev/null); [ -n \"$p\" ] && kill \"$p\"; "
                        "rm -rf /root/models /run/standin.pid; true",
                        timeout=60,
                    )
    finally:
        light.down(lab)
        shutil.rmtree(work, ignore_errors=True)
    bound = total * 8 / netfaults.parse_rate(args.rate)
    doc = {
        "benchmark": "release",
        "date": started.isoformat(timespec="seconds"),
        "bytes": total,
        "rate": args.rate,
        "S_over_B_s": round(bound, 3),
        "serial": args.serial,
        "real_gb": args.real_gb,
        "time_scale": args.time_scale,
        "hot_Bps": HOT_BPS,
        "cold_Bps": COLD_BPS,
        "workers": args.workers,
        "load_avg_start": load_start,
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "machine": f"{os.cpu_count()} CPUs shared by six engineers; light lab hosts (sshd in namespaces)",
        "runs": runs,
        "model": model(runs, bound, args),
    }
    out = Path(args.out or REPO / "benchmarks" / "results" / f"release-{started:%Y-%m-%dT%H%M}.json")
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
