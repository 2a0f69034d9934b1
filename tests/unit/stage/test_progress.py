"""Live staging progress: node-side stderr markers, parsed per host on the control side."""

from __future__ import annotations

import json
import subprocess
import sys

from clusterctl.stage import bundle
from clusterctl.stage.run import PROGRESS_MARK, ProgressLines
from unit.stage.nodehelp import make_model, manifest_for, stage_job
from unit.stage.rangeserver import RangeServer


def test_progress_lines_split_across_chunks_and_hosts_are_reassembled() -> None:
    seen: list[tuple[str, int, int]] = []
    parse = ProgressLines(lambda h, d, t: seen.append((h, d, t)))
    line = (PROGRESS_MARK + json.dumps({"done": 10, "total": 40}) + "\n").encode()
    parse("a", line[:7])
    parse("b", b"some warning\n" + line)
    parse("a", line[7:] + line.replace(b"10", b"40"))
    parse("a", (PROGRESS_MARK + "not json\n").encode())
    assert seen == [("b", 10, 40), ("a", 10, 40), ("a", 40, 40)]


def test_the_node_program_reports_verified_bytes_while_it_stages(tmp_path) -> None:
    src = make_model(tmp_path / "src", {"a.bin": 400_000, "b.bin": 300_000})
    man = manifest_for(src)
    with RangeServer(str(src)) as srv:
        job = stage_job(man, tmp_path / "models" / "m", {"kind": "http", "url": srv.url}, progress=0.01)
        proc = subprocess.run(
            [sys.executable, "-I", "-B", "-c", bundle.bootstrap()],
            input=json.dumps(job).encode() + b"\n",
            capture_output=True,
            timeout=60,
        )
    assert proc.returncode == 0, proc.stderr
    seen: list[tuple[str, int, int]] = []
    ProgressLines(lambda h, d, t: seen.append((h, d, t)))("n1", proc.stderr)
    assert seen and seen[-1] == ("n1", man.total_bytes, man.total_bytes)
    assert [d for _, d, _ in seen] == sorted(d for _, d, _ in seen)  # never goes back
    assert json.loads(proc.stdout.decode().strip().splitlines()[-1])["ok"]
