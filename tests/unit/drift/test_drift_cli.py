"""``clusterctl drift`` commands end to end against a simulator, state in a temporary XDG dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.cli.main import main
from clusterctl.exitcodes import ExitCode

from .conftest import READY

PROMPTS = str(Path(__file__).resolve().parents[3] / "checks" / "drift" / "basic.jsonl")


def test_baseline_check_calibrate_and_leak(
    host, models, start_sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    sim = start_sim(host, models["qwen3-8b"], "--no-sim-batch-noise")
    assert sim.wait_for(READY), sim.log
    assert main(["drift", "baseline", sim.url, "--name", "ref", "--prompts", PROMPTS, "--meta", "tp=1"]) == 0
    assert "baseline 'ref': 12 prompts" in capsys.readouterr().out
    saved = json.loads((tmp_path / "clusterctl" / "drift" / "baselines" / "ref.json").read_text())
    assert saved["env"]["tp"] == "1" and saved["k"] == 8
    # token ids (return_tokens_as_token_ids), with each token's place in the text to show it
    item = saved["items"][0]
    assert item["by_id"] and all(t.startswith("token_id:") for t in item["tokens"])
    assert len(item["offsets"]) == len(item["tokens"]) and all(k.startswith("token_id:") for k in item["top"][0])
    assert main(["drift", "check", sim.url, "--baseline", "ref"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "identical" in out and "PASS" in out
    assert (
        main(["drift", "calibrate", sim.url, "--prompts", PROMPTS, "--runs", "1", "--background", "2", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["floor"]["exact_match"] == 1.0
    assert main(["drift", "leak", sim.url, "--sessions", "3", "--requests", "2", "--json"]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["sightings"] == []
    sim.post("/sim/fault", {"fault": "leak"})
    assert main(["drift", "leak", sim.url, "--sessions", "3", "--requests", "3"]) == ExitCode.CRIT
    assert "CRIT" in capsys.readouterr().out
    assert sim.stop() == 0


def test_missing_baseline_and_bad_prompt_file_exit_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert main(["drift", "check", "http://127.0.0.1:9", "--baseline", "nope"]) == ExitCode.UNKNOWN
    assert "no baseline 'nope'" in capsys.readouterr().err
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": ""}\n')
    assert main(["drift", "baseline", "http://127.0.0.1:9", "--name", "x", "--prompts", str(bad)]) == 3
    assert "p.jsonl:2: needs a non-empty string 'prompt'" in capsys.readouterr().err
    assert main(["drift", "baseline", "http://127.0.0.1:9", "--name", "x", "--prompts", PROMPTS]) == 3
    assert "Connection" in capsys.readouterr().err
