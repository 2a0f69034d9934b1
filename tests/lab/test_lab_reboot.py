"""`systemctl reboot` on a lab host reboots it: same disk, fresh /run."""

from __future__ import annotations

import subprocess
import time

from clusterctl.lab import procs


def test_reboot_keeps_the_disk_and_comes_back_running(lab):
    name = lab.names[0]
    nspawn_pid = procs.read_pidfile(lab.host_dir(name) / "nspawn.pid")
    lab.run(name, "echo kept > /root/before-reboot; touch /run/volatile-marker", check=True)
    try:
        lab.run(name, "systemctl reboot", timeout=10)
    except subprocess.TimeoutExpired:
        pass  # the session may die with the host
    deadline = time.monotonic() + 60
    state = ""
    while time.monotonic() < deadline:
        new_pid = procs.read_pidfile(lab.host_dir(name) / "nspawn.pid")
        if new_pid and new_pid != nspawn_pid:
            cp = lab.run(name, "systemctl is-system-running --wait", timeout=30)
            state = cp.stdout.strip()
            if state == "running":
                break
        time.sleep(0.2)
    assert state == "running"
    cp = lab.run(name, "cat /root/before-reboot; test -e /run/volatile-marker && echo still-there")
    assert cp.stdout.split() == ["kept"]
    lab.run(name, "rm -f /root/before-reboot")
