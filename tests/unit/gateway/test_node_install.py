"""The gateway node program on a host without nginx: installed with apt-get, or a clear refusal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterctl.node import gateway as node


def _bin(d: Path, name: str, script: str) -> None:
    p = d / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(0o755)


def test_without_nginx_or_apt_get_it_refuses_and_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither nginx nor apt-get
    target = tmp_path / "etc" / "gateway.conf"
    res = node.apply({"files": [{"path": str(target), "text": "x", "mode": 0o644}], "digest": "d"})
    assert res["ok"] is False and "nginx is not installed and this host has no apt-get" in res["error"]
    assert not target.exists()


def test_apt_get_installs_nginx_and_njs_when_nginx_is_missing(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "apt.log"
    # A stand-in apt-get that records its arguments and "installs" an nginx binary.
    _bin(
        tmp_path,
        "apt-get",
        f'echo "$DEBIAN_FRONTEND $*" > {log}\nprintf "#!/bin/sh\\n" > {tmp_path}/nginx\n'
        f'/bin/chmod 755 {tmp_path}/nginx\n',
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    assert node.ensure_nginx() is None
    assert log.read_text().split() == [
        "noninteractive",
        "install",
        "-y",
        "--no-install-recommends",
        "nginx-light",
        "libnginx-mod-http-js",
    ]
    assert node.ensure_nginx() is None and os.access(tmp_path / "nginx", os.X_OK)


def test_a_failed_install_says_so_with_apt_gets_last_lines(tmp_path: Path, monkeypatch) -> None:
    _bin(tmp_path, "apt-get", 'echo "E: Unable to locate package libnginx-mod-http-js"; exit 100\n')
    monkeypatch.setenv("PATH", str(tmp_path))
    why = node.ensure_nginx()
    assert why is not None and "installing nginx-light libnginx-mod-http-js failed" in why
    assert "Unable to locate package" in why


@pytest.fixture(autouse=True)
def _no_real_system(monkeypatch) -> None:
    monkeypatch.setattr(node, "_active", lambda: False)
