"""The `clusterctl lab` commands a user types, against the session's lab."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _cli(lab, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        CLUSTERCTL_LAB_DIR=str(lab.cfg.lab_dir),
        CLUSTERCTL_LAB_CACHE=str(lab.cfg.cache_dir),
        CLUSTERCTL_LAB_BRIDGE=lab.cfg.bridge,
        CLUSTERCTL_LAB_NET=lab.cfg.net,
        CLUSTERCTL_LAB_PREFIX=lab.cfg.prefix,
    )
    return subprocess.run(
        [sys.executable, "-m", "clusterctl.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_status_json_lists_every_host_running(lab):
    cp = _cli(lab, "lab", "status", "--json")
    assert cp.returncode == 0, cp.stderr
    st = json.loads(cp.stdout)
    assert [h["name"] for h in st["hosts"]] == lab.names
    assert all(h["running"] and not h["frozen"] for h in st["hosts"])
    assert st["inventory"] == str(lab.inventory)


def test_ssh_runs_a_command_with_ssh_semantics(lab):
    cp = _cli(lab, "lab", "ssh", lab.names[1], "--", "echo", "$(hostname)", ";", "exit", "7")
    assert (cp.returncode, cp.stdout.strip()) == (7, lab.names[1])
    cp = _cli(lab, "lab", "ssh", lab.names[-1], "-u", "ops", "--", "sudo -n id -un")
    assert (cp.returncode, cp.stdout.strip()) == (0, "root")


def test_up_again_is_a_no_op(lab):
    before = [h.pid for h in lab.up_result.state.hosts]
    cp = _cli(lab, "lab", "up", "--hosts", str(len(lab.names)), "--json")
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["already_up"] is True
    assert "already up" in cp.stderr
    assert [h["pid"] for h in json.loads(_cli(lab, "lab", "status", "--json").stdout)["hosts"]] == before


def test_inject_and_heal_from_the_command_line(lab):
    name = lab.names[0]
    cp = _cli(lab, "lab", "inject", name, "loss", "--percent", "5")
    assert cp.returncode == 0 and f"{name}: dropping 5% of packets" in cp.stdout
    st = json.loads(_cli(lab, "lab", "status", "--json").stdout)
    assert st["hosts"][0]["faults"] == ["loss 5%"]
    cp = _cli(lab, "lab", "inject", name, "bandwidth")
    assert cp.returncode == 3 and "--rate" in cp.stderr
    cp = _cli(lab, "lab", "heal", name)
    assert cp.returncode == 0 and "loss 5%" in cp.stdout
    assert json.loads(_cli(lab, "lab", "status", "--json").stdout)["hosts"][0]["faults"] == []


def test_unknown_host_is_explained(lab):
    cp = _cli(lab, "lab", "ssh", "nosuchhost", "--", "true")
    assert cp.returncode == 3
    assert "no lab host 'nosuchhost'" in cp.stderr
