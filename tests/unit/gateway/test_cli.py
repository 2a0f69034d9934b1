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


def test_render_out_writes_the_files_under_dir(
    inv_file: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["gateway", "render", "-i", inv_file, "--out", str(out), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["files"]
    assert [f["path"] for f in listed] == [
        "/etc/nginx/nginx.conf",
        "/etc/nginx/clusterctl/gateway.conf",
        "/etc/nginx/clusterctl/gateway.js",
        "/etc/nginx/clusterctl/upstream-auth.conf",
        "/etc/nginx/clusterctl/clients.json",
    ]
    clients = out / "etc/nginx/clusterctl/clients.json"
    assert oct(clients.stat().st_mode & 0o777) == "0o640" and "not shown" in clients.read_text()
    auth = out / "etc/nginx/clusterctl/upstream-auth.conf"
    assert auth.read_text().count("***") == 1 and oct(auth.stat().st_mode & 0o777) == "0o640"
    assert "worker_shutdown_timeout 600s;" in (out / "etc/nginx/nginx.conf").read_text()


def test_usage_errors_exit_3(inv_file: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", "deploy", "gpu01", "-i", inv_file]) == 3
    assert "'gpu01' is not a gateway host (gateway.hosts: gw01)" in capsys.readouterr().err
    bare = tmp_path / "bare.yaml"
    bare.write_text(INVENTORY[: INVENTORY.index("gateway:")])
    for cmd in ("render", "sync", "status"):
        assert main(["gateway", cmd, "-i", str(bare)]) == 3
        assert "no 'gateway:' section" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(INVENTORY.replace("port: 8080", "port: eighty"))
    assert main(["gateway", "render", "-i", str(bad)]) == 3
    assert "bad.yaml:21: gateway.port: expected an integer" in capsys.readouterr().err


def test_key_add_shows_the_key_once_and_nowhere_else(
    inv_file: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """add prints the key on stdout once; list, --json, render, the store and the audit never hold it."""
    assert main(["gateway", "key", "add", "team-a", "-i", inv_file, "--no-apply", "--streams", "4"]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("gk-") and len(key) == 46
    assert main(["gateway", "key", "add", "team-b", "-i", inv_file, "--no-apply", "--json"]) == 3
    assert "--json needs --key-file" in capsys.readouterr().err
    kf = tmp_path / "b.key"
    assert main(["gateway", "key", "add", "team-b", "-i", inv_file, "--no-apply", "--json", "--key-file", str(kf)]) == 0
    b_out = capsys.readouterr().out
    key_b = kf.read_text().strip()
    assert oct(kf.stat().st_mode & 0o777) == "0o600" and key_b.startswith("gk-") and key_b not in b_out
    assert json.loads(b_out)["client"]["name"] == "team-b"
    assert main(["gateway", "key", "add", "team-a", "-i", inv_file, "--no-apply"]) == 3
    assert "has a key already" in capsys.readouterr().err
    assert main(["gateway", "key", "list", "-i", inv_file, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(c["name"], c["streams"]) for c in listed["clients"]] == [("team-a", 4), ("team-b", None)]
    assert main(["gateway", "render", "-i", inv_file, "--json"]) == 0
    rendered = capsys.readouterr().out
    assert "team-a" not in rendered and "2 client key(s)" in rendered
    assert main(["gateway", "key", "revoke", "team-a", "-i", inv_file, "--no-apply"]) == 0
    assert main(["gateway", "key", "revoke", "team-a", "-i", inv_file, "--no-apply"]) == 3
    assert "no client 'team-a'" in capsys.readouterr().err
    state = tmp_path / "state"
    for p in state.rglob("*"):
        if p.is_file():
            assert key not in p.read_text() and key_b not in p.read_text(), p
    audit = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    assert [(a["action"], a["client"]) for a in audit] == [("add", "team-a"), ("add", "team-b"), ("revoke", "team-a")]
    assert oct((state / "gateway-keys.json").stat().st_mode & 0o777) == "0o600"


def test_key_names_nginx_would_interpret_are_refused(inv_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ('a"b', "a b", "a;b", ".lead", "a{b}"):
        assert main(["gateway", "key", "add", bad, "-i", inv_file, "--no-apply"]) == 3
        assert "client name" in capsys.readouterr().err
