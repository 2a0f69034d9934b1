"""Manifests: per-file and per-chunk sha256, validation of what a node is told to write."""

from __future__ import annotations

import hashlib
import json

import pytest

from clusterctl.node.stage import manifest as mf

from unit.stage.nodehelp import make_model


def test_compute_hashes_every_chunk_and_file(tmp_path):
    src = make_model(tmp_path / "m", {"a.bin": 150_000, "d/b.bin": 10, "empty": 0})
    (tmp_path / "m" / mf.MANIFEST_NAME).write_text("{}")  # ours: never part of the model
    man = mf.compute(str(src), "m", "v1", chunk_size=65536)
    assert [f.path for f in man.files] == ["a.bin", "d/b.bin", "empty"]
    data = (src / "a.bin").read_bytes()
    a = man.files[0]
    assert a.size == 150_000 and a.sha256 == hashlib.sha256(data).hexdigest()
    assert list(a.chunks) == [hashlib.sha256(data[i : i + 65536]).hexdigest() for i in (0, 65536, 131072)]
    chunks = man.chunks()
    assert [(c.path, c.offset, c.length) for c in chunks] == [
        ("a.bin", 0, 65536),
        ("a.bin", 65536, 65536),
        ("a.bin", 131072, 150_000 - 131072),
        ("d/b.bin", 0, 10),
    ]
    assert [c.index for c in chunks] == [0, 1, 2, 3]
    assert man.total_bytes == 150_010


def test_round_trip_and_digest_identify_the_content(tmp_path):
    src = make_model(tmp_path / "m", {"a.bin": 70_000})
    man = mf.compute(str(src), "m", "v1", chunk_size=65536)
    again = mf.loads(man.to_json())
    assert again == man and again.digest() == man.digest()
    (src / "a.bin").write_bytes(b"x" * 70_000)
    assert mf.compute(str(src), "m", "v1", chunk_size=65536).digest() != man.digest()


def test_default_version_is_the_content_id(tmp_path):
    src = make_model(tmp_path / "m", {"a.bin": 1000})
    a = mf.compute(str(src), "m", None, chunk_size=4096)
    b = mf.compute(str(src), "other", None, chunk_size=4096)
    assert a.version == b.version and len(a.version) == 12


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "a/../../x", "a//b", ".clusterctl-verified", ""])
def test_paths_leaving_the_model_directory_are_refused(tmp_path, path):
    src = make_model(tmp_path / "m", {"a.bin": 10})
    d = mf.compute(str(src), "m", "v1", chunk_size=4096).to_dict()
    d["files"][0]["path"] = path
    with pytest.raises(mf.ManifestError, match=r"where\.json: files\[0\]"):
        mf.from_dict(d, "where.json")


def test_wrong_chunk_count_and_bad_json_name_the_place(tmp_path):
    src = make_model(tmp_path / "m", {"a.bin": 10_000})
    d = mf.compute(str(src), "m", "v1", chunk_size=4096).to_dict()
    d["files"][0]["chunks"] = d["files"][0]["chunks"][:1]
    with pytest.raises(mf.ManifestError, match=r"x\.json: files\[0\] \(a\.bin\): 1 chunk digests for 10000 bytes"):
        mf.from_dict(d, "x.json")
    with pytest.raises(mf.ManifestError, match="x.json: not JSON"):
        mf.loads("{", "x.json")
    d = json.loads(json.dumps(d))
    d["format"] = 9
    with pytest.raises(mf.ManifestError, match="unsupported format 9"):
        mf.from_dict(d, "x.json")
