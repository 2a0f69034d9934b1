"""Staging benchmark: naive (every host pulls) against the relay chain, on tbf-shaped lab links.

nginx (Debian's nginx-light, which answers range requests) runs in a network
namespace of its own (``<prefix>src``, ``NET.0.250`` on the lab bridge) and
serves a real-byte synthetic model of S bytes.  Every link is limited to the
same rate B with tbf in both directions: the server's veth and each lab
host's (``clusterctl.lab.netfaults.bandwidth``).  For each host count N
(default 2, 4, 8), and for each mode, the model is staged afresh
(``clusterctl.stage.run.stage_model`` over real SSH) and timed:

* ``none``: all N hosts read the server at once; bound N x S / B;
* ``chain``: the server is read once, hosts relay; bound about S / B.

Then on one host: the cold sequential read rate of the staged file
(``posix_fadvise DONTNEED`` first) and ``stage warm`` from cold (parallel
readers) with the resident fraction after it.

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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clusterctl.fleet import Fleet
from clusterctl.inventory.loader import load_inventory
from clusterctl.inventory.model import Model
from clusterctl.lab import faults, netfaults
from clusterctl.lab.config import LabConfig
from clusterctl.lab.session import LabSession
from clusterctl.lab.vllm_sim import synth
from clusterctl.stage import manifest as mf
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
        tbf = ["root", "tbf", "rate", f"{bps}bit", "burst", str(netfaults.tbf_burst_bytes(bps)),
               "latency", netfaults.TBF_LATENCY]
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        sh("ip", "link", "set", self.veth, "master", self.cfg.bridge, "up")
        sh("ip", "-n", self.ns, "addr", "add", f"{self.addr}/16", "dev", "eth0")
        sh("ip", "-n", self.ns, "link", "set", "eth0", "up")
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")
        sh("tc", "qdisc", "replace", "dev", self.veth, *tbf)
        sh("ip", "netns", "exec", self.ns, "tc", "qdisc", "replace", "dev", "eth0", *tbf)
        conf = self.tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=self.tmp, addr=self.addr, port=PORT, root=self.root))
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, "nginx", "-c", str(conf), "-p", str(self.tmp)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


def cold_read_rate(lab: LabSession, host: str, path: str) -> float:
    """Bytes/s of one sequential read of ``path`` on ``host`` after evicting it from the cache."""
    prog = ("import os,sys,time;p=sys.argv[1];fd=os.open(p,os.O_RDONLY);os.posix_fadvise(fd,0,0,4);"
            "t=time.monotonic();n=0\nwhile True:\n b=os.read(fd,1<<22)\n if not b: break\n n+=len(b)\n"
            "print(n/(time.monotonic()-t))")
    r = lab.run(host, f"python3 -c '{prog}' {path}", timeout=300, check=True)
    return float(r.stdout.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", default="2,4,8", help="host counts, comma-separated")
    ap.add_argument("--rate", default="200mbit", help="tbf rate of every link (B)")
    ap.add_argument("--model", default="small-llama", help="synthetic model (real bytes): tiny-qwen3, small-llama")
    ap.add_argument("--chunk-mib", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    cfg = LabConfig.from_env()
    lab = LabSession.start(cfg, hosts=max(counts), on_event=lambda s: print(f"lab: {s}", file=sys.stderr))
    inv = load_inventory(str(lab.inventory))
    work = Path(tempfile.mkdtemp(prefix="stage-bench-"))
    os.chmod(work, 0o755)
    src_dir = work / "v1"
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
            source = parse_source(srv.url + "v1/")
            man = load_manifest(source, "bench", "v1")
            for n in counts:
                names = lab.names[:n]
                hosts = [inv.hosts[h] for h in names]
                faults.heal(cfg, None)
                for h in names:
                    netfaults.bandwidth(cfg, lab.host(h), args.rate)
                for mode in ("none", "chain"):
                    for h in names:
                        lab.run(h, "rm -rf /models", timeout=60)
                    with Fleet(hosts, fanout=n, command_timeout=1800) as fleet:
                        t0 = time.monotonic()
                        rep = stage_model(fleet, hosts, model, source, man, relay=mode, workers=8)
                        secs = time.monotonic() - t0
                    row = {"hosts": n, "mode": mode, "seconds": round(secs, 2), "ok": rep.ok,
                           "bound_s": round(bound * (n if mode == "none" else 1), 2),
                           "ratio_to_S_over_B": round(secs / bound, 2),
                           "failures": [r.to_dict() for r in rep.rows if not r.ok]}
                    print(json.dumps(row), file=sys.stderr)
                    results.append(row)
            faults.heal(cfg, None)
            h0 = lab.names[0]
            target = f"/models/.versions/bench/v1/{man.files[-1].path}"
            disk = cold_read_rate(lab, h0, target)
            with Fleet([inv.hosts[h0]]) as fleet:
                node_op(fleet, "evict", [model])
                t0 = time.monotonic()
                w = node_op(fleet, "warm", [model], workers=8)[0]
                wsecs = time.monotonic() - t0
            res = w.data["models"][0]["residency"]
            warm = {"host": h0, "cold_sequential_read_Bps": round(disk), "warm_seconds": round(wsecs, 3),
                    "warm_Bps": round(res["bytes"] / w.data["models"][0]["seconds"]),
                    "resident_fraction": res["resident"] / res["bytes"]}
            print(json.dumps(warm), file=sys.stderr)
    finally:
        faults.heal(cfg, None)
        for h in lab.names:
            lab.run(h, "rm -rf /models", timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    doc = {"benchmark": "staging", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "model": args.model, "bytes": size, "rate": args.rate, "S_over_B_s": round(bound, 2),
           "chunk_bytes": man.chunk_size, "runs": results, "warm": warm,
           "machine": f"{os.cpu_count()} CPUs, lab hosts are nspawn containers on one kernel"}
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"staging-{dt.date.today():%Y-%m-%d}.json")
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    print(out)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
