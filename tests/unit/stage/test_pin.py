"""Keeping a model resident: the pin-model program (mlock within a budget) and budget parsing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from clusterctl.node.stage import pin_model
from clusterctl.stage.plan import StageError
from clusterctl.stage.run import parse_size
from unit.stage.nodehelp import make_model, manifest_for, run_node, stage_job
from unit.stage.rangeserver import RangeServer

SIZES = {"a.bin": 300_000, "b.bin": 200_000, "c.bin": 100_000}


def test_sizes_parse_with_binary_units_and_bad_ones_name_the_flag() -> None:
    assert parse_size("16G") == 16 << 30 and parse_size("512MiB") == 512 << 20
    assert parse_size("1.5T") == int(1.5 * (1 << 40)) and parse_size("4096") == 4096
    with pytest.raises(StageError, match=r"--budget: 'lots' is not a size"):
        parse_size("lots")
    with pytest.raises(StageError, match="must be more than zero"):
        parse_size("0G")


@pytest.fixture
def staged(tmp_path):
    src = make_model(tmp_path / "src", SIZES)
    man = manifest_for(src)
    with RangeServer(str(src)) as srv:
        rc, res = run_node(stage_job(man, tmp_path / "models" / "m", {"kind": "http", "url": srv.url}))
    assert rc == 0, res
    return tmp_path / "models" / "m"


def test_the_plan_takes_files_in_manifest_order_up_to_the_budget(staged) -> None:
    target, ranges = pin_model.plan(str(staged), 350_000)
    assert target == os.path.realpath(staged)
    assert [(os.path.basename(p), n) for p, n in ranges] == [("a.bin", 300_000), ("b.bin", 50_000)]
    assert sum(n for _, n in pin_model.plan(str(staged), 10**9)[1]) == sum(SIZES.values())


def test_pin_model_locks_the_budget_and_reports_it_until_terminated(staged, tmp_path) -> None:
    state = tmp_path / "pin.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            pin_model.__file__,
            str(staged),
            "--budget",
            "350000",
            "--state",
            str(state),
            "--interval",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not state.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        got = json.loads(state.read_text())
        assert got["bytes"] == 350_000 and got["version_dir"] == os.path.realpath(staged)
        # As root (CI, lab) mlock works; elsewhere the fallback re-reads and says why.
        assert got["mode"] == "mlock" if os.geteuid() == 0 else got["mode"] in ("mlock", "refresh")
        assert got["locked"] == (350_000 if got["mode"] == "mlock" else 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_an_unstaged_path_is_refused_with_one_line(tmp_path) -> None:
    p = subprocess.run(
        [sys.executable, pin_model.__file__, str(tmp_path / "nope"), "--budget", "1"], capture_output=True, text=True
    )
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "is not a staged model" in p.stderr
