"""Simulated GPUs and NICs as seen over SSH on real lab hosts (nspawn + sshd).

Faults go through the lab's own ``inject``/``heal`` dispatch, as ``clusterctl
lab inject`` does; every test heals the host it touched.  The last test runs
``clusterctl facts``: the probe, unchanged, reads the fake NVML library, the
fake /sys/class tree and the host's kern.log.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.lab import faults as lab_faults

PYNVML = Path(__import__("pynvml").__file__).read_text()


@pytest.fixture
def healed(lab):
    touched: list[str] = []
    yield touched
    for name in touched:
        lab_faults.heal(lab.cfg, lab.host(name))


def _pause(lab, name: str, nic: str = "eth2") -> tuple[int, float, float]:
    """rx_prio3_pause, and the host's clock just before and just after reading it."""
    cp = lab.run(name, f"date +%s.%N; ethtool -S {nic}; date +%s.%N", check=True)
    lines = cp.stdout.splitlines()
    m = re.search(r"^     rx_prio3_pause: (\d+)$", cp.stdout, re.M)
    assert m, cp.stdout
    return int(m[1]), float(lines[0]), float(lines[-1])


def test_real_pynvml_on_each_host_sees_its_simulated_gpus(lab):
    uuids = set()
    for name in lab.names:
        lab.run(name, "mkdir -p /tmp/pynvml && cat > /tmp/pynvml/pynvml.py", input=PYNVML, check=True)
        cp = lab.run(
            name,
            "cd /tmp/pynvml && python3 -c 'import json, pynvml as N; N.nvmlInit(); "
            "hs = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]; "
            "print(json.dumps([[N.nvmlDeviceGetName(h), N.nvmlDeviceGetUUID(h), "
            "N.nvmlDeviceGetPciInfo(h).busId] for h in hs]))'",
            check=True,
        )
        gpus = json.loads(cp.stdout)
        assert len(gpus) == 8 and all(g[0] == "NVIDIA H100 80GB HBM3" for g in gpus)
        assert gpus[0][2] == "00000000:18:00.0"
        uuids |= {g[1] for g in gpus}
    assert len(uuids) == 8 * len(lab.names)


def test_lost_gpu_fails_on_that_host_only(lab, healed):
    victim, other = lab.names[0], lab.names[1]
    healed.append(victim)
    count = "cat /var/log/kern.log 2>/dev/null | wc -l"
    other_lines = lab.run(other, count).stdout
    lab_faults.inject(lab.cfg, lab.host(victim), "gpu-lost", options=["gpu=3"])
    code = (
        "cd /tmp/pynvml && python3 -c 'import pynvml as N; N.nvmlInit(); "
        "print(N.nvmlDeviceGetCount())\n"
        "try:\n N.nvmlDeviceGetHandleByIndex(3); print(\"ok\")\n"
        "except N.NVMLError_GpuIsLost as e: print(e)'"
    )
    for name in (victim, other):
        lab.run(name, "mkdir -p /tmp/pynvml && cat > /tmp/pynvml/pynvml.py", input=PYNVML, check=True)
    assert lab.run(victim, code).stdout.split("\n")[:2] == ["8", "GPU is lost"]
    assert lab.run(other, code).stdout.split("\n")[:2] == ["8", "ok"]
    log = lab.run(victim, "grep -h 'NVRM: Xid' /var/log/kern.log").stdout
    assert "NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." in log
    assert lab.run(other, count).stdout == other_lines  # logs are per host


def test_pause_storm_makes_the_pause_counter_move_in_ethtool(lab, healed):
    name = lab.names[1]
    healed.append(name)
    v0, _, _ = _pause(lab, name)
    time.sleep(1.0)
    v1, _, _ = _pause(lab, name)
    assert v1 == v0, "no pauses on a healthy port"
    msg = lab_faults.inject(lab.cfg, lab.host(name), "pause-storm", options=["per_s=20000", "paused=0.9"])
    assert "pause storm on priority 3" in msg
    v2, t2a, t2b = _pause(lab, name)
    time.sleep(1.0)
    v3, t3a, t3b = _pause(lab, name)
    # Each value was taken between the two `date`s around its ethtool run.
    assert 20000 * (t3a - t2b) - 1 <= v3 - v2 <= 20000 * (t3b - t2a) + 1
    # dcb shows the same counter as PFC indications.
    ind = lab.run(name, "dcb -s pfc show dev eth2").stdout
    assert re.search(r"^indications 0:0 1:0 2:0 3:\d+ ", ind, re.M)


