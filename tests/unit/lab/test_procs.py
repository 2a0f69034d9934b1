from __future__ import annotations

import os
import subprocess
import time

from clusterctl.lab import procs


def test_alive_sees_through_zombies():
    assert procs.alive(os.getpid())
    p = subprocess.Popen(["true"])
    p.wait()
    assert not procs.alive(p.pid)
    q = subprocess.Popen(["true"])
    # Not waited for: a zombie child until alive() reaps it.
    time.sleep(0.2)
    assert not procs.alive(q.pid)


def test_cgroup_tree_removed_deepest_first(tmp_path, monkeypatch):
    monkeypatch.setattr(procs, "CGROUP_ROOT", tmp_path)
    for h in procs.HIERARCHIES:
        (tmp_path / h / "clusterctl-lab/lab01/payload/system.slice/ssh.service").mkdir(parents=True)
        (tmp_path / h / "clusterctl-lab/lab01/supervisor").mkdir(parents=True)
    assert len(procs.cgroup_dirs("clusterctl-lab/lab01")) == 2
    procs.remove_cgroup_tree("clusterctl-lab")
    assert procs.cgroup_dirs("clusterctl-lab") == []


def test_pids_of_a_cgroup_include_descendants(tmp_path, monkeypatch):
    monkeypatch.setattr(procs, "CGROUP_ROOT", tmp_path)
    d = tmp_path / "unified/g"
    (d / "sub").mkdir(parents=True)
    (d / "cgroup.procs").write_text("10\n11\n")
    (d / "sub/cgroup.procs").write_text("12\n")
    assert procs.cgroup_pids("g") == {10, 11, 12}
    assert procs.read_pidfile(tmp_path / "none") is None


def test_a_reused_pid_is_not_ours(tmp_path):
    marker = str(tmp_path / "hosts/lab01") + "/"
    p = subprocess.Popen(["sh", "-c", "sleep 5", marker + "nspawn.pid"])  # marker as $0
    q = subprocess.Popen(["sleep", "5"])
    try:
        assert procs.is_ours(p.pid, marker)
        assert not procs.is_ours(q.pid, marker)
        assert not procs.is_ours(p.pid, str(tmp_path / "hosts/lab010") + "/")
    finally:
        for x in (p, q):
            x.kill()
            x.wait()
    assert not procs.is_ours(p.pid, marker)
