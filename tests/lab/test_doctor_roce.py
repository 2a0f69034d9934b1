"""``clusterctl doctor`` RoCE checks on the lab: the probe reads the simulated
ConnectX ports (ethtool -S, hw_counters, mlnx_qos or dcb) over SSH, twice
``--interval`` apart on the node, and the analyzers name the host, the leaf
and the action for each injected fault.

Works with the shared 4-host lab (two leaves of two: lab[01-02], lab[03-04];
lab03 has the inbox driver flavour, read with dcb; lab04 is reached as a
non-root user) and with larger labs (leaves read from the inventory).
"""

from __future__ import annotations

import json
import re

import yaml

import pytest

from clusterctl.cli.main import main
from clusterctl.inventory.loader import load_inventory
from clusterctl.lab.hardware import faults

INTERVAL = "3"


def doctor(lab, capsys, checks: str) -> tuple[int, dict]:
    rc = main(["doctor", "all", "-i", str(lab.inventory), "--json", "--checks", checks, "--interval", INTERVAL])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def problems(report: dict, check: str) -> list[dict]:
    return [f for f in report["findings"] if f["check"] == check and f["severity"] != "OK"]


def leaves(lab) -> dict[str, list[str]]:
    inv = load_inventory(str(lab.inventory))
    out: dict[str, list[str]] = {}
    for name, h in inv.hosts.items():
        out.setdefault(h.labels["leaf"], []).append(name)
    return out


@pytest.fixture
def healed(healed_hosts: list[str]) -> list[str]:
    return healed_hosts


def test_healthy_lab_reports_nothing_above_ok(lab, capsys, healed):
    rc, rep = doctor(lab, capsys, "roce,net.data")
    bad = [f for f in rep["findings"] if f["severity"] != "OK"]
    assert rc == 0 and not bad, bad
    checked = {(f["check"], f["host"]) for f in rep["findings"]}
    for check in ("roce.pfc", "roce.congestion", "roce.discards", "roce.qos", "net.data"):
        assert {h for c, h in checked if c == check} == set(lab.names), check


def test_pause_storm_on_one_host_names_that_host_and_its_cable(lab, capsys, healed):
    victim = lab.names[1]
    healed.append(victim)
    faults.inject(lab.host_dir(victim), "pause-storm", nic="eth2", priority=3, per_s=20000, paused=0.9)
    rc, rep = doctor(lab, capsys, "roce.pfc")
    found = problems(rep, "roce.pfc")
    assert rc == 2 and len(found) == 1, found
    f = found[0]
    assert (f["host"], f["subject"], f["severity"]) == (victim, "nic:eth2", "CRIT")
    # 0.9 s of every second paused, give or take the jitter of when ethtool read its counters
    assert re.search(r"paused (8[5-9]|9[0-5])% of the time on priority 3 \(", f["message"]), f["message"]
    assert "cable" in f["action"] and "do not show" in f["action"]


def test_cnp_incast_on_one_leafs_hosts_names_the_leaf(lab, capsys, healed):
    by_leaf = leaves(lab)
    leaf = next(name for name, hosts in by_leaf.items() if lab.names[-1] in hosts)
    hot = by_leaf[leaf]
    assert len(hot) >= 2 and len(by_leaf) >= 2, (
        f"leaves {by_leaf}: a lab brought up before each rack had its own leaf; `clusterctl lab down` and run again"
    )
    for h in hot:
        healed.append(h)
        faults.inject(lab.host_dir(h), "cnp", nic="eth2", per_s=50000)
    rc, rep = doctor(lab, capsys, "roce.congestion")
    found = problems(rep, "roce.congestion")
    assert rc == 1
    leaf_rows = [f for f in found if f["host"] is None]
    assert [f["subject"] for f in leaf_rows] == [f"leaf:{leaf}"], found
    assert f"every host under {leaf}" in leaf_rows[0]["message"]
    per_host = [f for f in found if f["host"]]
    assert {f["host"] for f in per_host} == set(hot)
    assert all(f["subject"] == "nic:eth2" and f"leaf switch {leaf}" in f["action"] for f in per_host)


@pytest.mark.parametrize("which", [2, -1], ids=["inbox-dcb", "mlnx-nonroot"])
def test_pfc_on_the_wrong_priority_is_the_odd_one_out(lab, capsys, healed, which):
    victim = lab.names[which]
    healed.append(victim)
    faults.inject(lab.host_dir(victim), "qos-pfc", nic="eth2", priority=4)
    rc, rep = doctor(lab, capsys, "roce.qos")
    found = problems(rep, "roce.qos")
    assert rc == 2 and len(found) == 1, found
    f = found[0]
    assert (f["host"], f["subject"], f["severity"]) == (victim, "nic:eth2", "CRIT")
    assert f["message"] == (
        f"{victim} eth2: PFC on priority 4; the profile and the other {len(lab.names) - 1} hosts use 3"
    )


