"""The node program fetching from a real ranged HTTP server: verify, resume, corruption, disk full."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from clusterctl.node.stage import layout as ly, verify_model

from unit.stage.nodehelp import CHUNK, make_model, manifest_for, run_node, stage_job, start_node
from unit.stage.rangeserver import RangeServer

SIZES = {
    "config.json": 700,
    "model-00001-of-00002.safetensors": 20 * CHUNK + 123,
    "model-00002-of-00002.safetensors": 9 * CHUNK,
    "tok/tokenizer.json": 5000,
}


@pytest.fixture
def model(tmp_path):
    src = make_model(tmp_path / "src", SIZES)
    return src, manifest_for(src)


def _same_tree(a, b) -> bool:
    return all((a / rel).read_bytes() == (b / rel).read_bytes() for rel in SIZES)


def test_stages_verifies_and_switches(tmp_path, model):
    src, man = model
    target = tmp_path / "models" / "m"
    with RangeServer(str(src)) as srv:
        rc, res = run_node(stage_job(man, target, {"kind": "http", "url": srv.url}))
    assert rc == 0 and res["ok"], res
    assert res["chunks"] == len(man.chunks()) == 32 and res["bytes"] == man.total_bytes
    assert _same_tree(src, target) and os.readlink(target) == ".versions/m/v1"
    assert verify_model.check(str(target)) is None
    # Ranged reads, several files at once: every chunk asked for exactly once.
    assert sorted((p, s) for p, s, _ in srv.requests) == sorted((c.path, c.offset) for c in man.chunks())
    rc, again = run_node(stage_job(man, target, {"kind": "http", "url": srv.url}))
    assert rc == 0 and again["already_present"] and again["bytes"] == 0


def test_a_byte_corrupted_on_the_wire_is_detected_and_refetched(tmp_path, model):
    src, man = model
    bad = man.chunks()[7]
    with RangeServer(str(src)) as srv:
        srv.corrupt_once.add((bad.path, bad.offset + 100))
        rc, res = run_node(stage_job(man, tmp_path / "models" / "m", {"kind": "http", "url": srv.url}))
    assert rc == 0 and res["corrupt"] == 1 and res["retries"] >= 1
    assert [(p, s) for p, s, _ in srv.requests].count((bad.path, bad.offset)) == 2
    assert _same_tree(src, tmp_path / "models" / "m")


def test_retries_with_backoff_through_a_flaky_source(tmp_path, model):
    src, man = model
    with RangeServer(str(src)) as srv:
        srv.fail_first = 3
        rc, res = run_node(stage_job(man, tmp_path / "models" / "m", {"kind": "http", "url": srv.url}))
    assert rc == 0 and res["retries"] >= 3


def test_killed_mid_way_resumes_without_refetching_verified_chunks(tmp_path, model):
    src, man = model
    target = tmp_path / "models" / "m"
    with RangeServer(str(src)) as srv:
        srv.delay = 0.05
        proc = start_node(stage_job(man, target, {"kind": "http", "url": srv.url}, workers=2))
        deadline = time.monotonic() + 20
        while len(srv.requests) < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
        first = {(p, s) for p, s, _ in srv.requests}
        assert 8 <= len(first) < len(man.chunks())
        assert not os.path.lexists(target)  # nothing switched to a partial copy
        srv.requests.clear()
        srv.delay = 0
        rc, res = run_node(stage_job(man, target, {"kind": "http", "url": srv.url}))
    assert rc == 0, res
    second = {(p, s) for p, s, _ in srv.requests}
    # Chunks verified before the kill are reused; at most the ones in flight are read again.
    assert res["chunks_reused"] >= len(first) - 2
    assert len(first & second) <= 2
    assert len(second) == len(man.chunks()) - res["chunks_reused"]
    assert _same_tree(src, target)


def test_a_chunk_corrupted_on_disk_is_detected_and_refetched(tmp_path, model):
    src, man = model
    target = tmp_path / "models" / "m"
    lay = ly.Layout(str(target), "m")
    with RangeServer(str(src)) as srv:
        srv.stop_after = 12  # the source goes away after 12 chunks
        rc, res = run_node(stage_job(man, target, {"kind": "http", "url": srv.url}, attempts=2))
        assert rc == 1 and res["kind"] == "fetch" and "gave up after 2 attempts" in res["error"]
        fetched = sorted({(p, s) for p, s, _ in srv.requests})
        victim = next(c for c in man.chunks() if (c.path, c.offset) == fetched[0])
        with open(os.path.join(lay.partial_dir("v1"), victim.path), "r+b") as fh:
            fh.seek(victim.offset + 5)
            fh.write(b"\xff\xfe")
        srv.requests.clear()
        srv.stop_after = None
        rc, res = run_node(stage_job(man, target, {"kind": "http", "url": srv.url}))
    assert rc == 0, res
    again = {(p, s) for p, s, _ in srv.requests}
    assert (victim.path, victim.offset) in again
    assert res["chunks_reused"] == len(fetched) - 1
    assert _same_tree(src, target)


def test_secrets_stay_out_of_results(tmp_path, model):
    src, man = model
    with RangeServer(str(src)) as srv:
        srv.auth = "Bearer right-token"
        job = stage_job(
            man,
            tmp_path / "models" / "m",
            {"kind": "http", "url": srv.url.replace("http://", "http://user:hunter2@") + "?sig=abc123", "headers": {}},
            attempts=1,
        )
        rc, res = run_node(job)
        assert rc == 1 and "HTTP 401" in res["error"]
        assert "hunter2" not in str(res) and "abc123" not in str(res)
        rc, res = run_node(
            stage_job(
                man,
                tmp_path / "models" / "m",
                {"kind": "http", "url": srv.url, "headers": {"Authorization": "Bearer right-token"}},
            )
        )
        assert rc == 0 and "right-token" not in str(res)
        assert srv.seen_auth[-1] == "Bearer right-token"


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs (root only): a disk that really fills up."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_is_a_clear_error_and_the_previous_version_stays(tmp_path, small_fs):
    v1 = make_model(tmp_path / "v1", {"w.bin": 2 * CHUNK})
    v2 = make_model(tmp_path / "v2", {"w.bin": 30 * 1024 * 1024}, seed=2)
    target = small_fs / "m"
    with RangeServer(str(v1)) as srv:
        rc, res = run_node(stage_job(manifest_for(v1, version="v1"), target, {"kind": "http", "url": srv.url}))
        assert rc == 0, res
    with RangeServer(str(v2)) as srv:
        rc, res = run_node(
            stage_job(manifest_for(v2, version="v2", chunk=1024 * 1024), target, {"kind": "http", "url": srv.url})
        )
        assert srv.requests == []  # refused before reading anything
    assert rc == 1 and res["kind"] == "disk_space"
    assert "not enough space for m v2" in res["error"] and "MiB free" in res["error"]
    assert os.readlink(target) == ".versions/m/v1" and verify_model.check(str(target)) is None
    assert (target / "w.bin").read_bytes() == (v1 / "w.bin").read_bytes()
