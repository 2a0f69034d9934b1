"""Tier 3: the installed ``clusterctl`` command, end to end, against the lab.

Each test runs the console script as an operator would (a subprocess, the
lab's generated inventory, real OpenSSH/systemd hosts) and checks what the
operator relies on: the output, the JSON, and the exit code.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time


from clusterctl.inventory.loader import load_inventory
from support.lab_fixture import LabSession

CLI = shutil.which("clusterctl") or "clusterctl"


def clusterctl(lab: LabSession, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CLUSTERCTL_INVENTORY=str(lab.inventory), COLUMNS="200")
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
    )


def test_the_generated_inventory_validates(lab: LabSession) -> None:
    res = clusterctl(lab, "inventory", "validate")
    assert res.returncode == 0, res.stderr
    assert f"{len(lab.names)} hosts" in res.stdout


def test_ping_reaches_every_host_and_exits_ok(lab: LabSession) -> None:
    res = clusterctl(lab, "ping", "all", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(res.stdout)
    text = json.dumps(rows)
    for name in lab.names:
        assert name in text
    assert "unreachable" not in text and "auth_failed" not in text


def test_exec_gathers_identical_output_under_one_node_set(lab: LabSession) -> None:
    res = clusterctl(lab, "exec", "all", "--", "systemctl", "is-system-running")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "running" in res.stdout
    # Identical output is printed once, headed by the folded node set.
    assert res.stdout.count("running") == 1
    prefix = lab.names[0].rstrip("0123456789")
    assert f"{prefix}[" in res.stdout


def test_exec_exit_code_is_the_worst_remote_status(lab: LabSession) -> None:
    first = lab.names[0]
    script = f'if [ "$(hostname)" = {first} ]; then exit 7; fi; exit 0'
    # As with ssh, the words after -- are joined into one remote shell command.
    res = clusterctl(lab, "exec", "all", "--", script)
    assert res.returncode == 7, res.stdout + res.stderr
    assert first in res.stdout


def test_exec_as_the_non_root_user_uses_sudo(lab: LabSession) -> None:
    last = lab.names[-1]  # the host that keeps Debian's sshd defaults and logs in as 'ops'
    res = clusterctl(lab, "exec", last, "--sudo", "--", "id", "-u")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0" in res.stdout.split()


def test_a_unit_written_through_exec_runs_and_its_journal_is_readable(lab: LabSession) -> None:
    host = lab.names[0]
    unit = (
        "[Unit]\nDescription=e2e\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/echo e2e-unit-started\n"
    )
    script = (
        f"printf %s {shlex.quote(unit)} > /etc/systemd/system/clusterctl-e2e.service && "
        "systemctl daemon-reload && systemctl start clusterctl-e2e && "
        "systemctl is-active clusterctl-e2e && journalctl -u clusterctl-e2e --no-pager"
    )
    try:
        res = clusterctl(lab, "exec", host, "--", script)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "active" in res.stdout and "e2e-unit-started" in res.stdout
    finally:
        clusterctl(
            lab,
            "exec",
            host,
            "--",
            "systemctl stop clusterctl-e2e; rm -f /etc/systemd/system/clusterctl-e2e.service; systemctl daemon-reload",
        )


def _facts(lab: LabSession, pattern: str) -> dict:
    res = clusterctl(lab, "facts", pattern, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)


def _gpu_devices(doc: dict) -> list[dict]:
    facts = doc.get("facts", doc)
    return facts["gpus"]["devices"]


def test_facts_report_the_simulated_gpus_of_every_host(lab: LabSession) -> None:
    inventory = load_inventory(str(lab.inventory))
    docs = _facts(lab, "all")
    assert sorted(docs) == sorted(lab.names)
    for name, doc in docs.items():
        devices = _gpu_devices(doc)
        assert len(devices) == inventory.hosts[name].gpus.count > 0, name
        assert all(d["memory_total"] > 0 for d in devices)


def test_injected_xid_and_lost_gpu_show_in_facts_then_heal(lab: LabSession) -> None:
    host = lab.names[1]
    try:
        assert clusterctl(lab, "lab", "inject", host, "xid", "--gpu", "3", "--code", "79").returncode == 0
        assert clusterctl(lab, "lab", "inject", host, "gpu-lost", "--gpu", "1").returncode == 0
        docs = _facts(lab, "all")
        facts = docs[host].get("facts", docs[host])
        log = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in facts["kernel_log"]["lines"])
        assert "Xid" in log and "79" in log
        lost = [d for d in _gpu_devices(docs[host]) if d.get("lost")]
        assert [d["index"] for d in lost] == [1]
        for other in lab.names:
            if other != host:
                assert not any(d.get("lost") for d in _gpu_devices(docs[other])), other
    finally:
        assert clusterctl(lab, "lab", "heal", host).returncode == 0
    time.sleep(0.2)
    assert not any(d.get("lost") for d in _gpu_devices(_facts(lab, host)[host]))


def test_a_frozen_host_is_a_timeout_row_not_a_stalled_run(lab: LabSession) -> None:
    host = lab.names[0]
    try:
        assert clusterctl(lab, "lab", "inject", host, "freeze").returncode == 0
        start = time.monotonic()
        res = clusterctl(lab, "ping", "all", "--connect-timeout", "3", "--json")
        took = time.monotonic() - start
        assert res.returncode == 2, res.stdout + res.stderr
        assert took < 20
        assert host in res.stdout
    finally:
        clusterctl(lab, "lab", "inject", host, "thaw")
