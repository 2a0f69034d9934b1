"""The whole payload run as the fleet runs it: ``sh -c 'python3 -I -B - ARGS'``
with the payload on stdin, on this machine (no GPU here)."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.probe.payload import RC_PYTHON_TOO_OLD, build_payload, payload, probe_command

PYENV = Path("/root/.pyenv/versions")
REPO = Path(__file__).resolve().parents[3]


def run_payload(
    command: str, *, cwd: Path, env: dict[str, str] | None = None, data: bytes | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["/bin/sh", "-c", command],
        input=payload().data if data is None else data,
        capture_output=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )


def python_at(version: str) -> str | None:
    for p in sorted(PYENV.glob(f"{version}*/bin/python{version}")):
        return str(p)
    return None


def test_end_to_end_on_this_machine(tmp_path):
    r = run_payload(probe_command(python=sys.executable), cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == b""
    doc = json.loads(r.stdout)
    assert doc["schema"] == 1
    assert doc["host"]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert doc["host"]["kernel"]["release"] == os.uname().release
    assert doc["host"]["memory"]["total"] > 0
    assert any(d["mount"] == "/" for d in doc["host"]["disks"])
    names = sorted(n for n in os.listdir("/sys/class/net") if n != "lo")
    assert [n["netdev"] for n in doc["nics"] if n["netdev"]] == names
    if ctypes.util.find_library("nvidia-ml") is None:
        assert doc["gpus"]["available"] is False
        assert "libnvidia-ml.so.1" in doc["gpus"]["reason"]
    else:
        assert doc["gpus"]["available"] is True
    # read-only: nothing written where it ran (no byte code, no temp files)
    assert list(tmp_path.iterdir()) == []


def test_missing_tools_are_reasons_not_tracebacks(tmp_path):
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}  # no systemctl, no journalctl
    r = run_payload(probe_command(python=sys.executable), cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stderr == b""
    doc = json.loads(r.stdout)
    sources = {e["source"]: e["reason"] for e in doc["errors"]}
    assert sources["units"] == "systemctl not found"
    assert doc["units"] is None


def test_carried_pynvml_used_when_the_node_has_none(tmp_path):
    """Debian's own python3 has no pynvml: the carried copy is used."""
    py = "/usr/bin/python3"
    if subprocess.run([py, "-I", "-c", "import pynvml"], capture_output=True).returncode == 0:
        pytest.skip("this machine's /usr/bin/python3 has its own pynvml")
    r = run_payload(probe_command(python=py), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)["gpus"]["pynvml"]
    assert info == {"origin": "carried", "version": payload().pynvml_version, "reason": None}


def test_runs_on_python38(tmp_path):
    py = python_at("3.8")
    if py is None:
        pytest.skip("no Python 3.8 interpreter on this machine (vermin still checks the source)")
    r = run_payload(probe_command(python=py), cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    doc = json.loads(r.stdout)
    assert doc["host"]["python"]["version"].startswith("3.8.")
    assert doc["gpus"]["pynvml"]["origin"] == "carried"


def test_too_old_python_exits_97_with_a_message(tmp_path):
    py = python_at("3.7") or python_at("3.6")
    if py is None:
        pytest.skip("no Python older than 3.8 on this machine")
    r = run_payload(probe_command(python=py), cwd=tmp_path)
    assert r.returncode == RC_PYTHON_TOO_OLD
    assert b"too old, 3.8 or newer is needed" in r.stderr and r.stdout == b""


def test_hostile_cursor_is_quoted(tmp_path):
    marker = tmp_path / "pwned"
    cursor = f"s=1'; touch {marker}; echo '$(touch {marker})`touch {marker}`\nx"
    cmd = probe_command(python=sys.executable, kernel_log_cursor=cursor)
    r = run_payload(cmd, cwd=tmp_path)
    assert r.returncode == 0
    assert not marker.exists()
    assert json.loads(r.stdout)["kernel_log"]["cursor"] in (cursor, None)


def test_payload_is_cached_ascii_and_embeds_the_collector():
    p1, p2 = payload(), payload()
    assert p1 is p2
    p1.data.decode("ascii")
    rebuilt = build_payload()
    assert rebuilt.digest == p1.digest  # deterministic: same inputs, same bytes
    other = build_payload(collector=b"print('x')\n", pynvml_source=b"", pynvml_version="0")
    assert other.digest != p1.digest


def test_probe_command_shape():
    assert probe_command() == "python3 -I -B -"
    assert (
        probe_command(kernel_log_cursor="a b", nvml_timeout=2)
        == "python3 -I -B - --kernel-log-cursor 'a b' --nvml-timeout 2.0"
    )
