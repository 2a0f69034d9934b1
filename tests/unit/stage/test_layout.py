"""Versioned layout: verified versions only, atomic switch, retention, and the ExecStartPre check."""

from __future__ import annotations

import os
import threading
import time

import pytest

from clusterctl.node.stage import layout as ly, manifest as mf, verify_model

from unit.stage.nodehelp import make_model


def _install(lay: ly.Layout, src_root, version: str) -> mf.Manifest:
    """Put a version in place as a fetch would: partial dir, then finalize."""
    man = mf.compute(str(src_root), lay.name, version, chunk_size=4096)
    part = lay.partial_dir(version)
    os.makedirs(part)
    for f in man.files:
        os.makedirs(os.path.dirname(os.path.join(part, f.path)), exist_ok=True)
        with open(os.path.join(part, f.path), "wb") as out, open(os.path.join(src_root, f.path), "rb") as inp:
            out.write(inp.read())
    lay.finalize(version, man)
    return man


def test_finalize_then_switch_points_the_model_path_at_the_version(tmp_path):
    src = make_model(tmp_path / "src", {"w.bin": 10_000})
    lay = ly.Layout(str(tmp_path / "models" / "m"), "m")
    man = _install(lay, src, "v1")
    assert not os.path.exists(lay.partial_dir("v1"))
    assert lay.read_marker("v1")["manifest_sha256"] == man.digest()
    assert lay.current() is None
    lay.switch("v1")
    assert os.readlink(lay.model_path) == ".versions/m/v1"  # relative: survives a moved mount
    assert (tmp_path / "models" / "m" / "w.bin").read_bytes() == (src / "w.bin").read_bytes()
    assert lay.current() == "v1"
    assert verify_model.check(lay.model_path) is None


def test_switch_refuses_an_unverified_version_and_a_real_directory(tmp_path):
    lay = ly.Layout(str(tmp_path / "models" / "m"), "m")
    os.makedirs(lay.version_dir("v1"))
    with pytest.raises(ly.LayoutError, match="not verified"):
        lay.switch("v1")
    src = make_model(tmp_path / "src", {"w.bin": 100})
    _install(lay, src, "v2")
    os.makedirs(lay.model_path)  # someone copied a model there by hand
    with pytest.raises(ly.LayoutError, match="real file or directory"):
        lay.switch("v2")
    assert os.path.isdir(lay.model_path) and not os.path.islink(lay.model_path)


def test_switch_is_atomic_for_readers(tmp_path):
    """A reader resolving the model path while versions switch always finds a complete version."""
    lay = ly.Layout(str(tmp_path / "models" / "m"), "m")
    for v in ("v1", "v2"):
        _install(lay, make_model(tmp_path / v, {"w.bin": 1000}, seed=len(v)), v)
    lay.switch("v1")
    stop = threading.Event()
    misses: list[str] = []
    seen: set[str] = set()
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            try:
                with open(os.path.join(lay.model_path, ly.MARKER_NAME)) as fh:
                    seen.add(fh.read())
                reads += 1
            except OSError as e:
                misses.append(str(e))

    t = threading.Thread(target=reader)
    t.start()
    # Count switches and reads, not seconds: a loaded machine does fewer of both in a given time, and the
    # race is exercised only once many reads happened while versions switched under them (both seen).
    deadline = time.monotonic() + 120
    n = 0
    while (n < 200 or reads < 200 or len(seen) < 2) and time.monotonic() < deadline:
        lay.switch("v2" if n % 2 == 0 else "v1")
        n += 1
    stop.set()
    t.join()
    assert misses == []
    assert n >= 200 and reads >= 200 and len(seen) == 2, (n, reads, len(seen))


def test_prune_keeps_the_newest_and_never_the_one_in_use(tmp_path):
    lay = ly.Layout(str(tmp_path / "models" / "m"), "m")
    for i, v in enumerate(("v1", "v2", "v3", "v4")):
        _install(lay, make_model(tmp_path / v, {"w.bin": 100}, seed=i), v)
        t = 1_000_000 + i * 10  # marker times order the versions
        os.utime(os.path.join(lay.version_dir(v), ly.MARKER_NAME), (t, t))
    lay.switch("v1")  # the oldest is in use (a rollback)
    removed = lay.prune(keep=2, protect=("v4",))
    assert removed == ["v2", "v3"]
    assert lay.list_versions() == ["v1", "v4"]
    assert lay.current() == "v1" and verify_model.check(lay.model_path) is None
    assert lay.prune(keep=1, protect=("v4",)) == []  # v1 in use, v4 protected


def test_verify_model_refuses_unverified_paths(tmp_path, capsys):
    lay = ly.Layout(str(tmp_path / "models" / "m"), "m")
    os.makedirs(tmp_path / "models" / "plain")
    assert "not a clusterctl-staged symlink" in verify_model.check(str(tmp_path / "models" / "plain"))
    os.makedirs(lay.partial_dir("v1"))
    os.symlink(os.path.join(ly.VERSIONS_DIR, "m", ly.PARTIAL_PREFIX + "v1"), lay.model_path)
    assert "not verified" in verify_model.check(lay.model_path)
    os.unlink(lay.model_path)
    src = make_model(tmp_path / "src", {"w.bin": 5000})
    _install(lay, src, "v2")
    lay.switch("v2")
    assert verify_model.main([lay.model_path]) == 0
    w = os.path.join(lay.version_dir("v2"), "w.bin")
    with open(w, "r+b") as fh:  # same size, one byte changed: only --deep sees it
        fh.write(b"\0")
    assert verify_model.check(lay.model_path) is None
    assert "does not match its sha256" in verify_model.check(lay.model_path, deep=True)
    with open(w, "ab") as fh:
        fh.write(b"more")
    assert verify_model.main([lay.model_path]) == 1
    assert "w.bin has 5004 bytes, the manifest says 5000" in capsys.readouterr().err
    with open(os.path.join(lay.version_dir("v2"), mf.MANIFEST_NAME), "a") as fh:
        fh.write(" ")
    assert "marker does not match the manifest" in verify_model.check(lay.model_path)
