"""A model load from storage against one from the page cache, with a cold read that is real.

This VM's disk is cached by its hypervisor: a file whose pages were dropped is read back at
361-1,866 MB/s, overlapping reads from the page cache (docs/release.md).  Here the staged
version lives on a filesystem of its own: an ext4 on a loop device whose backing file (on
the same disk as the lab hosts' ``/models``) is opened with ``O_DIRECT`` (``losetup
--direct-io=on``: no second copy in this machine's page cache), and the loop device's reads
are limited with the cgroup v1 blkio throttle (``blkio.throttle.read_bps_device`` of this
process's blkio cgroup; no cgroup v2 ``io`` controller on this kernel, no device-mapper).
So a read of an evicted page really goes to the block layer at the chosen rate, and a
resident page really does not.

Per ``--rates`` value (MB/s, 0: not throttled, the VM's disk through the loop) and
``--repeats`` times:

1. **cold**: the version's pages dropped (``stage evict``'s per-file ``fdatasync`` +
   ``POSIX_FADV_DONTNEED``; once per rate the whole machine's ``drop_caches`` instead, to
   show both give the same cold read), residency read with ``mincore``, then the simulator's
   model load (``vllm_sim.startup.Starter._load_time``: its sequential 1 MiB reads of every
   file, as it does for checkpoints of at most 256 MiB) timed;
2. **warm-up**: ``deploy --prestage``'s warm-up (the node's ``pagecache.warm``: parallel
   readers, what ``stage --warm-budget`` runs), timed: paid before the window;
3. **warm**: the same simulator load again, timed.

``--lab-host NAME``: the filesystem is mounted at that lab host's
``/models/.versions/coldwarm`` in its own mount namespace (``nsenter``), and the reads,
evictions and the warm-up run there, by the host's python3 with the node's ``pagecache``
module shipped to ``/tmp/cwnode`` (removed after), timed inside the host.

Writes ``benchmarks/results/coldwarm-<date>.json`` (temp + rename) with every row and the
1-minute load average beside each.  Needs root; removes its mount, loop device, backing
file and throttle at the end.

Example: nice -n 10 python3 benchmarks/staging/coldwarm.py --lab-host df01 --size 192 --rates 0,1000,250
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO)]

from clusterctl.lab.vllm_sim import residency  # noqa: E402
from clusterctl.lab.vllm_sim.startup import Starter  # noqa: E402
from clusterctl.node.stage import pagecache  # noqa: E402

MiB = 1024 * 1024
SHARD = 64 * MiB


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def blkio_dir() -> Path:
    """This process's blkio cgroup (v1) directory."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "blkio" in controllers.split(","):
            return Path("/sys/fs/cgroup/blkio") / path.lstrip("/")
    raise SystemExit("no blkio cgroup (v1) for this process: cannot throttle the loop device")


def throttle(cg: Path, dev: str, bps: int) -> None:
    """Limit reads of block device ``dev`` (MAJ:MIN) by this cgroup's tasks to ``bps`` (0: no limit)."""
    (cg / "blkio.throttle.read_bps_device").write_text(f"{dev} {bps}\n")


def load(paths: list[Path]) -> tuple[float, float, float]:
    """The simulator's model load over ``paths``: (wall seconds, resident share before it,
    the simulator's own modelled seconds from that residency at its 3.5/1.0 GiB/s)."""
    res = sum(residency.resident_bytes(str(p))[0] for p in paths) / sum(p.stat().st_size for p in paths)
    t0 = time.monotonic()
    modelled = Starter._load_time(None, paths)  # type: ignore[arg-type]  # uses no instance state
    return time.monotonic() - t0, res, modelled


