"""``clusterctl gateway`` commands that need no host: render, usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.cli.main import main

from .conftest import INVENTORY


@pytest.fixture
def inv_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GW_TEST_KEY", "sk-never-shown")
    monkeypatch.setenv("CLUSTERCTL_STATE_DIR", str(tmp_path / "state"))
    p = tmp_path / "inv.yaml"
    p.write_text(INVENTORY)
    return str(p)


def test_render_prints_every_file_and_never_the_key(inv_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", "render", "-i", inv_file]) == 0
    out = capsys.readouterr().out
    assert "upstream m_qwen_s {" in out and "js_content gw.route;" in out and "var ROUTES" in out
    assert 'Authorization "Bearer ***"' in out and "sk-never-shown" not in out


def test_render_out_writes_the_files_under_dir(inv_file: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["gateway", "render", "-i", inv_file, "--out", str(out), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["files"]
    assert [f["path"] for f in listed] == ["/etc/nginx/nginx.conf", "/etc/nginx/clusterctl/gateway.conf",
                                          "/etc/nginx/clusterctl/gateway.js",
                                          "/etc/nginx/clusterctl/upstream-auth.conf"]
    auth = out / "etc/nginx/clusterctl/upstream-auth.conf"
    assert auth.read_text().count("***") == 1 and oct(auth.stat().st_mode & 0o777) == "0o640"
    assert "worker_shutdown_timeout 600s;" in (out / "etc/nginx/nginx.conf").read_text()


def test_usage_errors_exit_3(inv_file: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", "deploy", "gpu01", "-i", inv_file]) == 3
    assert "'gpu01' is not a gateway host (gateway.hosts: gw01)" in capsys.readouterr().err
    bare = tmp_path / "bare.yaml"
    bare.write_text(INVENTORY[:INVENTORY.index("gateway:")])
    for cmd in ("render", "sync", "status"):
        assert main(["gateway", cmd, "-i", str(bare)]) == 3
        assert "no 'gateway:' section" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(INVENTORY.replace("port: 8080", "port: eighty"))
    assert main(["gateway", "render", "-i", str(bad)]) == 3
    assert "bad.yaml:21: gateway.port: expected an integer" in capsys.readouterr().err
