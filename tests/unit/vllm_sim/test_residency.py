"""Page-cache residency (mincore) and its effect on the simulated loading time."""

from __future__ import annotations

import os
import re
from pathlib import Path

from clusterctl.lab.vllm_sim import residency, synth

from .conftest import READY


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_mincore_sees_what_was_read(tmp_path: Path) -> None:
    synth.write_model("small", tmp_path / "m")
    f = tmp_path / "m/model.safetensors"
    evict(f)
    size = f.stat().st_size
    assert residency.resident_bytes(str(f)) == (0, size)
    with open(f, "rb") as fh:
        fh.read(4 << 20)
    resident, _ = residency.resident_bytes(str(f))
    assert 4 << 20 <= resident < size
    f.read_bytes()
    assert residency.resident_bytes(str(f)) == (size, size)


def test_sparse_holes_are_not_resident(tmp_path: Path) -> None:
    synth.write_model("qwen3-8b", tmp_path / "m", sparse=True)
    for f in (tmp_path / "m").glob("*.safetensors"):
        evict(f)
        resident, size = residency.resident_bytes(str(f))
        assert size > 1e9 and resident < 1 << 20  # at most the header's pages


def _load_seconds(log: str) -> float:
    return float(re.search(r"Loading weights took ([\d.]+) seconds", log)[1])


def test_a_model_read_once_loads_faster_the_second_time(host: Path, start_sim, tmp_path: Path) -> None:
    synth.write_model("small", tmp_path / "m")
    evict(tmp_path / "m/model.safetensors")
    cold = start_sim(host, tmp_path / "m", "--enforce-eager")
    assert cold.wait_for(READY), cold.log
    cold.stop()
    hot = start_sim(host, tmp_path / "m", "--enforce-eager")
    assert hot.wait_for(READY), hot.log
    hot.stop()
    size = (tmp_path / "m/model.safetensors").stat().st_size
    assert _load_seconds(cold.log) == round(size / 2**30, 2)  # 1.0 GiB/s cold
    assert _load_seconds(hot.log) == round(size / (3.5 * 2**30), 2)  # 3.5 GiB/s from the page cache
