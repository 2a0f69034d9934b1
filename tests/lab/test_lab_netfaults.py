"""Network faults are real kernel behaviour, measured from the control side."""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import time

import pytest

from clusterctl.lab import manager, netfaults


@pytest.fixture
def healed(lab):
    yield lab
    for h in lab.hosts:
        netfaults.heal(lab.cfg, h)


#: Runs on the host: reads stdin to EOF, prints bytes and seconds from the
#: first byte to the last (so SSH setup time is not counted).
_SINK = (
    "import sys, time\n"
    "b = sys.stdin.buffer; n = len(b.read(65536)); t = time.monotonic()\n"
    "while True:\n"
    "    d = b.read(65536)\n"
    "    if not d: break\n"
    "    n += len(d)\n"
    "print(n, time.monotonic() - t)\n"
)


def _mbit_per_s(lab, name: str, direction: str, nbytes: int) -> float:
    """Throughput between first and last byte, measured at the receiving end."""
    if direction == "to-host":
        cp = subprocess.run(
            lab.ssh_argv(name, f"python3 -c {shlex.quote(_SINK)}"),
            input=b"\0" * nbytes,
            capture_output=True,
            timeout=120,
        )
        assert cp.returncode == 0, cp.stderr
        got, seconds = cp.stdout.split()
        first = 65536
        assert int(got) == nbytes
        return (nbytes - first) * 8 / float(seconds) / 1e6
    p = subprocess.Popen(
        lab.ssh_argv(name, f"head -c {nbytes} /dev/zero"), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert p.stdout is not None
    first = len(p.stdout.read1(65536))
    t0 = time.monotonic()
    n = first
    while chunk := p.stdout.read1(65536):
        n += len(chunk)
    seconds = time.monotonic() - t0
    assert p.wait(timeout=60) == 0 and n == nbytes
    return (nbytes - first) * 8 / seconds / 1e6


def test_bandwidth_limit_is_enforced_both_ways(healed):
    lab = healed
    name = lab.names[0]
    h = lab.host(name)
    netfaults.bandwidth(lab.cfg, h, "40mbit")
    nbytes = 5_000_000  # 1 s at 40 Mbit/s
    for direction in ("to-host", "from-host"):
        rate = _mbit_per_s(lab, name, direction, nbytes)
        # Never above the limit (+ the bucket); the floor is loose because
        # the CPUs may be shared with other work while this runs.
        assert 10 < rate < 48, (direction, rate)
    assert "bandwidth 40mbit" in manager.status(lab.cfg)["hosts"][0]["faults"]
    netfaults.heal(lab.cfg, h)
    assert _mbit_per_s(lab, name, "to-host", 4 * nbytes) > 100


def _ping_loss(address: str, count: int) -> float:
    cp = subprocess.run(
        ["ping", "-q", "-c", str(count), "-i", "0.002", "-W", "1", address], capture_output=True, text=True, timeout=60
    )
    m = re.search(r"([\d.]+)% packet loss", cp.stdout)
    assert m, cp.stdout + cp.stderr
    return float(m.group(1))


def test_loss_drops_the_given_share_each_way(healed):
    lab = healed
    h = lab.hosts[1]
    netfaults.loss(lab.cfg, h, 10)
    # 10 % each way: an echo round trip is lost with p = 1 - 0.9**2 = 19 %.
    assert 9 <= _ping_loss(h.address, 400) <= 30
    netfaults.heal(lab.cfg, h)
    assert _ping_loss(h.address, 100) == 0


def _banner(address: str, timeout: float) -> bytes | None:
    """Connect to port 22 and return sshd's first bytes (None: connected, no answer)."""
    with socket.create_connection((address, 22), timeout=timeout) as s:
        s.settimeout(timeout)
        try:
            return s.recv(64)
        except socket.timeout:
            return None


def test_cut_host_cannot_be_reached_until_healed(healed):
    lab = healed
    h = lab.hosts[2]
    netfaults.cut(lab.cfg, h)
    with pytest.raises(OSError):
        _banner(h.address, 1.0)
    netfaults.heal(lab.cfg, h)
    assert lab.run(h.name, "hostname", timeout=20).stdout.strip() == h.name


def test_frozen_host_accepts_tcp_but_never_answers_and_thaw_recovers(healed):
    lab = healed
    h = lab.hosts[-1]
    netfaults.freeze(lab.cfg, h)
    assert manager.status(lab.cfg)["hosts"][-1]["frozen"] is True
    assert _banner(h.address, 1.5) is None  # the kernel completed the handshake
    with pytest.raises(subprocess.TimeoutExpired):
        lab.run(h.name, "true", timeout=3)
    netfaults.thaw(lab.cfg, h)
    assert _banner(h.address, 5).startswith(b"SSH-2.0-OpenSSH")
    assert lab.run(h.name, "systemctl is-system-running", timeout=20).stdout.strip() == "running"
