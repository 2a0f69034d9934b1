"""``clusterctl deploy`` / ``rollback``: bad input exits 3 naming the place, before any host is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.cli.main import main
from clusterctl.exitcodes import ExitCode

INVENTORY = """\
version: 1
defaults:
  ssh: {user: root, connect_timeout: 0.5}
  gpus: {count: 2, model: H100-SXM5-80GB, memory_gib: 79.6, interconnect: nvlink}
hosts:
  gpu01: {address: 127.0.0.1}
engines:
  vllm-0.11: {path: /opt/vllm-0.11/bin/vllm, version: 0.11.0}
models:
  tiny: {path: /models/tiny}
instances:
  a:
    model: tiny
    engine: vllm-0.11
    placement: "gpu01:0"
    port: 8100
    secrets:
      VLLM_API_KEY: {env: CLUSTERCTL_TEST_UNSET_KEY}
"""


@pytest.fixture
def inv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CLUSTERCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("CLUSTERCTL_TEST_UNSET_KEY", raising=False)
    p = tmp_path / "inv.yaml"
    p.write_text(INVENTORY)
    return str(p)


@pytest.mark.parametrize("serial,msg", [("1,x", "--serial: 'x' is not a count"), ("150%", "must be in 1..100")])
def test_bad_serial_exits_3(inv: str, capsys: pytest.CaptureFixture[str], serial: str, msg: str) -> None:
    assert main(["deploy", "-i", inv, "--serial", serial]) == ExitCode.UNKNOWN
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_an_unset_secret_exits_3_at_its_inventory_line(inv: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "--plan", "-i", inv]) == ExitCode.UNKNOWN
    err = capsys.readouterr().err
    assert f"{inv}:" in err and "VLLM_API_KEY" in err and "CLUSTERCTL_TEST_UNSET_KEY is not set" in err


def test_max_fail_percentage_out_of_range_and_empty_selection_exit_3(
    inv: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["deploy", "-i", inv, "--max-fail-percentage", "101"]) == ExitCode.UNKNOWN
    assert main(["rollback", "-i", inv, "--hosts", "nosuch"]) == ExitCode.UNKNOWN
    err = capsys.readouterr().err
    assert "--max-fail-percentage" in err and "unknown host(s): nosuch" in err


def test_an_unreachable_host_is_a_row_and_the_deploy_fails_without_a_traceback(
    inv: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERCTL_TEST_UNSET_KEY", "k-123")
    text = Path(inv).read_text().replace("connect_timeout: 0.5}", "connect_timeout: 0.5, port: 1}")
    Path(inv).write_text(text)
    assert main(["deploy", "--plan", "-i", inv, "--json", "--host-key-policy", "off"]) == ExitCode.CRIT
    out = capsys.readouterr().out
    assert '"error":' in out and "gpu01" in out and "k-123" not in out


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("deploy", "rollback"):
        assert main([cmd, "--help"]) == 0
        assert "Examples:" in capsys.readouterr().out
