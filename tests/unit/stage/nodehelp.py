"""Helpers: run the real node program (the bundle, as a node's python3 runs it) locally."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from clusterctl.stage import bundle
from clusterctl.node.stage import manifest as mf

CHUNK = 64 * 1024


def make_model(root: Path, sizes: dict[str, int], seed: int = 1) -> Path:
    """Files of pseudo-random bytes (deterministic per seed) under ``root``."""
    import random

    rng = random.Random(seed)
    for rel, size in sizes.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(size))
    return root


def manifest_for(root: Path, name: str = "m", version: str | None = "v1", chunk: int = CHUNK) -> mf.Manifest:
    return mf.compute(str(root), name, version, chunk)


def run_node(
    job: dict, argv: list[str] | None = None, extra_stdin: bytes = b"", timeout: float = 60
) -> tuple[int, dict]:
    """Run the bundle with ``job`` on stdin; return (exit status, the JSON result)."""
    proc = subprocess.run(
        [sys.executable, "-I", "-B", "-c", bundle.bootstrap(), *(argv or [])],
        input=json.dumps(job).encode() + b"\n" + extra_stdin,
        capture_output=True,
        timeout=timeout,
        env={"PATH": os.environ.get("PATH", "")},
    )
    lines = proc.stdout.decode().strip().splitlines()
    assert lines, f"no result; stderr: {proc.stderr.decode()[-2000:]}"
    return proc.returncode, json.loads(lines[-1])


def start_node(job: dict, argv: list[str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-B", "-c", bundle.bootstrap(), *(argv or [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(job).encode() + b"\n")
    proc.stdin.close()
    proc.stdin = None  # communicate() must not flush it again
    return proc


def result_of(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, dict]:
    out, err = proc.communicate(timeout=timeout)
    lines = out.decode().strip().splitlines()
    assert lines, f"no result; stderr: {err.decode()[-2000:]}"
    return proc.returncode, json.loads(lines[-1])


def stage_job(man: mf.Manifest, model_path: Path, source: dict | None, **kw) -> dict:
    job = {
        "op": "stage",
        "manifest": man.to_dict(),
        "model_path": str(model_path),
        "source": source,
        "workers": 4,
        "keep": 2,
    }
    job.update(kw)
    return job
