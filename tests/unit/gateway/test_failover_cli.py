"""``clusterctl failover`` without hosts: doctor's detection replaced, --plan and nothing-to-do change nothing."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from clusterctl.cli.main import main
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.gateway import failover
from clusterctl.gateway.failover import Detection, FailoverReport
from clusterctl.gateway.failover_plan import FailoverPlan

from .conftest import INVENTORY


@pytest.fixture
def inv_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GW_TEST_KEY", "sk-never-shown")
    monkeypatch.setenv("CLUSTERCTL_STATE_DIR", str(tmp_path / "state"))  # failover sets it; restored after
    p = tmp_path / "inv.yaml"
    p.write_text(INVENTORY)
    return str(p)


def _detect_with(unavailable: dict[str, str], findings: list[Finding]) -> Any:
    def fake(inv: Any, instances: Any, fleet: Any, hosts: Any, on_event: Any = None) -> Detection:
        return Detection(dict(unavailable), findings, {})

    return fake


@pytest.fixture
def no_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    import clusterctl.fleet.factory as fleet_mod

    monkeypatch.setattr(fleet_mod, "Fleet", lambda *a, **k: contextlib.nullcontext())


def test_plan_lists_the_explicit_instance_as_not_movable_and_changes_nothing(
    inv_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_ssh: None, capsys: pytest.CaptureFixture[str]
) -> None:
    lost = Finding("gpu.lost", Severity.CRIT, "gpu01", "gpu:0", "GPU has fallen off the bus")
    monkeypatch.setattr(failover, "detect", _detect_with({"q1": "UNAVAILABLE: member gpu01:0"}, [lost]))
    state = tmp_path / "state"
    rc = main(["failover", "--plan", "--max-share", "0.25", "--json", "-i", inv_file, "--state-dir", str(state)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["exit_code"] == 1  # an explicit instance is not movable
    assert out["fixed"] == ["q1"] and out["moves"] == [] and out["cap"] == 1 and out["planned"] is True
    assert out["cordons"]["gpu01:0"]["reason"] == "failover: gpu.lost: GPU has fallen off the bus"
    assert not state.exists() or not any(state.iterdir())  # --plan wrote nothing


def test_nothing_unavailable_exits_0_and_writes_nothing(
    inv_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_ssh: None, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(failover, "detect", _detect_with({}, []))
    state = tmp_path / "state"
    assert main(["failover", "-i", inv_file, "--state-dir", str(state)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert not state.exists() or not any(state.iterdir())


def test_usage_errors_exit_3(inv_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["failover", "--max-share", "1.5", "-i", inv_file]) == 3
    assert main(["failover", "-i", "/nonexistent/inventory.yaml"]) == 3
    capsys.readouterr()
    assert main(["failover", "--avoid-host", "nosuchhost", "--plan", "-i", inv_file]) == 3
    assert "--avoid-host nosuchhost: not a host of" in capsys.readouterr().err


@pytest.mark.parametrize(
    "plan, moved, code",
    [
        (FailoverPlan(4, 1), {}, 0),
        (FailoverPlan(4, 1, over_cap=["b"]), {"a": None}, 1),
        (FailoverPlan(4, 1, fixed=["a"]), {}, 1),
        (FailoverPlan(4, 1, no_room={"a": "not enough free uncordoned GPUs"}), {}, 1),
        (FailoverPlan(4, 1, over_cap=["b"]), {"a": "gate: no completion"}, 2),
    ],
)
def test_exit_codes(plan: FailoverPlan, moved: dict[str, str | None], code: int) -> None:
    assert FailoverReport(plan, Detection({}, [], {}), moved=moved).exit_code == code
