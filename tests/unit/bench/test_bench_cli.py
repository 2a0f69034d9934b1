"""``clusterctl bench`` end to end against a simulator: JSON report, table, exit codes."""

from __future__ import annotations

import json

import pytest

from clusterctl.cli.main import main
from clusterctl.exitcodes import ExitCode

from .conftest import READY


def test_bench_json_reports_each_level_with_vllm_metrics(
    host, models, start_sim, trust_not_judged, capsys: pytest.CaptureFixture[str]
) -> None:
    # Scale 0.25: tokens 1.8 ms apart, which the client can tell apart (at 0.05 they come in bursts: TPOT 0).
    sim = start_sim(host, models["qwen3-8b"], scale="0.25", startup="0")
    assert sim.wait_for(READY, 60), sim.log
    rc = main(
        [
            "bench",
            sim.url,
            "--concurrency",
            "1,4",
            "--requests",
            "4",
            "--input-len",
            "32",
            "--output-len",
            "6",
            "--slo-ttft",
            "10000",
            "--server-timings",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == ExitCode.OK
    assert [r["concurrency"] for r in doc["results"]] == [1, 4]
    # Lengths in tokens, counted by the endpoint's /tokenize; the server's own count agrees.
    assert (doc["input_len"], doc["input_len_unit"]) == (32, "tokens") and "/tokenize" in doc["tokenizer"]
    for r in doc["results"]:
        assert r["completed"] == 4 and r["total_output_tokens"] == 24 and r["goodput"] > 0
        assert r["prompt_tokens_mean"] == 32 and r["total_input_tokens"] == 4 * 32
        assert set(r["trust"]) >= {"trusted", "reasons", "ttft_error_ms", "loop_lag_ms", "coalesced_share"}
        # TPOT is 0 only when the chunks came in one read (a loaded machine), which the trust check measures
        assert set(r["ttft_ms"]) == {"mean", "median", "p90", "p99"}
        assert r["tpot_ms"]["mean"] > 0 or r["trust"]["coalesced_share"] > 0.5, r
        assert r["server_ttft_mean_ms"] is not None and r["generator_cpu_percent"] >= 0
    assert main(["bench", sim.url, "-c", "4", "-n", "4", "--output-len", "3", "--request-rate", "10"]) == 0
    out, err = capsys.readouterr()
    assert "TTFT" in out and "TPOT" in out
    assert f"{sim.url} concurrency 4: 4 requests, 0 failed" in err  # progress, on stderr (not with --json)
    assert (
        main(
            [
                "bench",
                sim.url,
                "-c",
                "4",
                "-n",
                "6",
                "--output-len",
                "2",
                "--request-rate",
                "20",
                "--seed",
                "5",
                "--json",
            ]
        )
        == 0
    )
    from clusterctl.bench.loadgen import arrival_times

    paced = json.loads(capsys.readouterr().out)["results"][0]
    assert paced["duration_s"] >= arrival_times(6, 20.0, seed=5)[-1]  # the last one was not sent early
    assert sim.stop() == 0


def test_bench_usage_errors_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "http://127.0.0.1:8000", "--concurrency", "1,x"]) == ExitCode.UNKNOWN
    assert "--concurrency: expected numbers" in capsys.readouterr().err
    assert main(["bench", "ftp://h"]) == ExitCode.UNKNOWN
    assert "not an endpoint URL" in capsys.readouterr().err


def test_compare_flags_a_slowed_down_target_as_a_regression(
    host, models, start_sim, trust_not_judged, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Time scale 1 (a ~7 ms decode step, 28 ms slowed): at 0.05 the step was 0.35 ms, less than the per-token
    # cost of the stream on a loaded machine, which hid the 4x slow-down (0 instead of 1 under load).
    a = start_sim(host, models["qwen3-8b"], scale="1", startup="0")
    b = start_sim(host, models["qwen3-8b"], scale="1", gpus="1", startup="0")
    assert a.wait_for(READY) and b.wait_for(READY), a.log + b.log
    args = [
        "bench",
        a.url,
        "--compare",
        b.url,
        "-c",
        "2",
        "-n",
        "4",
        "--input-len",
        "16",
        "--output-len",
        "8",
        "--json",
        "--tolerance",
        "0.5",
        "--plot",
        str(tmp_path / "ab.svg"),
    ]
    b.post("/sim/fault", {"fault": "slowdown", "factor": 4})
    assert main(args) == ExitCode.WARN
    doc = json.loads(capsys.readouterr().out)
    tpot = next(r for r in doc["comparison"] if r["metric"] == "tpot_ms.mean")
    assert tpot["regression"] and tpot["change"] > 0.5  # 4x slower steps; beyond the tolerance (0.5)
    svg = (tmp_path / "ab.svg").read_text()
    assert "A TTFT p99" in svg and "B output tok/s" in svg  # both targets in the plot
    assert main(["bench", a.url, "--compare", "ftp://x"]) == ExitCode.UNKNOWN
    assert a.stop() == 0 and b.stop() == 0
