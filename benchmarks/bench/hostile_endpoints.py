"""``bench`` and ``drift`` against every hostile server mode: how long each run lasts and its peak memory.

    python3 benchmarks/bench/hostile_endpoints.py [--timeout 2]

Each CLI run is a child process under a 1 GiB address-space cap; its peak RSS
comes from ``wait4``.  Writes ``benchmarks/results/bench-hostile-<time>.json``:
per (command, mode), the exit status, seconds, peak RSS (MiB) and the first
reason reported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(Path(__file__).parent))

from loadgen_accuracy import write_result  # noqa: E402
from support.hostile_http import MODES, HostileServer  # noqa: E402

CODE = "import sys; from clusterctl.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def run(args: list[str], env: dict[str, str]) -> dict[str, object]:
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-c", CODE, *args], stdout=out, stderr=err, preexec_fn=_cap, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        took = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        text = out.read().decode(errors="replace") + err.read().decode(errors="replace")
    reason = next(
        (
            line.strip()
            for line in text.splitlines()
            if any(k in line for k in ("Error", "within", "over", "not a", "usage."))
        ),
        "",
    )
    return {
        "exit": p.returncode,
        "seconds": round(took, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "traceback": "Traceback" in text,
        "reason": reason[:160],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", default="2")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_STATE_HOME=state)
        for mode in MODES:
            with HostileServer(mode) as srv:
                for name, args in (
                    (
                        "bench",
                        [
                            "bench",
                            srv.url,
                            "-c",
                            "2",
                            "-n",
                            "2",
                            "--input-len",
                            "4",
                            "--output-len",
                            "3",
                            "--timeout",
                            a.timeout,
                            "--no-tokenizer",
                            "--json",
                        ],
                    ),
                    ("drift baseline", ["drift", "baseline", srv.url, "--name", "b", "--timeout", a.timeout]),
                    (
                        "drift leak",
                        ["drift", "leak", srv.url, "--sessions", "2", "--requests", "1", "--timeout", a.timeout],
                    ),
                ):
                    row = {"mode": mode, "command": name, **run(args, env)}
                    rows.append(row)
                    print(json.dumps(row))
    print(
        write_result(
            "bench-hostile",
            {
                "timeout_s": float(a.timeout),
                "address_space_cap_mib": 1024,
                "runs": rows,
                "loadavg_1m": os.getloadavg()[0],
            },
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
