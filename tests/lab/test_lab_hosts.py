"""Each lab host is a real systemd + OpenSSH machine with its own identity."""

from __future__ import annotations

import subprocess
import time

from clusterctl.inventory.loader import load_inventory


def test_every_host_is_running_systemd(lab):
    for name in lab.names:
        cp = lab.run(name, "systemctl is-system-running; systemd-detect-virt")
        assert cp.stdout.split() == ["running", "systemd-nspawn"], (name, cp.stdout, cp.stderr)


def test_hostname_address_and_mac_are_the_hosts_own(lab):
    for h in lab.hosts:
        # netlink, not /sys/class/net: nspawn's sysfs shows the root netns's links.
        cp = lab.run(h.name, "hostname; ip -o -4 addr show dev eth0; ip -o link show dev eth0")
        lines = cp.stdout.splitlines()
        assert lines[0] == h.name
        assert f" {h.address}/16 " in lines[1]
        assert h.mac in cp.stdout


def test_hosts_have_distinct_host_keys_pinned_in_known_hosts(lab):
    keys = {}
    for name in lab.names:
        keys[name] = lab.run(name, "cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub").stdout.strip()
    assert len(set(keys.values())) == len(lab.names)
    known = lab.cfg.known_hosts.read_text()
    for h in lab.hosts:
        assert f"{h.name},{h.address} ssh-ed25519 {keys[h.name]}" in known


def test_wrong_host_key_is_refused(lab, tmp_path):
    """Strict checking is real: a known_hosts with another host's key fails."""
    a, b = lab.hosts[0], lab.hosts[1]
    wrong = (
        lab.cfg.known_hosts.read_text()
        .replace(f"{b.name},{b.address}", "x,y")
        .replace(f"{a.name},{a.address}", f"{b.name},{b.address}")
    )
    kh = tmp_path / "known_hosts"
    kh.write_text(wrong)
    argv = [
        x if not x.startswith("UserKnownHostsFile=") else f"UserKnownHostsFile={kh}"
        for x in lab.ssh_argv(b.name, "true")
    ]
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    assert cp.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in cp.stderr or "verification failed" in cp.stderr


def test_unit_copied_to_a_host_starts_and_its_journal_is_readable(lab):
    name = lab.names[0]
    unit = (
        "[Unit]\nDescription=lab test ticker\n[Service]\n"
        "ExecStart=/bin/sh -c 'while :; do echo tick-$$(hostname); sleep 0.2; done'\n"
    )
    lab.run(name, "cat > /etc/systemd/system/labtest.service", input=unit, check=True)
    lab.run(name, "systemctl daemon-reload && systemctl start labtest", check=True)
    try:
        assert lab.run(name, "systemctl is-active labtest").stdout.strip() == "active"
        deadline = time.monotonic() + 10
        journal = ""
        while time.monotonic() < deadline and f"tick-{name}" not in journal:
            journal = lab.run(name, "journalctl -u labtest --no-pager -o cat").stdout
            time.sleep(0.2)
        assert f"tick-{name}" in journal
        assert "Started labtest.service" in lab.run(name, "journalctl -u labtest --no-pager").stdout
        # The unit file persists in the host's overlay upper dir on the control side.
        assert (lab.host_dir(name) / "upper/etc/systemd/system/labtest.service").read_text() == unit
        # ... and only on that host.
        other = lab.names[1]
        assert lab.run(other, "systemctl cat labtest").returncode != 0
    finally:
        lab.run(name, "systemctl stop labtest; rm -f /etc/systemd/system/labtest.service; systemctl daemon-reload")
    assert lab.run(name, "systemctl is-active labtest").stdout.strip() == "inactive"


def test_non_root_host_keeps_debian_sshd_and_ops_has_sudo(lab):
    last = lab.names[-1]
    cp = lab.run(last, "id -un; sudo -n id -u; ls /etc/ssh/sshd_config.d/", user="ops")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == ["ops", "0"]  # no lab.conf: Debian's defaults
    assert "lab.conf" in lab.run(lab.names[0], "ls /etc/ssh/sshd_config.d/").stdout


def test_written_inventory_loads_and_describes_the_lab(lab):
    inv = load_inventory(str(lab.inventory))
    assert list(inv.hosts) == lab.names
    for h in lab.hosts:
        got = inv.hosts[h.name]
        assert got.address == h.address
        assert got.ssh.host_key_policy == "strict"
        assert got.ssh.identity_file == str(lab.cfg.key_file)
        assert got.gpus.count == 8
    last = inv.hosts[lab.names[-1]]
    assert (last.ssh.user, last.ssh.become) == ("ops", True)
    assert inv.hosts[lab.names[0]].ssh.user == "root"


def test_hosts_reach_each_other_by_name(lab):
    a, b = lab.hosts[0], lab.hosts[1]
    cp = lab.run(a.name, f"ping -c1 -W2 {b.name} >/dev/null && echo ok")
    assert cp.stdout.strip() == "ok", cp.stderr


def test_python3_is_there_for_the_probe(lab):
    assert (
        lab.run(lab.names[0], "python3 -c 'import sys; print(sys.version_info[:2] >= (3, 8))'").stdout.strip() == "True"
    )
