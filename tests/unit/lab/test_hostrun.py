"""The per-host supervisor relaunches a rebooted container and forwards SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.lab import hostrun


@pytest.fixture(autouse=True)
def _keep_pytests_signal_handlers():
    """main() installs SIGTERM/SIGINT handlers; give pytest its own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _no_cgroups(monkeypatch, tmp_path):
    monkeypatch.setattr(hostrun, "CGROUP_ROOT", tmp_path / "nocgroup")


def test_reboot_status_relaunches_then_poweroff_ends(tmp_path, monkeypatch):
    _no_cgroups(monkeypatch, tmp_path)
    counter = tmp_path / "boots"
    script = tmp_path / "fake-nspawn"
    # Boot 1 and 2 "reboot" (exit 133), boot 3 powers off (exit 0).
    script.write_text(f"#!/bin/sh\necho x >> {counter}\n[ $(wc -l < {counter}) -lt 3 ] && exit 133\nexit 0\n")
    script.chmod(0o755)
    pidfile = tmp_path / "nspawn.pid"
    assert hostrun.main(["lab/x", str(pidfile), "--", str(script)]) == 0
    assert counter.read_text().count("x") == 3
    assert not pidfile.exists()


def test_other_failures_are_not_retried(tmp_path, monkeypatch):
    _no_cgroups(monkeypatch, tmp_path)
    assert hostrun.main(["lab/x", str(tmp_path / "p"), "--", "sh", "-c", "exit 1"]) == 1


def test_usage_error():
    assert hostrun.main(["only-one"]) == 2


def test_sigterm_is_forwarded_and_pid_recorded(tmp_path):
    pidfile = tmp_path / "nspawn.pid"
    env = dict(os.environ, PYTHONPATH=str(Path(hostrun.__file__).parents[2]))
    code = (
        "import sys; from clusterctl.lab import hostrun; from pathlib import Path;"
        f"hostrun.CGROUP_ROOT = Path({str(tmp_path / 'nocg')!r});"
        "sys.exit(hostrun.main(sys.argv[1:]))"
    )
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "lab/x",
            str(pidfile),
            "--",
            "sh",
            "-c",
            "trap 'exit 7' TERM; while :; do sleep 0.05; done",
        ],
        env=env,
    )
    deadline = time.monotonic() + 10
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(pidfile.read_text())
    assert child != p.pid
    time.sleep(0.2)  # let sh install its trap
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 7  # the child's own exit status after SIGTERM
