"""``clusterctl bench`` workloads and targets: --dataset, --duration, --plot, an inventory instance as TARGET."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.cli.main import main
from clusterctl.exitcodes import ExitCode

from .conftest import READY

INVENTORY = """\
version: 1
defaults:
  ssh: {{user: root, connect_timeout: 0.5}}
  gpus: {{count: 2, model: H100-SXM5-80GB, memory_gib: 79.6, interconnect: nvlink}}
hosts:
  gpu01: {{address: 127.0.0.1}}
engines:
  vllm-0.11: {{path: /opt/vllm-0.11/bin/vllm, version: 0.11.0}}
models:
  qwen: {{path: /models/qwen}}
instances:
  qwen-a:
    model: qwen
    engine: vllm-0.11
    placement: "gpu01:0"
    port: {port}
    secrets:
      VLLM_API_KEY: {{env: BENCH_TEST_KEY}}
"""


def test_dataset_lengths_duration_and_plot(
    host, models, start_sim, trust_not_judged, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = start_sim(host, models["qwen3-8b"], scale="0.05", startup="0")
    assert sim.wait_for(READY), sim.log
    data = tmp_path / "chats.jsonl"
    data.write_text(
        '{"prompt": "the cat sat", "output_len": 3}\n\n# a comment\n'
        '{"prompt": "on the mat and the dog ran", "max_tokens": 5}\n{"prompt": "far"}\n'
    )
    plot = tmp_path / "out" / "bench.svg"
    plot.parent.mkdir()
    assert (
        main(
            ["bench", sim.url, "-c", "1,3", "--dataset", str(data), "--output-len", "2", "--plot", str(plot), "--json"]
        )
        == ExitCode.OK
    )
    doc = json.loads(capsys.readouterr().out)
    # each level sends the dataset once: 3 + 5 + 2 (the default) tokens
    assert [r["total_output_tokens"] for r in doc["results"]] == [10, 10]
    assert [r["completed"] for r in doc["results"]] == [3, 3]
    # both lengths of the dataset's prompts: words, and tokens by the endpoint's /tokenize
    assert [(r["prompt_words_mean"], r["prompt_tokens_mean"]) for r in doc["results"]] == [(3.7, 3.7)] * 2
    svg = plot.read_text()
    assert svg.startswith("<svg") and "TTFT mean" in svg and "output tok/s" in svg and svg.count("<polyline") == 3
    assert main(["bench", sim.url, "-c", "2", "--dataset", str(data), "--duration", "0.5", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)["results"][0]
    assert rep["completed"] > 3 and rep["duration_s"] >= 0.5  # cycled for the duration
    assert sim.stop() == 0


def test_bad_dataset_lines_exit_3_with_file_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "ok"}\nnot json\n{"prompt": ""}\n{"prompt": "x", "output_len": -1}\n[1]\n')
    assert main(["bench", "http://127.0.0.1:9", "--dataset", str(data)]) == ExitCode.UNKNOWN
    err = capsys.readouterr().err
    for line in (2, 3, 4, 5):
        assert f"{data}:{line}:" in err, err
    assert "Traceback" not in err
    assert main(["bench", "http://127.0.0.1:9", "--dataset", str(tmp_path / "none.jsonl")]) == ExitCode.UNKNOWN
    assert "cannot read" in capsys.readouterr().err
    assert main(["bench", "http://127.0.0.1:9", "--plot", str(tmp_path)]) == ExitCode.UNKNOWN  # before any request
    assert "--plot" in capsys.readouterr().err


def test_an_inventory_instance_is_a_target_with_its_api_key(
    host,
    models,
    start_sim,
    trust_not_judged,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim = start_sim(host, models["qwen3-8b"], "--api-key", "s3cret-bench", scale="0.05", startup="0")
    assert sim.wait_for(READY), sim.log
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY.format(port=sim.url.rsplit(":", 1)[1]))
    for var in ("VLLM_API_KEY", "OPENAI_API_KEY", "CLUSTERCTL_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("BENCH_TEST_KEY", "s3cret-bench")
    assert main(["bench", "qwen-a", "-i", str(inv), "-c", "2", "-n", "2", "--output-len", "2", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["results"][0]["completed"] == 2 and "s3cret" not in out
    monkeypatch.setenv("BENCH_TEST_KEY", "wrong")
    assert main(["bench", "qwen-a", "-i", str(inv), "-c", "1", "-n", "1", "--json"]) == ExitCode.CRIT
    assert "HTTP 401" in capsys.readouterr().out
    assert main(["bench", "qwen-b", "-i", str(inv)]) == ExitCode.UNKNOWN
    assert "instances: qwen-a" in capsys.readouterr().err
    monkeypatch.delenv("BENCH_TEST_KEY")
    assert main(["bench", "qwen-a", "-i", str(inv)]) == ExitCode.UNKNOWN
    err = capsys.readouterr().err
    assert f"{inv}:" in err and "BENCH_TEST_KEY" in err
    assert sim.stop() == 0