def test_sysfs_counters_tick_inside_the_host(lab, healed):
    name = lab.names[2]
    healed.append(name)
    lab_faults.inject(lab.cfg, lab.host(name), "cnp", options=["nic=eth3", "per_s=5000"])
    f = "/sys/class/infiniband/mlx5_1/ports/1/hw_counters/np_cnp_sent"
    a = int(lab.run(name, f"cat {f}", check=True).stdout)
    time.sleep(2.5)
    b = int(lab.run(name, f"cat {f}", check=True).stdout)
    assert b - a >= 5000  # the ticker rewrites the file about once a second
    out = lab.run(
        name,
        "grep -H . /sys/class/infiniband/mlx5_0/ports/1/{state,rate,link_layer}; "
        "cat /sys/class/net/eth2/mtu; ip -o link show dev eth2",
    ).stdout
    assert "/sys/class/infiniband/mlx5_0/ports/1/state:4: ACTIVE" in out
    assert "rate:400 Gb/sec (4X NDR)" in out and "link_layer:Ethernet" in out
    assert "\n4200\n" in out and "mtu 4200" in out
    mac = lab.run(name, "cat /sys/class/net/eth2/address", check=True).stdout.strip()
    assert f"link/ether {mac} " in out  # the netns link and the fake sysfs agree
    assert lab.run(name, "echo 1 > /sys/class/net/eth2/mtu").returncode != 0  # read-only, as sysfs


def test_qos_misconfig_shows_in_mlnx_qos(lab, healed):
    name = lab.names[0]
    healed.append(name)
    before = lab.run(name, "mlnx_qos -i eth2", check=True).stdout
    assert "\tenabled     0   0   0   1   0   0   0   0   \n" in before
    lab_faults.inject(lab.cfg, lab.host(name), "qos-pfc", options=["priority=4"])
    after = lab.run(name, "mlnx_qos -i eth2", check=True).stdout
    assert "\tenabled     0   0   0   0   1   0   0   0   \n" in after
    assert "rx_prio4_pause:" in lab.run(name, "ethtool -S eth2").stdout


def _facts(lab) -> dict:
    """``clusterctl facts all --json``: host name -> facts document."""
    cp = subprocess.run(
        [sys.executable, "-m", "clusterctl.cli.main", "facts", "all", "-i", str(lab.inventory), "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert cp.returncode == 0, cp.stderr[-2000:]
    return json.loads(cp.stdout)


def test_facts_report_gpus_nics_an_xid_a_lost_gpu_and_moving_cnp_counters(lab, healed):
    a, b, c = lab.names[:3]
    healed.extend([a, b, c])
    lab_faults.inject(lab.cfg, lab.host(a), "xid", options=["code=48", "gpu=1"])
    lab_faults.inject(lab.cfg, lab.host(b), "gpu-lost", options=["gpu=2"])
    lab_faults.inject(lab.cfg, lab.host(c), "cnp", options=["per_s=10000"])
    first = _facts(lab)
    time.sleep(2.0)
    second = _facts(lab)

    for name in lab.names:
        f = first[name]
        assert f["gpus"]["available"] and f["gpus"]["count"] == 8
        assert f["gpus"]["devices"][0]["name"] == "NVIDIA H100 80GB HBM3"
        rdma = {n["netdev"]: n["rdma"] for n in f["nics"] if n.get("rdma")}
        assert rdma["eth2"]["device"] == "mlx5_0" and rdma["eth2"]["state"] == "ACTIVE"
        assert {n["netdev"]: n["mtu"] for n in f["nics"]}["eth3"] == 4200

    xid_lines = [ln["text"] for ln in first[a]["kernel_log"]["lines"] if "NVRM: Xid" in ln["text"]]
    assert any("Xid (PCI:0000:2a:00): 48," in t for t in xid_lines), xid_lines
    assert not [ln for ln in first[c]["kernel_log"]["lines"] if "NVRM: Xid" in ln["text"]]

    lost = [d for d in first[b]["gpus"]["devices"] if d.get("lost")]
    assert len(lost) == 1 and all(not d.get("lost") for d in first[a]["gpus"]["devices"])

    def cnp(facts: dict) -> int:
        port = next(n["rdma"] for n in facts["nics"] if n["netdev"] == "eth2")
        return int(port["hw_counters"]["np_cnp_sent"])

    assert cnp(second[c]) - cnp(first[c]) >= 10000
    assert cnp(second[a]) == cnp(first[a])


def test_cli_inject_and_heal_reach_the_simulated_hardware(lab, healed):
    name = lab.names[1]
    healed.append(name)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "clusterctl.cli.main", "lab", *args], capture_output=True, text=True, timeout=60
        )

    cp = cli("inject", name, "pause-storm", "--per-s", "1000", "--nic", "eth3")
    assert cp.returncode == 0, cp.stderr
    assert "eth3: rx pause storm on priority 3 at 1000/s" in cp.stdout
    bad = cli("inject", name, "pause-storm", "--colour", "red")
    assert bad.returncode == 3 and "bad option" in bad.stderr and "per_s" in bad.stderr
    a = int(re.search(r"rx_prio3_pause: (\d+)", lab.run(name, "ethtool -S eth3").stdout)[1])
    assert cli("heal", name).returncode == 0
    b = int(re.search(r"rx_prio3_pause: (\d+)", lab.run(name, "ethtool -S eth3").stdout)[1])
    time.sleep(1.0)
    c = int(re.search(r"rx_prio3_pause: (\d+)", lab.run(name, "ethtool -S eth3").stdout)[1])
    assert a <= b == c  # healed: the counter keeps its value and stops moving
