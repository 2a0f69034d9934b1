"""Faults, heal, the fake /sys/class tree, the ticker and the template install."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.errors import LabError
from clusterctl.lab.hardware import describe_host, faults, gpus, install_into_rootfs, nics, sysfs, ticker
from clusterctl.lab.hardware.host import GUEST_HW_DIR, GUEST_LIBNVML, hw_dir
from clusterctl.lab.hardware.tools import nicmodel

from .conftest import freeze

# The XID regex of research gpu-health.md §8, which parsers are expected to use.
XID_RE = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
    r"(?: GPU-I:(?P<gi>\d+))?\): (?P<xid>\d+)(?:, pid=(?P<pid>'<unknown>'|\d+|[^,]*))?"
    r"(?:, name=(?P<name>[^,]*))?(?:, (?P<msg>.*))?$"
)
SYSLOG_RE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}[+-]\d\d:\d\d lab01 kernel: "
    r"\[ *\d+\.\d{6}\] (?P<msg>.*)$"
)
# node-problem-detector's OOM rule.
OOM_RE = re.compile(r"Killed process \d+ (.+) total-vm:\d+kB, anon-rss:\d+kB, file-rss:\d+kB.*")


def _log(host: Path) -> list[str]:
    return (host / "upper/var/log/kern.log").read_text().splitlines()


def test_xid_lines_are_syslog_lines_a_parser_of_real_logs_accepts(make_host):
    host = make_host()
    faults.xid(host, code=48, gpu=1)
    faults.xid(host, code=13, gpu=0, pid=31245)
    faults.gpu_lost(host, gpu=2)
    faults.xid(host, code=94, gpu=3, gi=5, pid=7194)
    lines = _log(host)
    msgs = [SYSLOG_RE.match(ln)["msg"] for ln in lines]
    x48, x13 = XID_RE.search(msgs[0]), XID_RE.search(msgs[1])
    assert (x48["pci"], x48["xid"], x48["pid"], x48["name"]) == ("0000:2a:00", "48", "'<unknown>'", "<unknown>")
    assert x48["msg"].startswith("An uncorrectable double bit error (DBE)")
    assert (x13["pci"], x13["xid"], x13["pid"], x13["name"]) == ("0000:18:00", "13", "31245", "python3")
    uuid = gpus.load(hw_dir(host))["gpus"][2]["uuid"]
    assert msgs[2:5] == [
        f"NVRM: GPU at PCI:0000:3a:00: {uuid}",
        "NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "NVRM: GPU 0000:3a:00.0: GPU has fallen off the bus.",
    ]
    mig = XID_RE.search(msgs[5])
    assert (mig["pci"], mig["gi"], mig["xid"], mig["pid"]) == ("0000:5d:00", "05", "94", "7194")


def test_xid_goes_to_the_merged_root_while_the_host_runs(make_host):
    host = make_host()
    (host / "root/etc").mkdir(parents=True)  # what a mounted overlay root looks like
    faults.xid(host, code=79, gpu=0)
    assert "Xid (PCI:0000:18:00): 79" in (host / "root/var/log/kern.log").read_text()
    assert not (host / "upper/var/log/kern.log").exists()


def test_oom_lines_match_the_node_problem_detector_rule(make_host):
    host = make_host()
    faults.oom(host, pid=5150, process="python3")
    assert any(OOM_RE.search(ln) for ln in _log(host))
    assert any("python3 invoked oom-killer" in ln for ln in _log(host))


def test_options_from_the_cli_are_typed_and_bad_ones_name_the_problem(make_host):
    assert faults.parse_options("xid", ["code=48", "gpu=3", "message=boom"]) == {
        "code": 48,
        "gpu": 3,
        "message": "boom",
    }
    assert faults.parse_options("pause-storm", ["per_s=1e4", "direction=tx"]) == {"per_s": 10000.0, "direction": "tx"}
    assert faults.parse_options("gpu-lost", ["lost=false"]) == {"lost": False}
    with pytest.raises(LabError, match=r"xid: code='x' is not a valid int"):
        faults.parse_options("xid", ["code=x"])
    with pytest.raises(LabError, match="bad option 'colour=red'.*options: code, gpu"):
        faults.parse_options("xid", ["colour=red"])
    with pytest.raises(LabError, match="unknown fault 'melt'.*known: clocks"):
        faults.fault_options("melt")
    host = make_host(gpus=2)
    # The CLI hands numbers and strings; the FAULTS entries convert them.
    assert "x4" in faults.FAULTS["pcie"](host, gpu="1", width=4.0)
    with pytest.raises(LabError, match="gpu=5: this host has 2 GPU"):
        faults.FAULTS["ecc"](host, gpu=5)
    with pytest.raises(LabError, match="nic=eth7: no such data NIC"):
        faults.FAULTS["cnp"](host, nic="eth7")
    with pytest.raises(LabError, match="only .* GiB free"):
        faults.gpu_mem(host, gib=500)
    with pytest.raises(LabError, match="location=sram"):
        faults.ecc(make_host("v", 3, gpus=1, model="V100-SXM2-32GB"), location="sram")
    with pytest.raises(LabError, match="provision the host first"):
        faults.xid(host.parent / "nowhere")


def test_heal_restores_healthy_hardware_without_rewinding_counters(make_host):
    host = make_host(gpus=2)
    faults.gpu_mem(host, gpu=0, gib=5)
    state = gpus.load(hw_dir(host))
    state["gpus"][1]["processes"].append({"pid": 99, "used_mib": 1000})  # the vLLM simulator's
    gpus.save(hw_dir(host), state)
    faults.gpu_lost(host, gpu=1, log=False)
    faults.qos_pfc(host, priority=4)
    faults.link_down(host, nic="eth3")
    faults.pause_storm(host, per_s=1e6)
    before = nicmodel.value(nics.load(hw_dir(host))["nics"]["eth2"], "rx_prio4_pause")
    faults.heal(host)
    g = gpus.load(hw_dir(host))["gpus"]
    assert g[0]["processes"] == [] and g[1]["processes"] == [{"pid": 99, "used_mib": 1000}]
    assert not g[1]["lost"]
    n = nics.load(hw_dir(host))["nics"]
    assert n["eth2"]["qos"] == nicmodel.default_qos() and n["eth3"]["link_up"]
    assert n["eth2"]["counters"]["rx_prio3_pause"][1] == 0.0
    assert nicmodel.value(n["eth2"], "rx_prio4_pause") >= before
    assert (hw_dir(host) / "sys-class/infiniband/mlx5_1/ports/1/state").read_text() == "4: ACTIVE\n"


def test_sysfs_tree_has_what_readers_of_real_nodes_read(make_host):
    host = make_host()
    root = hw_dir(host) / "sys-class"
    assert os.readlink(root / "net/eth0") == "../../devices/virtual/net/eth0"
    assert os.readlink(root / "net/lo") == "../../devices/virtual/net/lo"
    eth2 = root / "net/eth2"
    assert (eth2 / "mtu").read_text() == "4200\n" and (eth2 / "speed").read_text() == "400000\n"
    assert (eth2 / "operstate").read_text() == "up\n" and (eth2 / "device/numa_node").read_text() == "0\n"
    assert (eth2 / "address").read_text() == "02:77:00:00:10:01\n"
    assert (eth2 / "qos/trust").read_text() == "dscp\n"
    assert (eth2 / "device/infiniband/mlx5_0").is_dir()
    # Readers take the PCI address from realpath(device) and the driver from its link.
    assert os.path.basename(os.path.realpath(eth2 / "device")) == "0000:1a:00.0"
    assert os.path.basename(os.readlink(eth2 / "device/driver")) == "mlx5_core"
    assert os.path.realpath(root / "infiniband/mlx5_0/device") == os.path.realpath(eth2 / "device")
    assert os.path.realpath(root / "net/eth2/device").startswith(str(root.resolve()))
    port = root / "infiniband/mlx5_0/ports/1"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "phys_state").read_text() == "5: LinkUp\n"
    assert (port / "rate").read_text() == "400 Gb/sec (4X NDR)\n"
    assert (port / "link_layer").read_text() == "Ethernet\n"
    assert (port / "gid_attrs/types/1").read_text() == "RoCE v2\n"
    # the data address 10.200.0.1 (host 0, port 0) as GIDs 2 (RoCE v1) and 3 (RoCE v2): NCCL_IB_GID_INDEX 3
    assert (port / "gids/3").read_text() == "0000:0000:0000:0000:0000:ffff:0ac8:0001\n"
    assert (port / "gid_attrs/types/3").read_text() == "RoCE v2\n"
    assert (root / "infiniband/mlx5_0/tc/1/traffic_class").read_text() == "Global tclass=106\n"
    assert (root / "infiniband_verbs/uverbs1/ibdev").read_text() == "mlx5_1\n"
    # Other classes mirror the real ones as links into /sys/devices.
    if Path("/sys/class/block").is_dir():
        assert (root / "block").is_dir()


def test_ticker_advances_sysfs_counters_atomically_and_stops_on_sigterm(make_host, tmp_path):
    lab = tmp_path
    host = make_host("lab01")
    make_host("lab02", 1)
    freeze(host)
    faults.cnp(host, nic="eth2", per_s=1000)
    cnp_file = hw_dir(host) / "sys-class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent"
    caches: dict = {}
    t = time.time()
    assert ticker.tick(lab, caches, now=t) > 0
    v1 = int(cnp_file.read_text())
    written = ticker.tick(lab, caches, now=t + 2)
    v2 = int(cnp_file.read_text())
    assert v2 - v1 == 2000
    assert 0 < written < 60  # only moving counters, not all ~250 files of 2 hosts
    assert not [p for p in (hw_dir(host) / "sys-class").rglob(".tmp-*")]
    # A fault injected between passes applies at the next one (the state is re-read).
    faults.cnp(host, nic="eth2", per_s=0)
    ticker.tick(lab, caches, now=t + 3)
    frozen = int(cnp_file.read_text())
    ticker.tick(lab, caches, now=t + 5)
    assert int(cnp_file.read_text()) == frozen

    # The daemon: the counter moves again, and once the daemon has written it (its SIGTERM handler is
    # installed before its first pass) a SIGTERM ends it cleanly.  Wait for that write, never a fixed time:
    # on a loaded machine the interpreter's start alone can take seconds.
    faults.cnp(host, nic="eth2", per_s=1000)
    moving = int(cnp_file.read_text())  # the injection itself rewrites the files once
    proc = subprocess.Popen(
        [sys.executable, "-m", "clusterctl.lab.hardware.ticker", str(lab), "--interval", "0.2"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while int(cnp_file.read_text()) <= moving and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert int(cnp_file.read_text()) > moving >= frozen, (
            f"the ticker never advanced the counter (exit {proc.poll()})"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=5)
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
    bad = subprocess.run(
        [sys.executable, "-m", "clusterctl.lab.hardware.ticker", str(lab / "missing")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 3 and "no such directory" in bad.stderr


def test_install_into_rootfs_builds_the_library_and_points_the_tools_at_the_state_dir(tmp_path, make_host):
    rootfs = tmp_path / "rootfs"
    real_rdma = rootfs / "usr/sbin/rdma"
    real_rdma.parent.mkdir(parents=True)
    real_rdma.write_text("#!/bin/sh\necho real iproute2 rdma\n")
    install_into_rootfs(rootfs)
    install_into_rootfs(rootfs)  # idempotent
    for v in ("current", "old"):
        lib = rootfs / f"usr/lib/x86_64-linux-gnu/lab-hw-nvml/{v}/libnvidia-ml.so.1"
        assert lib.read_bytes()[:4] == b"\x7fELF"
    assert os.readlink(rootfs / GUEST_LIBNVML.lstrip("/")) == f"{GUEST_HW_DIR}/libnvidia-ml.so.1"
    assert os.readlink(rootfs / "usr/sbin/ethtool") == "/usr/lib/lab-hw/ethtool.py"
    assert os.readlink(rootfs / "usr/bin/mlnx_qos") == f"{GUEST_HW_DIR}/bin/mlnx_qos"
    assert (rootfs / "usr/sbin/rdma.distrib").read_text().startswith("#!/bin/sh")
    assert os.readlink(rootfs / "usr/sbin/rdma") == "/usr/lib/lab-hw/rdma.py"
    # The installed copy runs on its own (stdlib only, finds nicmodel beside it).
    host = make_host()
    freeze(host)
    env = dict(os.environ, LAB_HW_DIR=str(hw_dir(host)))
    out = subprocess.run(
        [sys.executable, "-I", str(rootfs / "usr/lib/lab-hw/ethtool.py"), "-S", "eth2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert out.returncode == 0 and "     rx_prio3_pause: 1284512\n" in out.stdout
    with pytest.raises(LabError, match="template root file system not found"):
        install_into_rootfs(tmp_path / "nope")


def test_provisioning_links_the_library_of_the_gpu_profile(make_host):
    h100 = make_host("a", 0, gpus=8)
    old = make_host("b", 1, gpus=2, model="old-driver")
    none = make_host("c", 2, gpus=0)
    assert os.readlink(hw_dir(h100) / "libnvidia-ml.so.1").endswith("/current/libnvidia-ml.so.1")
    assert os.readlink(hw_dir(old) / "libnvidia-ml.so.1").endswith("/old/libnvidia-ml.so.1")
    assert not os.path.lexists(hw_dir(none) / "libnvidia-ml.so.1")
    rec = json.loads((hw_dir(old) / "host.json").read_text())
    assert rec == {"name": "b", "index": 1, "gpus": 2, "gpu_model": "A100-SXM4-80GB-R470", "flavour": "mlnx"}
    with pytest.raises(LabError, match="unknown GPU model 'B300'.*known:"):
        make_host("d", 3, model="B300")
    with pytest.raises(LabError, match="unknown NIC flavour"):
        make_host("e", 4, flavour="intel")
    # Hosts differ: MACs, UUIDs, counters.
    a, b = (nics.load(hw_dir(h)) for h in (h100, old))
    assert a["nics"]["eth2"]["mac"] != b["nics"]["eth2"]["mac"]
    assert gpus.load(hw_dir(h100))["gpus"][0]["uuid"] != gpus.load(hw_dir(old))["gpus"][0]["uuid"]
    assert sysfs.counter_files(hw_dir(h100) / "sys-class", "eth2", a["nics"]["eth2"])


def test_describe_host_gives_the_inventory_what_the_fakes_will_report(make_host):
    host = make_host("lab03", 2, gpus=4, model="L40S")
    d = describe_host(host)
    assert d["gpus"] == {
        "count": 4,
        "model": "L40S-48GB",
        "name": "NVIDIA L40S",
        "memory_gib": 45.0,
        "interconnect": "pcie",
        "uuids": [g["uuid"] for g in gpus.load(hw_dir(host))["gpus"]],
    }
    assert d["nics"] == [
        {
            "netdev": "eth2",
            "rdma_device": "mlx5_0",
            "port": 1,
            "speed_gbps": 400.0,
            "mtu": 4200,
            "mac": "02:77:00:02:10:01",
        },
        {
            "netdev": "eth3",
            "rdma_device": "mlx5_1",
            "port": 1,
            "speed_gbps": 400.0,
            "mtu": 4200,
            "mac": "02:77:00:02:11:01",
        },
    ]
    with pytest.raises(LabError, match="no simulated hardware here"):
        describe_host(host.parent / "unprovisioned")
