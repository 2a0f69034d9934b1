"""Staging benchmark: naive (every host pulls) against the relay chain, on tbf-shaped lab links.

nginx (Debian's nginx-light, which answers range requests) runs in a network
namespace of its own (``<prefix>src``, ``NET.0.250`` on the lab bridge) and
serves a real-byte synthetic model of S bytes.  Every link is limited to the
same rate B with tbf in both directions: the server's veth and each lab
host's (``clusterctl.lab.netfaults.bandwidth``).  For each host count N
(default 2, 4, 8), and for each mode, the model is staged afresh
(``clusterctl.stage.run.stage_model`` over real SSH) and timed:

* ``none``: all N hosts read the server at once; bound N x S / B;
* ``chain``: the server is read once, hosts relay; bound about S / B;
* ``tree``: the server is read once, every node feeds two children; bound
  about S / B while each node's uplink carries two copies (so up to 2 x S / B here,
  where every uplink is limited to B).

Each row records the load average before the run and every node's timings
(the node program's ``timings``: first and last chunk written, first and
last chunk relayed, relay wait, verify tail) and its wall time seen from
here (the difference to the node's own ``seconds`` is SSH and start-up).

Then on one host: the cold sequential read rate of the staged shards
(``fdatasync`` + ``posix_fadvise DONTNEED`` first: DONTNEED skips dirty
pages, and the shards were just written) and ``stage warm`` from cold
(parallel readers) with the resident fraction before and after it.

``--model random:128M`` serves random bytes in 64 MiB shards instead of a
synthetic checkpoint: large enough that S / B is 10 s or more at 100 mbit.

Writes ``benchmarks/results/staging-<date>.json`` (temp + rename).  Needs root
and a lab (brought up with the largest N if needed; select another lab with
the CLUSTERCTL_LAB_* variables).  Removes its namespace, nginx, limits and
staged files afterwards.

Example: CLUSTERCTL_LAB_DIR=/var/lib/clusterctl-lab-stg CLUSTERCTL_LAB_BRIDGE=labstg0 \\
         CLUSTERCTL_LAB_NET=10.86 CLUSTERCTL_LAB_PREFIX=stg \\
         python3 benchmarks/staging/run.py --hosts 2,4,8 --rate 200mbit --model small-llama
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from clusterctl.fleet import Fleet
from clusterctl.inventory.loader import load_inventory
from clusterctl.inventory.model import Model
from clusterctl.lab import faults, netfaults
from clusterctl.lab.config import LabConfig
from clusterctl.lab.session import LabSession
from clusterctl.lab.vllm_sim import synth
from clusterctl.node.stage import manifest as mf
from clusterctl.stage.bundle import program
from clusterctl.stage.plan import load_manifest, parse_source, write_manifest
from clusterctl.stage.run import node_op, stage_model

ROOT = Path(__file__).resolve().parents[2]
PORT = 8080
NGINX_CONF = """daemon off;
worker_processes 2;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
  access_log off;
  sendfile on;
  server {{
    listen {addr}:{port};
    root {root};
    location / {{ }}
  }}
}}
"""


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


class SourceNetns:
    """nginx in its own network namespace on the lab bridge, its veth shaped to ``rate``."""

    def __init__(self, cfg: LabConfig, root: Path, rate: str):
        self.cfg = cfg
        self.ns = f"{cfg.prefix}src"
        self.veth = f"v{cfg.prefix}src"
        self.addr = f"{cfg.net}.0.250"
        self.root = root
        self.rate = rate
        self.tmp = Path(tempfile.mkdtemp(prefix="stage-nginx-"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{PORT}/"

    def __enter__(self) -> "SourceNetns":
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
        # A fixed MAC: the lab hosts' neighbour caches still hold the address from an earlier
        # run, and a new random MAC would leave them sending to it until they re-probe (seconds).
        sh(
            "ip",
            "link",
            "add",
            self.veth,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            self.ns,
            "address",
            "02:5c:00:00:00:fa",
        )
        sh("ip", "link", "set", self.veth, "master", self.cfg.bridge, "up")
        sh("ip", "-n", self.ns, "addr", "add", f"{self.addr}/16", "dev", "eth0")
        sh("ip", "-n", self.ns, "link", "set", "eth0", "up")
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")
        sh("tc", "qdisc", "replace", "dev", self.veth, *tbf)
        sh("ip", "netns", "exec", self.ns, "tc", "qdisc", "replace", "dev", "eth0", *tbf)
        conf = self.tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=self.tmp, addr=self.addr, port=PORT, root=self.root))
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "nginx", "-c", str(conf), "-p", str(self.tmp)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(50):
            try:
                import urllib.request

                urllib.request.urlopen(self.url + "v1/" + mf.MANIFEST_NAME, timeout=1).read()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"nginx did not answer on {self.url}: {(self.tmp / 'error.log').read_text()[-500:]}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()  # nginx's master: it stops its workers
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


def cold_read_rate(lab: LabSession, host: str, paths: list[str]) -> float:
    """Bytes/s of one sequential read of ``paths`` on ``host`` after evicting them from the cache."""
    prog = (
        "import os,sys,time\nfds=[os.open(p,os.O_RDONLY) for p in sys.argv[1:]]\n"
        "for fd in fds: os.fdatasync(fd); os.posix_fadvise(fd,0,0,4)\n"
        "t=time.monotonic();n=0\nfor fd in fds:\n while True:\n  b=os.read(fd,1<<22)\n  if not b: break\n"
        "  n+=len(b)\nprint(n/(time.monotonic()-t))"
    )
    r = lab.run(host, f"python3 -c '{prog}' {' '.join(paths)}", timeout=300, check=True)
    return float(r.stdout.strip())


def write_random_model(out: Path, size: str, shard: int = 64 << 20) -> None:
    """``size`` (e.g. ``128M``, ``1G``) of random bytes in shards of ``shard`` bytes plus a config.json."""
    total = int(float(size[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[size[-1].upper()])
    out.mkdir(parents=True)
    (out / "config.json").write_text('{"architectures": ["Bench"]}\n')
    n = -(-total // shard)
    for i in range(n):
        (out / f"model-{i + 1:05d}-of-{n:05d}.safetensors").write_bytes(os.urandom(min(shard, total - i * shard)))


def stall_node(netns: str, after: float, seconds: float, done: threading.Event) -> None:
    """``after`` seconds from now, stop the staging node program in ``netns`` (SIGSTOP) for
    ``seconds`` (then SIGCONT): a node starved of CPU while its kernel keeps receiving."""
    if done.wait(after):
        return
    ino = os.stat(f"/run/netns/{netns}").st_ino
    pids = []
    for d in os.listdir("/proc"):
        try:
            if (
                d.isdigit()
                and os.stat(f"/proc/{d}/ns/net").st_ino == ino
                and Path(f"/proc/{d}/comm").read_text().strip() == "python3"
                and program().digest.encode() in Path(f"/proc/{d}/cmdline").read_bytes()  # run from the node cache
            ):
                pids.append(int(d))
        except OSError:
            continue
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(seconds)
    for pid in pids:
        os.kill(pid, signal.SIGCONT)


def node_rows(rep: object, t0_unix: float) -> list[dict]:
    """Per host: wall time seen from here, the node's own seconds, upstream and timings;
    ``start_s``: from the run's start here to the node program's start (SSH, sudo, the
    interpreter), ``end_s``: from the run's start to the node program's end."""

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - t0_unix, 3)

    return [
        {
            "host": r.host,
            "wall_s": round(r.duration_s, 3),
            "node_s": r.data.get("seconds"),
            "start_s": since((r.data.get("timings") or {}).get("start_unix")),
            "end_s": since((r.data.get("timings") or {}).get("end_unix")),
            "upstream": r.data.get("upstream", "source"),
            "timings": r.data.get("timings"),
            "retries": r.data.get("retries"),
            "events": r.data.get("events"),
        }
        for r in rep.rows
    ]  # type: ignore[attr-defined]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", default="2,4,8", help="host counts, comma-separated")
    ap.add_argument("--rate", default="200mbit", help="tbf rate of every link (B)")
    ap.add_argument(
        "--model",
        default="small-llama",
        help="synthetic model (real bytes): tiny-qwen3, small-llama, or random:SIZE (e.g. random:128M)",
    )
    ap.add_argument("--modes", default="none,chain,tree", help="relay modes, comma-separated")
    ap.add_argument("--chunk-mib", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--cc",
        default=None,
        help="TCP congestion control for every lab host's and the source's network namespace "
        "(net.ipv4.tcp_congestion_control, e.g. cubic); default: the kernel's default",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs of each (hosts, mode)")
    ap.add_argument(
        "--stall-head",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="stop the head's node program (SIGSTOP) for SECONDS, 4 s into each run: a head "
        "starved of CPU while its kernel keeps receiving",
    )
    args = ap.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    default_cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    cfg = LabConfig.from_env()
    lab = LabSession.start(cfg, hosts=max(counts), on_event=lambda s: print(f"lab: {s}", file=sys.stderr))
    inv = load_inventory(str(lab.inventory))
    work = Path(tempfile.mkdtemp(prefix="stage-bench-"))
    os.chmod(work, 0o755)
    src_dir = work / "v1"
    if args.model.startswith("random:"):
        write_random_model(src_dir, args.model.split(":", 1)[1])
    else:
        synth.write_model(args.model, src_dir)
    man0 = mf.compute(str(src_dir), "bench", "v1", args.chunk_mib * 1024 * 1024)
    write_manifest(str(src_dir), man0)
    size = man0.total_bytes
    bps = netfaults.parse_rate(args.rate)
    bound = size * 8 / bps
    results: list[dict] = []
    model = Model("bench", "/models/bench")
    try:
        with SourceNetns(cfg, work, args.rate) as srv:
            if args.cc:
                for ns in [srv.ns] + [lab.host(h).netns for h in lab.names]:
                    sh("ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={args.cc}")
            source = parse_source(srv.url + "v1/")
            man = load_manifest(source, "bench", "v1")
            for n in counts:
                names = lab.names[:n]
                hosts = [inv.hosts[h] for h in names]
                faults.heal(cfg, None)
                for h in names:
                    netfaults.bandwidth(cfg, lab.host(h), args.rate)
                for mode in [m for m in args.modes.split(",") for _ in range(args.repeat)]:
                    for h in names:
                        lab.run(h, "rm -rf /models", timeout=60)
                    load = os.getloadavg()
                    done = threading.Event()
                    if args.stall_head:
                        threading.Thread(
                            target=stall_node, args=(lab.host(names[0]).netns, 4.0, args.stall_head, done), daemon=True
                        ).start()
                    with Fleet(hosts, fanout=n, command_timeout=1800) as fleet:
                        t0, t0_unix = time.monotonic(), time.time()
                        rep = stage_model(fleet, hosts, model, source, man, relay=mode, workers=8)
                        secs = time.monotonic() - t0
                    done.set()
                    row = {
                        "hosts": n,
                        "mode": mode,
                        "seconds": round(secs, 2),
                        "ok": rep.ok,
                        "bound_s": round(bound * (n if mode == "none" else 1), 2),
                        "ratio_to_S_over_B": round(secs / bound, 2),
                        "load_avg_before": [round(x, 2) for x in load],
                        "stall_head_s": args.stall_head,
                        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
                        "nodes": node_rows(rep, t0_unix),
                        "failures": [r.to_dict() for r in rep.rows if not r.ok],
                    }
                    print(json.dumps(row), file=sys.stderr)
                    results.append(row)
            faults.heal(cfg, None)
            h0 = lab.names[0]
            targets = [f"/models/.versions/bench/v1/{f.path}" for f in man.files]
            disk = cold_read_rate(lab, h0, targets)
            with Fleet([inv.hosts[h0]]) as fleet:
                ev = node_op(fleet, "evict", [model])[0]
                t0 = time.monotonic()
                w = node_op(fleet, "warm", [model], workers=8)[0]
                wsecs = time.monotonic() - t0
            res = w.data["models"][0]["residency"]
            warm = {
                "host": h0,
                "cold_sequential_read_Bps": round(disk),
                "warm_seconds": round(wsecs, 3),
                "warm_Bps": round(res["bytes"] / w.data["models"][0]["seconds"]),
                "resident_fraction_before": ev.data["models"][0]["residency"]["resident"] / res["bytes"],
                "resident_fraction": res["resident"] / res["bytes"],
                "load_avg": list(os.getloadavg()),
            }
            print(json.dumps(warm), file=sys.stderr)
    finally:
        faults.heal(cfg, None)
        if args.cc:
            for h in lab.names:
                subprocess.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        lab.host(h).netns,
                        "sysctl",
                        "-qw",
                        f"net.ipv4.tcp_congestion_control={default_cc}",
                    ],
                    capture_output=True,
                )
        for h in lab.names:
            lab.run(h, "rm -rf /models", timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    doc = {
        "benchmark": "staging",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "model": args.model,
        "bytes": size,
        "rate": args.rate,
        "S_over_B_s": round(bound, 2),
        "chunk_bytes": man.chunk_size,
        "runs": results,
        "warm": warm,
        "tree_fanout": 2,
        "congestion_control": args.cc or default_cc,
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "machine": f"{os.cpu_count()} CPUs, lab hosts are nspawn containers on one kernel",
    }
    out = Path(
        args.out or ROOT / "benchmarks" / "results" / f"staging-{dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H%M}.json"
    )
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    print(out)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
