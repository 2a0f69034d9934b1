"""Peak memory and time of `clusterctl doctor --from` on the hostile bundles of issue 21.

Builds each input in a scratch directory, runs ``clusterctl doctor --from`` on it
as a fresh process and records its peak resident memory (``getrusage`` of the
child), wall seconds and exit code. The inputs are the issue's own: a gzip bomb
(a 1.5 GB kernel log inside a ~10 MB .tar.gz), a 300 MB single-line kernel log
and a 100 MB Prometheus label in a directory bundle. Before the limits
(clusterctl/diagnose/inputs.py) these took 3.1 GB, 1.7 GB and 16.4 GB.
Writes ``benchmarks/results/hostile-bundles-<date>.json``.

Example: python3 benchmarks/doctor/hostile_bundles.py
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FACTS = json.dumps({"schema": 1, "gpus": {"available": False, "reason": "no driver"}, "nics": []}).encode()
MIB = 2**20


def bomb(path: Path, size: int) -> None:
    """A .tar.gz with hosts/h1/kernel.log of ``size`` bytes of ordinary kernel lines, streamed."""
    line = b"[  1.0] ordinary kernel line\n"
    chunk = line * (MIB // len(line))
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as gz:
        fi = tarfile.TarInfo("b/hosts/h1/facts.json")
        fi.size = len(FACTS)
        gz.write(fi.tobuf() + FACTS + b"\0" * (-len(FACTS) % 512))
        info = tarfile.TarInfo("b/hosts/h1/kernel.log")
        info.size = size
        gz.write(info.tobuf())
        left = size
        while left > 0:
            piece = chunk[:left]
            gz.write(piece)
            left -= len(piece)
        gz.write(b"\0" * (-size % 512) + b"\0" * 1024)


def long_lines(root: Path, line_mib: int, label_mib: int) -> None:
    h = root / "hosts" / "h1"
    (h / "metrics").mkdir(parents=True)
    (h / "facts.json").write_bytes(FACTS)
    with open(h / "kernel.log", "wb") as f:
        for _ in range(line_mib):
            f.write(b"x" * MIB)
    with open(h / "metrics" / "inst.1.prom", "wb") as f:
        f.write(b'vllm:num_requests_running{model_name="')
        for _ in range(label_mib):
            f.write(b"a" * MIB)
        f.write(b'"} 1\n')


def run(src: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "clusterctl.cli.main", "doctor", "--from", str(src), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "rc": p.returncode,
        "wall_s": round(time.monotonic() - t0, 2),
        "peak_rss_mib": round(max(peak, before) / 1024, 1),
        "traceback": "Traceback" in p.stderr,
    }


def main() -> None:
    out: dict[str, object] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "load_1m": os.getloadavg()[0],
        "cases": {},
    }
    cases = out["cases"]
    assert isinstance(cases, dict)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        # one child at a time: ru_maxrss of RUSAGE_CHILDREN is the largest child so far, so run the
        # smaller case first
        long_lines(t / "lines", 300, 100)
        cases["300 MiB single line + 100 MiB label (directory)"] = run(t / "lines")
        bomb(t / "bomb.tar.gz", 1500 * MIB)
        cases["gzip bomb: 1.5 GiB kernel.log in a .tar.gz"] = {
            "compressed_mib": round((t / "bomb.tar.gz").stat().st_size / MIB, 1),
            **run(t / "bomb.tar.gz"),
        }
    dest = REPO / "benchmarks" / "results" / f"hostile-bundles-{dt.datetime.now():%Y-%m-%dT%H%M}.json"
    dest.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    print(f"written to {dest}")


if __name__ == "__main__":
    main()
