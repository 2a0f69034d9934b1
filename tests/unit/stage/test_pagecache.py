"""Page cache: mincore residency, per-file eviction, parallel warming (real files, real kernel).

Needs tmp_path on a disk filesystem (tmpfs pages cannot be evicted).
"""

from __future__ import annotations

from clusterctl.node.stage import pagecache

from unit.stage.nodehelp import make_model

MIB = 1024 * 1024


def test_evict_warm_and_measure(tmp_path):
    root = make_model(tmp_path / "m", {"a.bin": 3 * MIB, "b.bin": MIB + 5})
    files = [str(root / "a.bin"), str(root / "b.bin")]
    pagecache.evict(files)
    cold = pagecache.residency(files)
    assert cold == {"resident": 0, "bytes": 4 * MIB + 5}
    out = pagecache.warm(files, workers=4, slice_bytes=MIB)
    assert out["bytes"] == cold["bytes"]
    assert pagecache.residency(files)["resident"] == cold["bytes"]
    pagecache.evict([files[0]])  # one file out, the other stays
    assert pagecache.residency(files)["resident"] == MIB + 5


def test_partial_read_gives_partial_residency(tmp_path):
    root = make_model(tmp_path / "m", {"a.bin": 8 * MIB})
    path = str(root / "a.bin")
    pagecache.evict([path])
    with open(path, "rb") as fh:
        fh.read(MIB)
    resident, size = pagecache.file_residency(path)
    assert MIB <= resident < size  # read-ahead may add a little, never the whole file


def test_a_warm_budget_reads_only_the_first_bytes(tmp_path):
    root = make_model(tmp_path / "m", {"a.bin": 3 * MIB, "b.bin": 2 * MIB})
    files = [str(root / "a.bin"), str(root / "b.bin")]
    pagecache.evict(files)
    out = pagecache.warm(files, workers=4, slice_bytes=MIB, budget=3 * MIB + MIB // 2)
    assert out["bytes"] == 3 * MIB + MIB // 2 and out["left_cold"] == MIB + MIB // 2
    assert pagecache.file_residency(files[0]) == (3 * MIB, 3 * MIB)
    resident_b, _ = pagecache.file_residency(files[1])
    assert MIB // 2 <= resident_b < 2 * MIB  # read-ahead may add a little past the budget, never the whole file
