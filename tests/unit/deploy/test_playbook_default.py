"""The shipped default playbook plans exactly what ``deploy --plan --serial 1,25%,100%`` plans:
the same instances, the same per-host changes (diffs included) and the same batches.

Hosts are not reached: ``remote.read_hosts`` answers with recorded host state
(tests/unit/deploy/playbook_fakes.py), as the engine's own plan tests do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clusterctl.cli.main import main
from clusterctl.deploy.rollout.batches import batches, parse_serial
from clusterctl.exitcodes import ExitCode
from tests.unit.deploy.playbook_fakes import KEY, recorded  # noqa: F401  (fixture)

DEFAULT = str(Path(__file__).resolve().parents[3] / "playbooks" / "default.yaml")


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main(["deploy", "--plan", "--json", "--host-key-policy", "off", *args])
    out = capsys.readouterr().out
    assert code == ExitCode.OK, out
    assert KEY not in out
    data: dict[str, Any] = json.loads(out)
    return data


def test_default_playbook_plan_equals_deploy_plan(recorded: str, capsys: pytest.CaptureFixture[str]) -> None:
    deploy = run_json(capsys, "-i", recorded, "--serial", "1,25%,100%")
    book = run_json(capsys, "-i", recorded, "--playbook", DEFAULT)
    # The same per-host changes, diffs and env changes (secrets as ***).
    assert book["plan"] == deploy["plan"]
    actions = {i["instance"]: i["action"] for h in deploy["plan"]["hosts"] for i in h["items"]}
    assert actions == {
        "a1": "unchanged",
        "a2": "changed",
        "a3": "new",
        "a4": "start",
        "a5": "unchanged",
        "gone": "remove",
    }
    # The same batches as the engine makes of the hosts with changes.
    changed = [h["host"] for h in deploy["plan"]["hosts"] if any(i["action"] != "unchanged" for i in h["items"])]
    expected = batches(changed, parse_serial("1,25%,100%"))
    steps = {s["name"]: s for s in book["steps"]}
    assert expected == [["h2"], ["h3"], ["h4", "h5"]]
    assert steps["canary"]["batches"] + steps["rollout"]["batches"] == expected
    assert steps["canary"]["batches"] == expected[:1]
    assert book["batches"] == expected and deploy["batches"] == []  # deploy --plan does not batch
    # Every other step covers exactly the hosts and instances that change.
    for name in ("pre-flight", "stage", "units"):
        assert steps[name]["hosts"] == changed
        assert steps[name]["instances"] == ["a2", "a3", "a4", "gone"]


def test_default_playbook_plan_text_shows_steps_and_the_deploy_diff(
    recorded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["deploy", "--plan", "-i", recorded, "--host-key-policy", "off"]) == ExitCode.OK
    deploy = capsys.readouterr().out
    assert main(["deploy", "--plan", "-i", recorded, "--host-key-policy", "off", "--playbook", DEFAULT]) == ExitCode.OK
    book = capsys.readouterr().out
    assert "--- h2 a2: changed" in deploy and "--- h3 a3: new" in deploy
    assert book.endswith(deploy)  # the steps table, then exactly deploy --plan's table and diffs
    assert "h4,h5" in book and "canary" in book and KEY not in book


def test_detailed_exitcode_with_a_playbook(recorded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "deploy",
                "--plan",
                "--detailed-exitcode",
                "-i",
                recorded,
                "--host-key-policy",
                "off",
                "--playbook",
                DEFAULT,
            ]
        )
        == ExitCode.WARN
    )


def test_a_bad_playbook_exits_3_at_its_line(recorded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - {kind: rollout, serial: x}\n  - {kind: exec}\n")
    assert main(["deploy", "--plan", "-i", recorded, "--playbook", str(bad)]) == ExitCode.UNKNOWN
    err = capsys.readouterr().err
    assert f"{bad}:2:" in err and f"{bad}:3:" in err and "Traceback" not in err


def test_serial_does_not_go_with_a_playbook(recorded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "--plan", "-i", recorded, "--playbook", DEFAULT, "--serial", "2"]) == ExitCode.UNKNOWN
    assert "--serial does not go with --playbook" in capsys.readouterr().err


def test_a_step_hosts_pattern_unknown_to_the_inventory_exits_3_at_its_line(
    recorded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pb = tmp_path / "pb.yaml"
    pb.write_text("steps:\n  - kind: rollout\n    hosts: '@nosuch'\n")
    assert main(["deploy", "--plan", "-i", recorded, "--host-key-policy", "off", "--playbook", str(pb)]) == 3
    err = capsys.readouterr().err
    assert f"{pb}:3: step 'rollout': hosts:" in err and "nosuch" in err
