"""The release model's surge term (``benchmarks/release/run.py``'s ``surge_factor``): the newest
surge sweep's fitted ``f`` when there is one, else the newest single surge run's ratio."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

RUN = Path(__file__).resolve().parents[3] / "benchmarks" / "release" / "run.py"


@pytest.fixture()
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_run_under_test", RUN)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    monkeypatch.setattr(mod, "REPO", tmp_path)
    return mod


def _single(path: Path, surge_s: float, in_place_s: float) -> None:
    runs = [{"release": "surge", "seconds": surge_s}, {"release": "in place", "seconds": in_place_s}]
    path.write_text(json.dumps({"runs": runs}))


def test_the_newest_sweep_fit_wins_over_single_runs(run: ModuleType, tmp_path: Path) -> None:
    res = tmp_path / "benchmarks" / "results"
    _single(res / "release-surge-2026-12-02T0240.json", 225.5, 123.7)
    (res / "surge-sweep-2026-12-01T0900.json").write_text(json.dumps({"runs": [], "fit": {"f": 0.5}}))
    (res / "surge-sweep-2026-12-02T1044.json").write_text(json.dumps({"runs": [], "fit": {"f": 1.712}}))
    assert run.surge_factor(None) == (1.712, "surge-sweep-2026-12-02T1044.json")


def test_without_a_sweep_the_newest_single_run_gives_f(run: ModuleType, tmp_path: Path) -> None:
    res = tmp_path / "benchmarks" / "results"
    _single(res / "release-surge-2026-12-01T0100.json", 300.0, 100.0)
    _single(res / "release-surge-2026-12-02T0240.json", 225.5, 123.7)
    f, src = run.surge_factor(None)
    assert src == "release-surge-2026-12-02T0240.json"
    assert f == pytest.approx(225.5 / 123.7 - 1)


def test_an_explicit_result_of_either_kind_and_none_at_all(run: ModuleType, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"runs": [], "fit": {"per_count": {}, "f": 1.25}}))
    assert run.surge_factor(sweep) == (1.25, "sweep.json")
    single = tmp_path / "single.json"
    _single(single, 150.0, 100.0)
    assert run.surge_factor(single) == (pytest.approx(0.5), "single.json")
    assert run.surge_factor(None) == (1.0, None)  # no result in benchmarks/results


def test_lab_terms_never_fall_with_the_host_count(run: ModuleType) -> None:
    """A cost measured flat (pre-flight 3.2-4.0 s at 4-16 hosts) with a slightly falling least-squares
    line is taken as its mean, flat: extrapolated to 125 hosts a falling line would predict less
    than anything measured; a rising one is kept as fitted."""
    assert run.rising_line([4.0, 8.0, 16.0], [4.0, 3.2, 3.7]) == (pytest.approx(3.6333, abs=1e-3), 0.0)
    a, b = run.rising_line([4.0, 8.0, 16.0], [2.0, 3.0, 5.0])
    assert b == pytest.approx(0.25) and a == pytest.approx(1.0)