#: Run inside a lab host by its own python3 with the node's page-cache module (shipped to
#: /tmp/cwnode/stage): ``evict``, ``read`` (the simulator's 1 MiB read loop, timed there),
#: ``warm`` (the node's ``pagecache.warm``) or ``resident`` over the paths; prints JSON.
DRIVER = """
import json, sys, time
sys.path.insert(0, "/tmp/cwnode")
from stage import pagecache
op, paths = sys.argv[1], sys.argv[2:]
res = pagecache.residency(paths)
share = res["resident"] / float(res["bytes"])
if op == "evict":
    pagecache.evict(paths)
    print(json.dumps({}))
elif op == "warm":
    print(json.dumps(pagecache.warm(paths)))
else:
    t0 = time.monotonic()
    for p in paths:
        with open(p, "rb") as fh:
            while fh.read(1 << 20):
                pass
    print(json.dumps({"seconds": time.monotonic() - t0, "resident_before": share}))
"""


class InLab:
    """The version's filesystem mounted in lab host ``host``'s own mount namespace (through
    ``nsenter`` into its systemd's namespace: a mount below the container's root directory
    made from outside is not seen inside), read there by the host's python3."""

    def __init__(self, host: str, lab_size: int) -> None:
        from clusterctl.lab.config import LabConfig
        from clusterctl.lab.session import LabSession

        self.lab = LabSession.start(LabConfig.from_env(), hosts=lab_size)  # as it is when up at that size
        self.host = host
        nspawn = (self.lab.host_dir(host) / "nspawn.pid").read_text().strip()
        self.leader = sh("pgrep", "-P", nspawn).split()[0]
        node = REPO / "clusterctl" / "node" / "stage"
        ship = "mkdir -p /tmp/cwnode/stage && : > /tmp/cwnode/stage/__init__.py"
        self.lab.run(host, ship, check=True)
        for name in ("pagecache.py", "threads.py", "driver.py"):
            text = DRIVER if name == "driver.py" else (node / name).read_text()
            self.lab.run(host, f"cat > /tmp/cwnode/stage/{name}", input=text, check=True)

    def nsenter(self, script: str) -> None:
        sh("nsenter", "-t", self.leader, "-m", "--", "sh", "-c", script)

    def mount(self, dev: str, where: str) -> None:
        major, minor = dev.split(":")
        self.nsenter(
            f"mkdir -p {where} && mknod /models/.cwloop b {major} {minor} && mount /models/.cwloop {where}; "
            "rc=$?; rm -f /models/.cwloop; exit $rc"
        )

    def umount(self, where: str) -> None:
        self.nsenter(f"umount {where} && rmdir {where}")

    def op(self, op: str, paths: list[str]) -> dict[str, Any]:
        out = self.lab.run(
            self.host, f"python3 /tmp/cwnode/stage/driver.py {op} " + " ".join(paths), check=True, timeout=300
        )
        return dict(json.loads(out.stdout))

    def close(self) -> None:
        self.lab.run(self.host, "rm -rf /tmp/cwnode")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=192, help="MiB of model (shards of 64 MiB; at most 256)")
    ap.add_argument("--rates", default="0,1024,256", help="MB/s read limits of the loop device (0: none)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lab-host", help="read in this lab host, the version mounted at its /models/.versions/coldwarm")
    ap.add_argument("--lab-size", type=int, default=1, help="with --lab-host: the lab's size (brought up if not)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (losetup, mount, blkio throttle)")
    if not 0 < args.size <= 256:
        raise SystemExit("--size: 1..256 MiB (the simulator really reads checkpoints of at most 256 MiB)")
    started = dt.datetime.now(dt.timezone.utc)
    cg = blkio_dir()
    work = Path(tempfile.mkdtemp(prefix="coldwarm-", dir="/var/tmp"))
    img, mnt = work / "disk.img", work / "mnt"
    mnt.mkdir()
    rows: list[dict[str, Any]] = []
    loop = dev = ""
    inlab: InLab | None = None
    try:
        with open(img, "wb") as f:
            f.truncate((args.size + 96) * MiB)
        loop = sh("losetup", "--direct-io=on", "--find", "--show", str(img))
        dev = sh("lsblk", "-dno", "MAJ:MIN", loop).strip()
        sh("mkfs.ext4", "-q", "-F", loop)
        sh("mount", loop, str(mnt))
        version = mnt / ".versions" / "bench" / "v2"
        version.mkdir(parents=True)
        paths = [version / "config.json"]
        paths[0].write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
        left, n = args.size * MiB, 0
        while left > 0:
            n += 1
            p = version / f"model-{n:05d}.safetensors"
            with open(p, "wb") as f:
                for _ in range(min(left, SHARD) // MiB):
                    f.write(os.urandom(MiB))
                os.fsync(f.fileno())
            paths.append(p)
            left -= SHARD
        total = sum(p.stat().st_size for p in paths)
        inside: list[str] | None = None
        if args.lab_host:
            inlab = InLab(args.lab_host, args.lab_size)
            sh("umount", str(mnt))
            inlab.mount(dev, "/models/.versions/coldwarm")
            inside = ["/models/.versions/coldwarm/" + str(p.relative_to(mnt)) for p in paths]
        for rate in [int(v) for v in args.rates.split(",")]:
            throttle(cg, dev, rate * 1000 * 1000)
            for rep in range(args.repeats):
                if rep == 0:  # the whole machine's cache, briefly, once per rate
                    subprocess.run(["sync"], check=True)
                    Path("/proc/sys/vm/drop_caches").write_text("3\n")
                    how = "drop_caches"
                else:
                    if not args.lab_host:
                        pagecache.evict([str(p) for p in paths])
                    how = "fadvise"
                if inlab is not None and inside is not None:
                    if how == "fadvise":
                        inlab.op("evict", inside)
                    c = inlab.op("read", inside)
                    cold_s, cold_res, cold_model = c["seconds"], c["resident_before"], float("nan")
                    inlab.op("evict", inside)
                    w = inlab.op("warm", inside)
                    c = inlab.op("read", inside)
                    warm_s, warm_res, warm_model = c["seconds"], c["resident_before"], float("nan")
                else:
                    cold_s, cold_res, cold_model = load(paths)
                    pagecache.evict([str(p) for p in paths])
                    w = pagecache.warm([str(p) for p in paths])
                    warm_s, warm_res, warm_model = load(paths)
                row = {
                    "rate_mb_s": rate or None,
                    "repeat": rep,
                    "evicted_by": how,
                    "bytes": total,
                    "cold": {"seconds": round(cold_s, 3), "resident_before": round(cold_res, 3)},
                    "warm_up": {"seconds": round(w["seconds"], 3), "bytes": w["bytes"]},
                    "warm": {"seconds": round(warm_s, 3), "resident_before": round(warm_res, 3)},
                    "cold_mb_s": round(total / cold_s / 1e6, 1),
                    "warm_up_mb_s": round(w["bytes"] / w["seconds"] / 1e6, 1),
                    "warm_mb_s": round(total / warm_s / 1e6, 1),
                    "cold_over_warm": round(cold_s / warm_s, 2),
                    "simulator_modelled_s": {"cold": round(cold_model, 3), "warm": round(warm_model, 3)},
                    "load_1min": round(os.getloadavg()[0], 2),
                }
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    finally:
        if dev:
            throttle(cg, dev, 0)
        if inlab is not None:
            try:
                inlab.umount("/models/.versions/coldwarm")
            except subprocess.CalledProcessError as e:
                print(f"could not unmount in {args.lab_host}: {e.stderr}", file=sys.stderr)
            inlab.close()
        if loop:
            subprocess.run(["umount", str(mnt)], check=False)
            subprocess.run(["losetup", "-d", loop], check=False)
        img.unlink(missing_ok=True)
        mnt.rmdir()
        work.rmdir()
    doc = {
        "benchmark": "coldwarm",
        "started": started.isoformat(timespec="seconds"),
        "size_mib": args.size,
        "setup": "ext4 on a loop device (backing file O_DIRECT on /dev/vda), reads throttled by cgroup v1 blkio",
        "read_in": f"lab host {args.lab_host}: its python3, the node's pagecache module, the simulator's read loop"
        if args.lab_host
        else "this machine: the simulator's Starter._load_time, the node's pagecache.warm",
        "machine": {"cpus": os.cpu_count()},
        "rows": rows,
    }
    out = Path(args.out or REPO / "benchmarks" / "results" / f"coldwarm-{started:%Y-%m-%dT%H%M}.json")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.rename(out)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