def test_trust_pcp_on_one_host(lab, capsys, healed):
    victim = lab.names[0]
    healed.append(victim)
    faults.inject(lab.host_dir(victim), "qos-trust", nic="eth3", trust="pcp")
    rc, rep = doctor(lab, capsys, "roce.qos")
    found = problems(rep, "roce.qos")
    assert rc == 2 and [(f["host"], f["subject"], f["severity"]) for f in found] == [(victim, "nic:eth3", "CRIT")]
    assert found[0]["message"] == (
        f"{victim} eth3: trust pcp; the profile and the other {len(lab.names) - 1} hosts use dscp"
    )
    assert "priority 0" in found[0]["action"]


def test_instance_across_hosts_with_nccl_ib_tc_unset(lab, capsys, healed, tmp_path):
    """Where the NIC sets no global traffic class (the inbox host), NCCL's default
    class puts RoCE on priority 0; MLNX_OFED hosts' global class 106 covers it."""
    inbox = lab.names[2]
    other = lab.names[0]
    data = yaml.safe_load(lab.inventory.read_text())
    data.setdefault("engines", {})["nccl-test"] = {"path": "/opt/vllm/bin/vllm", "version": "0.11.0"}
    data.setdefault("models", {})["nccl-test"] = {"path": "/models/nccl-test"}
    data["instances"] = {
        "tp-across": {
            "model": "nccl-test",
            "engine": "nccl-test",
            "port": 8100,
            "placement": [f"{other}:0", f"{other}:1", f"{inbox}:0", f"{inbox}:1"],
            "env": {"NCCL_SOCKET_IFNAME": "=eth2"},
        }
    }
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    rc = main(["doctor", "all", "-i", str(inv), "--json", "--checks", "nccl"])
    rep = json.loads(capsys.readouterr().out)
    found = problems(rep, "nccl.env")
    assert rc == 2 and [(f["host"], f["subject"], f["severity"]) for f in found] == [
        (inbox, "instance:tp-across", "CRIT")
    ], found
    assert "NCCL_IB_TC unset" in found[0]["message"] and "NCCL_IB_TC: '106'" in found[0]["action"]


def test_active_without_perftest_is_unknown_per_host(lab, capsys, healed):
    rc = main(["doctor", "all", "-i", str(lab.inventory), "--json", "--checks", "roce.qos", "--active"])
    rep = json.loads(capsys.readouterr().out)
    rows = [f for f in rep["findings"] if f["check"] == "roce.active"]
    assert rc == 3 and sorted(f["host"] for f in rows) == sorted(lab.names)
    assert all(f["severity"] == "UNKNOWN" and "ib_write_bw (perftest) is not installed" in f["message"] for f in rows)


def test_running_unit_on_the_management_nic_and_its_memlock(lab, capsys, healed, tmp_path):
    """A transient ``clusterctl-INSTANCE.service`` whose environment puts NCCL on
    eth0 (management) and VLLM_HOST_IP on the management address, with an 8 MiB
    LimitMEMLOCK: found on that host from the unit itself (the inventory's env is
    fine), with a secret in the same environment never reaching the report."""
    host, other = lab.names[1], lab.names[0]
    data = yaml.safe_load(lab.inventory.read_text())
    mgmt_ip = load_inventory(str(lab.inventory)).hosts[host].address
    data.setdefault("engines", {})["nccl-test"] = {"path": "/opt/vllm/bin/vllm", "version": "0.11.0"}
    data.setdefault("models", {})["nccl-test"] = {"path": "/models/nccl-test"}
    data["instances"] = {
        "tp-run": {
            "model": "nccl-test",
            "engine": "nccl-test",
            "port": 8100,
            "placement": [f"{other}:0", f"{other}:1", f"{host}:0", f"{host}:1"],
            "env": {"NCCL_SOCKET_IFNAME": "=eth2", "NCCL_IB_TC": "106"},
        }
    }
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    unit = "clusterctl-tp-run.service"
    lab.run(
        host,
        f"systemctl reset-failed {unit} 2>/dev/null; systemd-run --unit {unit} --collect "
        "-p LimitMEMLOCK=8M -p Environment=NCCL_SOCKET_IFNAME=eth0 -p Environment=NCCL_IB_TC=106 "
        f"-p Environment=VLLM_HOST_IP={mgmt_ip} -p Environment=HF_TOKEN=hf_lab_secret_value "
        "sleep 600",
        check=True,
    )
    try:
        rc = main(["doctor", "all", "-i", str(inv), "--json", "--checks", "nccl,host.rdma_prereqs", "--interval", "0"])
        out = capsys.readouterr().out
    finally:
        lab.run(host, f"systemctl stop {unit}")
    assert "hf_lab_secret_value" not in out
    rep = json.loads(out)
    found = problems(rep, "nccl.env")
    assert rc >= 1 and [(f["host"], f["severity"]) for f in found] == [(host, "WARN"), (host, "WARN")], found
    assert found[0]["message"] == (
        f"tp-run: NCCL_SOCKET_IFNAME=eth0 in the running unit {unit} selects the management NIC eth0"
    )
    assert found[1]["message"].startswith(f"tp-run: VLLM_HOST_IP={mgmt_ip} in the running unit {unit} is ")
    mem = [f for f in problems(rep, "host.rdma_prereqs") if f["subject"] == f"unit:{unit}"]
    assert [(f["host"], f["severity"]) for f in mem] == [(host, "WARN")], mem
    assert "LimitMEMLOCK=8388608 bytes (8 MiB)" in mem[0]["message"]


