"""Hostile inputs of every kind through the real CLI, each batch under memory, CPU and time caps (issue 21).

A few cases per kind keep the unit tier cheap; ``benchmarks/fuzz/campaign.py``
runs thousands with the same generators (figures in docs/hardening.md).  A
regression fails here as a counted traceback, hang or MemoryError, never by
taking the machine down: the child has ``RLIMIT_AS`` and a per-case alarm.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from support import fuzz

CAPS = {"mem_mib": 1024, "case_s": 15.0}


def _check(tally: fuzz.Tally) -> None:
    assert tally.inputs > 0
    assert (tally.tracebacks, tally.hangs, tally.memory) == (0, 0, 0), tally.failures[:3]
    assert tally.peak_rss_mib < CAPS["mem_mib"]


@pytest.mark.parametrize("kind", sorted(fuzz.GENERATORS))
def test_config_inputs_never_traceback_hang_or_exhaust_memory(kind: str, tmp_path: Path) -> None:
    cases = fuzz.GENERATORS[kind](random.Random(21), tmp_path, 12)
    _check(fuzz.run_cases(kind, cases, tmp_path, **CAPS))


def test_damaged_history_databases_are_clear_errors(tmp_path: Path) -> None:
    bundle = fuzz.small_bundle(tmp_path / "b")
    _check(fuzz.run_cases("history", fuzz.gen_history(random.Random(21), tmp_path, 12, bundle), tmp_path, **CAPS))


def test_match_exec_never_runs_during_validate(tmp_path: Path) -> None:
    cases = [
        c
        for c in fuzz.gen_ssh_configs(random.Random(5), tmp_path, 40)
        if "Match exec" in Path(c.env["CLUSTERCTL_SSH_CONFIG"]).read_text()
    ]
    assert cases
    _check(fuzz.run_cases("ssh_config", cases, tmp_path, **CAPS))
    assert not list(tmp_path.glob("match-exec-ran-*"))


def test_an_ansible_fifo_and_a_range_bomb_are_refused_within_the_caps(tmp_path: Path) -> None:
    """Without the fixes the first read blocks forever and the second expands 10^8 names (counted, not stuck)."""
    import os

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "bomb.ini").write_text("web[0:9][0:9][0:9][0:9][0:9][0:9][0:9][0:9]\n")
    t = fuzz.run_cases(
        "self",
        [fuzz.Case(["inventory", "import-ansible", str(tmp_path / name)]) for name in ("fifo", "bomb.ini")],
        tmp_path,
        **CAPS,
    )
    assert (t.ok, t.memory, t.hangs, t.tracebacks) == (2, 0, 0, 0), t.failures
    assert "not a regular file" in t.results[0]["err"] and "more than 100000 names" in t.results[1]["err"]


def test_junk_sse_streams_never_traceback_or_hang_bench(tmp_path: Path) -> None:
    """Bodies of broken JSON, huge lines, numbers where text belongs, 1e308 token counts (bench's SSE reader)."""
    srv, port = fuzz.sse_server(fuzz.sse_bodies(random.Random(21), 12))
    try:
        _check(fuzz.run_cases("sse", fuzz.gen_sse(random.Random(21), tmp_path, 12, port), tmp_path, **CAPS))
    finally:
        srv.shutdown()


def test_junk_bundles_never_traceback_hang_or_exhaust_memory(tmp_path: Path) -> None:
    """``doctor --from`` on directory and tar.gz bundles with junk in every file (reading limits: docs/bundles.md)."""
    _check(fuzz.run_cases("bundle", fuzz.gen_bundles(random.Random(21), tmp_path, 6), tmp_path, **CAPS))
