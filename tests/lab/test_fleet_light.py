"""The light-mode lab and the CLI over it (tier 2, root): real sshd per host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.lab import light
from support.sshd import can_run

pytestmark = pytest.mark.skipif(can_run() is not None, reason=can_run() or "")


@pytest.fixture(scope="module")
def light_lab(tmp_path_factory):
    lab_dir = Path("/var/lib/clusterctl-lab") / f"light-test-{tmp_path_factory.getbasetemp().name}"
    inv = light.up(lab_dir, 12, base="127.76")
    yield lab_dir, inv
    light.down(lab_dir)


def cli(*args: str, env_home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clusterctl.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(env_home), "XDG_STATE_HOME": str(env_home / "state")},
    )


def test_light_hosts_are_separate_namespaces_with_own_root(light_lab, tmp_path):
    lab_dir, inv = light_lab
    assert all(h.alive and h.listening for h in light.status(lab_dir))
    r = cli(
        "exec",
        "-i",
        str(inv),
        "all",
        "--json",
        "--",
        "echo $(cat /proc/sys/kernel/hostname) $HOME $(ls -A /root | wc -l) $(cat /proc/1/comm)",
        env_home=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    outs = {h["host"]: h["stdout"] for h in data["hosts"]}
    assert len(outs) == 12
    for name, out in outs.items():
        assert out == f"{name} /root 0 sh\n"  # own hostname, own empty /root, own PID 1


def test_inventory_is_strict_and_known_hosts_prefilled(light_lab, tmp_path):
    lab_dir, inv = light_lab
    text = inv.read_text()
    assert "host_key_policy: strict" in text
    kh = (lab_dir / "known_hosts").read_text().splitlines()
    assert len(kh) == 12 and kh[0].startswith("127.76.0.1 ssh-ed25519 ")
    r = cli("ping", "-i", str(inv), "lh[0001-0004]", env_home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "4/4 hosts answered" in r.stdout


def test_cli_exit_codes_and_failed_memory(light_lab, tmp_path):
    _, inv = light_lab
    r = cli(
        "exec",
        "-i",
        str(inv),
        "all",
        "--",
        'case $(cat /proc/sys/kernel/hostname) in lh0003) exit 7;; esac',
        env_home=tmp_path,
    )
    assert r.returncode == 7
    assert "lh0003 (1) rc=7" in r.stdout
    r = cli("exec", "-i", str(inv), "@failed", "--json", "--", "cat /proc/sys/kernel/hostname", env_home=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["groups"][0]["nodes"] == "lh0003"


def test_up_refuses_second_lab_and_down_leaves_nothing(tmp_path):
    lab_dir = Path("/var/lib/clusterctl-lab") / f"light-updown-{tmp_path.name}"
    inv = light.up(lab_dir, 3, base="127.75")
    try:
        with pytest.raises(light.LabError, match="already running"):
            light.up(lab_dir, 3, base="127.75")
        pids = [h.pid for h in light.status(lab_dir)]
        assert inv.exists()
    finally:
        assert light.down(lab_dir) == 3
    assert not lab_dir.exists()
    assert all(not Path(f"/proc/{p}").exists() for p in pids)
    assert light._listening({(f"127.75.0.{i}", 22) for i in (1, 2, 3)}) == set()