#: A stand-in for perftest's ib_write_bw (no RDMA exists here): the server
#: accepts one TCP connection on -p, the client connects to the address given
#: last, waits -D seconds and both print perftest's result table; the client's
#: average comes from /etc/clusterctl-test-bw (MB/sec), 44578.12 by default.
FAKE_IB_WRITE_BW = r'''#!/usr/bin/python3
import socket, sys, time
a = sys.argv[1:]
port, dur = int(a[a.index("-p") + 1]), float(a[a.index("-D") + 1])
client = not a[-1].startswith("-") and a[-2] not in ("-d", "-i", "-D", "-p", "-x")
try:
    bw = open("/etc/clusterctl-test-bw").read().strip()
except OSError:
    bw = "44578.12"
if client:
    try:
        s = socket.create_connection((a[-1], port), timeout=2)
    except OSError:
        print(" Couldn't connect to %s:%d" % (a[-1], port)); sys.exit(1)
    s.sendall(b"go"); time.sleep(dur); s.close()
else:
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port)); srv.listen(1); c, _ = srv.accept(); c.recv(2); c.close()
print(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]")
print(" 65536      3423900          0.00               %s\t\t   0.713250" % bw)
'''


def test_active_pairs_over_ssh_with_a_stand_in_ib_write_bw(lab, capsys, healed, tmp_path, monkeypatch):
    """The pair plumbing end to end: facts find the program, pairs run over SSH at
    once (server, then the client retrying until it listens), the client's table
    is parsed and judged; a slow pair is WARN.  The numbers are the stand-in's."""
    import shutil
    from pathlib import Path

    checks = tmp_path / "checks"
    shutil.copytree(Path(__file__).resolve().parents[2] / "checks", checks)
    data = yaml.safe_load((checks / "roce.yaml").read_text())
    data["active"] = {"duration_s": 1, "tcp_port": 18515, "slack_s": 10}
    (checks / "roce.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("CLUSTERCTL_CHECKS_DIR", str(checks))
    names = lab.names[:4] if len(lab.names) >= 4 else lab.names
    slow = names[1]
    for h in lab.names:
        lab.run(
            h,
            "cat > /usr/local/bin/ib_write_bw && chmod 755 /usr/local/bin/ib_write_bw",
            input=FAKE_IB_WRITE_BW,
            check=True,
        )
    lab.run(slow, "echo 30000.00 > /etc/clusterctl-test-bw", check=True)
    try:
        rc = main(
            ["doctor", "all", "-i", str(lab.inventory), "--json", "--checks", "roce.qos", "--active", "--interval", "0"]
        )
        rep = json.loads(capsys.readouterr().out)
    finally:
        for h in lab.names:
            lab.run(h, "rm -f /usr/local/bin/ib_write_bw /etc/clusterctl-test-bw")
    rows = [f for f in rep["findings"] if f["check"] == "roce.active"]
    pairs = {(f["host"], f["subject"]): f for f in rows}
    order = lab.names
    want = {(order[i + 1], f"pair:{order[i]}") for i in range(0, len(order) - 1, 2)}
    if len(order) % 2:
        want.add((order[-1], f"pair:{order[0]}"))
    assert set(pairs) == want, rows
    assert pairs[(slow, f"pair:{order[0]}")]["severity"] == "WARN"
    assert (
        "251.7 Gb/s average over 1 s, below 320 Gb/s for a 400 Gb/s link"
        in pairs[(slow, f"pair:{order[0]}")]["message"]
    )
    assert all(f["severity"] == "OK" for k, f in pairs.items() if k[0] != slow)
    assert rc == 1


def test_port_drops_of_lossy_traffic_warn_and_lossless_drops_are_critical(lab, capsys, healed):
    """rx_discards_phy counts the whole port: drops of priority 0 (TCP) alone are a WARN;
    the same on the RoCE priority 3 is CRIT (docs/doctor-roce.md, roce.discards)."""
    victim = lab.names[0]
    healed.append(victim)
    faults.inject(lab.host_dir(victim), "discards", nic="eth2", per_s=100, priority=0)
    rc, rep = doctor(lab, capsys, "roce.discards")
    found = problems(rep, "roce.discards")
    assert rc == 1 and [(f["host"], f["subject"], f["severity"]) for f in found] == [(victim, "nic:eth2", "WARN")], (
        found
    )
    assert "lossy traffic such as TCP included" in found[0]["message"]
    faults.inject(lab.host_dir(victim), "discards", nic="eth2", per_s=100, priority=3)
    rc, rep = doctor(lab, capsys, "roce.discards")
    found = problems(rep, "roce.discards")
    assert rc == 2 and [(f["host"], f["severity"]) for f in found] == [(victim, "CRIT")], found
    assert "dropped on the lossless priority 3" in found[0]["message"]
