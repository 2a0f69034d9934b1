"""A second, small lab beside the session's (its own names and /16): up is idempotent and recovers
after a crash, and down leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterctl.lab import container, manager, procs
from clusterctl.lab import state as st
from clusterctl.lab.config import LabConfig
from clusterctl.lab.limits import INOTIFY, REGISTRY
from clusterctl.lab.session import unavailable_reason


@pytest.fixture
def small_cfg(tmp_path):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    # Names and network unique to this process: test runs may overlap on one machine.
    pid = os.getpid()
    letters = "".join(chr(97 + (pid // 26**k) % 26) for k in range(4))
    cfg = LabConfig(lab_dir=tmp_path / "lab", bridge=f"tbr{pid}", net=f"10.{100 + pid % 100}", prefix=f"t{letters}")
    yield cfg
    manager.down(cfg)


def _processes_mentioning(path: Path) -> list[str]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmd and procs.alive(int(p.name)):
            out.append(f"{p.name}: {cmd}")
    return out


def _leftovers(cfg: LabConfig, names: list[str]) -> list[str]:
    found = _processes_mentioning(cfg.lab_dir)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {n}" for n in names if n in netns.split()]
    found += [f"link {n}" for n in [cfg.bridge, *(f"v{x}" for x in names)] if Path("/sys/class/net", n).exists()]
    found += [
        f"mount {line.split()[4]}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if str(cfg.lab_dir) in line
    ]
    found += [f"cgroup {d}" for d in procs.cgroup_dirs(cfg.cgroup_name)]
    found += [f"nspawn run {n}" for n in names if Path("/run/systemd/nspawn/propagate", n).exists()]
    if cfg.lab_dir.exists():
        found.append(f"files {sorted(os.listdir(cfg.lab_dir))}")
    return found


def _assert_inotify_released(cfg: LabConfig, original: int | None) -> None:
    """Our hold is gone; the limit is back to the original once no lab holds it.

    Other labs (another engineer's, the session fixture's) may hold it too.
    """
    try:
        data = json.loads(REGISTRY.read_text())
    except FileNotFoundError:
        if original is not None:
            assert int(INOTIFY.read_text()) == original
        return
    assert str(cfg.lab_dir) not in data["holders"]
    assert int(INOTIFY.read_text()) >= 8192


def test_up_twice_is_a_no_op_and_down_leaves_nothing(small_cfg):
    first = manager.up(small_cfg, hosts=2)
    assert not first.already_up
    assert int(INOTIFY.read_text()) >= 8192
    pids = [h.pid for h in first.state.hosts]
    again = manager.up(small_cfg, hosts=2)
    assert again.already_up
    assert [h.pid for h in again.state.hosts] == pids
    names = [h.spec.name for h in first.state.hosts]
    assert names == [f"{small_cfg.prefix}01", f"{small_cfg.prefix}02"]
    assert _processes_mentioning(small_cfg.lab_dir)  # the check below can see processes
    # The operator's day: a demo workload written where `clusterctl lab workload` puts it.
    from clusterctl.lab import workload

    workload.write(
        small_cfg.inventory_file,
        small_cfg.lab_dir / "workload.yaml",
        small_cfg.lab_dir / "models" / workload.MODEL,
        replicas=2,
        gateway_host=None,
        time_scale=0,
    )
    assert (small_cfg.lab_dir / "models" / workload.MODEL / "config.json").is_file()
    manager.down(small_cfg)
    assert _leftovers(small_cfg, names) == []
    _assert_inotify_released(small_cfg, first.state.inotify_saved)


def test_up_recovers_after_the_hosts_died(small_cfg):
    first = manager.up(small_cfg, hosts=2)
    # A crash: every process of both hosts killed, netns/mounts/cgroups left.
    for h in first.state.hosts:
        for pid in procs.cgroup_pids(container.cgroup_rel(small_cfg, h.spec.name)):
            procs.signal_pid(pid, signal.SIGKILL)
        procs.signal_pid(h.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously
    while any(procs.alive(h.pid) for h in first.state.hosts) and time.monotonic() < deadline:
        time.sleep(0.05)
    events: list[str] = []
    second = manager.up(small_cfg, hosts=2, on_event=events.append)
    assert not second.already_up
    assert "cleaning up an earlier lab first" in events
    assert all(procs.alive(h.pid) for h in second.state.hosts)


def test_up_cleans_up_a_running_lab_whose_state_was_lost(small_cfg):
    first = manager.up(small_cfg, hosts=1)
    old_pid = first.state.hosts[0].pid
    small_cfg.state_file.unlink()
    second = manager.up(small_cfg, hosts=1)
    assert not procs.alive(old_pid)
    assert st.load(small_cfg.state_file).hosts[0].pid == second.state.hosts[0].pid
    cp = subprocess.run(
        manager.ready.ssh_argv(small_cfg, second.state.hosts[0].spec, "systemctl is-system-running"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert cp.stdout.strip() == "running"
    manager.down(small_cfg)
    assert _leftovers(small_cfg, [f"{small_cfg.prefix}01"]) == []


def test_a_failed_start_removes_what_it_created(small_cfg, monkeypatch):
    from clusterctl.errors import LabError

    def broken_prepare(cfg, h, *a, **kw):
        if h.index == 2:
            raise LabError(f"simulated failure while preparing {h.name}")
        return real_prepare(cfg, h, *a, **kw)

    real_prepare = container.prepare
    monkeypatch.setattr(container, "prepare", broken_prepare)
    with pytest.raises(LabError, match="simulated failure"):
        manager.up(small_cfg, hosts=2)
    assert _leftovers(small_cfg, [f"{small_cfg.prefix}01", f"{small_cfg.prefix}02"]) == []
    _assert_inotify_released(small_cfg, None)
