"""``vllm serve`` argument handling: vLLM's flag names, argparse errors, the non-default args line."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from clusterctl.lab.vllm_sim import cli

from .conftest import FIXTURES


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "clusterctl.lab.vllm_sim", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, **(env or {})),
    )


def test_unknown_flag_fails_like_argparse_with_exit_2() -> None:
    cp = run("serve", "/models/x", "--tensor-paralel-size", "2")
    assert cp.returncode == 2
    assert cp.stderr.splitlines() == [
        "usage: vllm serve [model_tag] [options]",
        "vllm serve: error: unrecognized arguments: --tensor-paralel-size 2",
    ]
    assert cp.stdout == ""


@pytest.mark.parametrize(
    "args,message",
    [
        (["-tp", "two"], "argument --tensor-parallel-size/-tp: invalid int value: 'two'"),
        (["--dtype", "fp4"], "argument --dtype: invalid choice: 'fp4'"),
        (["--kv-cache-dtype", "int3"], "argument --kv-cache-dtype: invalid choice: 'int3'"),
        (["--gpu-memory-utilization", "lots"], "argument --gpu-memory-utilization: invalid float value: 'lots'"),
        (["--max-model-len", "32q"], "argument --max-model-len: invalid human_readable_int value: '32q'"),
    ],
)
def test_bad_values_fail_with_exit_2(args: list[str], message: str) -> None:
    cp = run("serve", "/models/x", *args)
    assert cp.returncode == 2 and message in cp.stderr


def test_version_per_emulated_release() -> None:
    assert run("--version").stdout == "0.11.0\n"
    assert run("--version", env={"VLLM_SIM_VERSION": "0.33"}).stdout == "0.33.0\n"
    assert cli.main(["--version"], version="0.33") == 0


def test_max_model_len_accepts_human_readable_and_auto_only_in_0_33() -> None:
    assert cli.build_parser("0.11").parse_args(["m", "--max-model-len", "32k"]).max_model_len == 32000
    assert cli.build_parser("0.11").parse_args(["m", "--max-model-len", "32K"]).max_model_len == 32768
    assert cli.build_parser("0.11").parse_args(["m", "--max-model-len", "25.6k"]).max_model_len == 25600
    with pytest.raises(SystemExit):
        cli.build_parser("0.11").parse_args(["m", "--max-model-len", "1.5K"])
    assert cli.build_parser("0.33").parse_args(["m", "--max-model-len", "auto"]).max_model_len == -1
    with pytest.raises(SystemExit):
        cli.build_parser("0.11").parse_args(["m", "--max-model-len", "auto"])


def test_non_default_args_line_matches_the_sample() -> None:
    line = next(
        ln for ln in (FIXTURES / "startup_success_v0.11.0.log").read_text().splitlines() if "non-default args" in ln
    )
    expected = ast.literal_eval(line.split("non-default args: ", 1)[1])
    argv = [
        "Qwen/Qwen3-32B",
        "--host",
        "0.0.0.0",
        "--port",
        "8001",
        "--max-model-len",
        "32768",
        "--served-model-name",
        "qwen3-32b",
        "--download-dir",
        "/srv/models/hf",
        "--tensor-parallel-size",
        "2",
        "--gpu-memory-utilization",
        "0.9",
        "--time-scale",
        "0",
    ]
    got = cli.non_default_args("0.11", argv)
    assert got == expected and list(got) == list(expected)
    assert str(got) == line.split("non-default args: ", 1)[1]


def test_defaults_per_version() -> None:
    a11 = cli.build_parser("0.11").parse_args(["m"])
    a33 = cli.build_parser("0.33").parse_args(["m"])
    assert (a11.port, a11.gpu_memory_utilization, a11.tensor_parallel_size) == (8000, 0.9, 1)
    assert a33.gpu_memory_utilization == 0.92 and a33.enable_prefix_caching is True
    assert not hasattr(a33, "swap_space")


def test_make_model_cli(tmp_path) -> None:
    cp = run("make-model", "tiny", str(tmp_path / "m"))
    assert cp.returncode == 0, cp.stderr
    assert (tmp_path / "m/config.json").is_file()
    bad = run("make-model", "gpt-9", str(tmp_path / "x"))
    assert bad.returncode == 2 and "unknown model 'gpt-9'" in bad.stderr and "Traceback" not in bad.stderr
