"""The larger fuzz campaign over every input kind; writes benchmarks/results/fuzz-<date>.json.

    python3 benchmarks/fuzz/campaign.py [--per-kind 400] [--batch 50] [--seed 21] [--kinds inventory,...]
                                        [--mem-mib 1024] [--case-s 15] [--out FILE]

The same generators and capped child processes as tests/unit/test_fuzz_inputs.py
(tests/support/fuzz.py): each batch of cases runs in one child under RLIMIT_AS
(--mem-mib), RLIMIT_CPU, RLIMIT_FSIZE and a per-case alarm (--case-s), so a
regression is counted, never a machine taken down.  Per kind: inputs tried,
tracebacks, hangs, memory failures (MemoryError under the cap), the children's
peak RSS, and the first failures for a bug report.  Figures go to
docs/hardening.md.  ``CLUSTERCTL_FUZZ_CODE=/path/to/other/checkout`` runs the
same cases against another version of clusterctl (the "before" figures).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support import fuzz  # noqa: E402

KINDS = ("inventory", "ssh_config", "ansible", "history", "bundle", "sse")


def _cases(kind: str, rng: random.Random, work: Path, n: int, ctx: dict) -> list[fuzz.Case]:
    if kind in fuzz.GENERATORS:
        return fuzz.GENERATORS[kind](rng, work, n)
    if kind == "history":
        return fuzz.gen_history(rng, work, n, ctx["bundle"])
    if kind == "bundle":
        return fuzz.gen_bundles(rng, work, n)
    return fuzz.gen_sse(rng, work, n, ctx["sse_port"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-kind", type=int, default=400)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--mem-mib", type=int, default=1024)
    ap.add_argument("--case-s", type=float, default=15.0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    kinds = [k for k in a.kinds.split(",") if k]
    totals: dict[str, fuzz.Tally] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="clusterctl-fuzz-") as tmp:
        root = Path(tmp)
        rng_bodies = random.Random(a.seed)
        bodies = fuzz.sse_bodies(rng_bodies, a.per_kind)
        srv, port = fuzz.sse_server(bodies)
        ctx = {"bundle": fuzz.small_bundle(root / "bundle"), "sse_port": port}
        try:
            for kind in kinds:
                rng = random.Random(f"{a.seed}-{kind}")
                total = fuzz.Tally(kind)
                for b in range(0, a.per_kind, a.batch):
                    work = root / f"{kind}-{b}"
                    work.mkdir()
                    cases = _cases(kind, rng, work, min(a.batch, a.per_kind - b), ctx)
                    tally = fuzz.run_cases(kind, cases, work, mem_mib=a.mem_mib, case_s=a.case_s)
                    total.add(tally)
                    print(
                        f"{kind}: {total.inputs} inputs, {total.tracebacks} tracebacks, {total.hangs} hangs, "
                        f"{total.memory} memory, peak {total.peak_rss_mib:.0f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )
                totals[kind] = total
        finally:
            srv.shutdown()
    doc = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "seed": a.seed,
        "caps": {"mem_mib": a.mem_mib, "case_s": a.case_s},
        "seconds": round(time.monotonic() - t0, 1),
        "kinds": {k: t.to_json() for k, t in totals.items()},
    }
    out = a.out or ROOT / "benchmarks" / "results" / f"fuzz-{datetime.now(timezone.utc):%Y-%m-%d}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print("| kind | inputs | tracebacks | hangs | memory | peak RSS MiB |\n|---|---|---|---|---|---|")
    for k, t in totals.items():
        print(f"| {k} | {t.inputs} | {t.tracebacks} | {t.hangs} | {t.memory} | {t.peak_rss_mib:.0f} |")
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(t.failed == 0 for t in totals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
