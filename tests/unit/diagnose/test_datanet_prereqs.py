"""RDMA prerequisites: what the probe reads (fixture trees) and what doctor says.

The lab's hosts are containers sharing the machine's kernel: peer memory,
IOMMU and ACS there are the machine's, so these are tested on trees written
here in the kernel's formats (docs/doctor-roce.md, "Tested on recorded data").
"""

from __future__ import annotations

import os
from pathlib import Path

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import run_analyzers
from clusterctl.inventory.model import GpuRef, Instance
from clusterctl.node import collector

import roce_facts as R

CHECK = "host.rdma_prereqs"

#: /proc/modules lines as the kernel prints them.
MODULES = """nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)
nvidia_uvm 1531904 4 - Live 0x0000000000000000 (POE)
nvidia 56111104 120 nvidia_peermem,nvidia_uvm, Live 0x0000000000000000 (POE)
mlx5_ib 442368 0 - Live 0x0000000000000000
ib_core 450560 9 nvidia_peermem,mlx5_ib, Live 0x0000000000000000
"""

#: ``lspci -vvv`` of a PCIe switch downstream port (the ACS lines of pciutils 3.x).
LSPCI_ACS = """02:00.0 PCI bridge: PLX Technology, Inc. PEX 8747 48-Lane, 5-Port PCI Express Gen 3 (8.0 GT/s) Switch (rev ca) (prog-if 00 [Normal decode])
\tCapabilities: [148 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
"""


def write(root: Path, path: str, text: str | bytes) -> None:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text if isinstance(text, bytes) else text.encode())


def config_space(acs_ctl: int | None) -> bytes:
    """4 KiB of config space: AER at 0x100, then ACS at 0x148 with ``acs_ctl`` (none: no ACS)."""
    data = bytearray(4096)
    nxt = 0x148 if acs_ctl is not None else 0
    data[0x100:0x104] = (0x0001 | 1 << 16 | nxt << 20).to_bytes(4, "little")
    if acs_ctl is not None:
        data[0x148:0x14C] = (0x000D | 1 << 16).to_bytes(4, "little")
        data[0x14C:0x14E] = (0x5F).to_bytes(2, "little")
        data[0x14E:0x150] = acs_ctl.to_bytes(2, "little")
    return bytes(data)


def pci_tree(root: Path, redirect: bool) -> None:
    """GPU 0000:03:00.0 and NIC eth2 (0000:04:00.0) under one switch (ports
    02:00.0 and 02:01.0 below upstream port 01:00.0); GPU 0000:83:00.0 under
    another root port."""
    base = "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    dev = {
        "0000:03:00.0": f"{base}/0000:02:00.0/0000:03:00.0",
        "0000:04:00.0": f"{base}/0000:02:01.0/0000:04:00.0",
        "0000:02:00.0": f"{base}/0000:02:00.0",
        "0000:02:01.0": f"{base}/0000:02:01.0",
        "0000:83:00.0": "sys/devices/pci0000:80/0000:80:01.0/0000:83:00.0",
    }
    for addr, path in dev.items():
        (root / path).mkdir(parents=True, exist_ok=True)
        link = root / "sys/bus/pci/devices" / addr
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(root / path, link.parent))
    write(root, f"{dev['0000:02:00.0']}/config", config_space(0x1D if redirect else 0x01))
    write(root, f"{dev['0000:02:01.0']}/config", config_space(0x01))
    net = root / "sys/class/net/eth2"
    net.mkdir(parents=True)
    (net / "device").symlink_to(os.path.relpath(root / dev["0000:04:00.0"], net))


# ------------------------------------------------------------------ probe side


def test_peer_memory_from_proc_modules_then_sys_module(tmp_path):
    write(tmp_path, "/proc/modules", MODULES)
    assert collector.peer_memory(str(tmp_path)) == {
        "loaded": True,
        "module": "nvidia_peermem",
        "source": "/proc/modules",
        "reason": None,
    }
    write(tmp_path, "/proc/modules", MODULES.replace("nvidia_peermem", "nv_peer_mem"))
    assert collector.peer_memory(str(tmp_path))["module"] == "nv_peer_mem"
    write(tmp_path, "/proc/modules", "mlx5_ib 442368 0 - Live 0x0\n")
    assert collector.peer_memory(str(tmp_path))["loaded"] is False
    (tmp_path / "proc/modules").unlink()
    (tmp_path / "sys/module/nvidia_peermem").mkdir(parents=True)
    assert collector.peer_memory(str(tmp_path))["source"] == "/sys/module"
    assert collector.peer_memory(str(tmp_path))["loaded"] is True


def test_peer_memory_unreadable_is_a_reason_not_false(tmp_path):
    got = collector.peer_memory(str(tmp_path))
    assert got["loaded"] is None and "neither /proc/modules nor /sys/module" in got["reason"]


def test_iommu_cmdline_words_and_group_types(tmp_path):
    write(tmp_path, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt quiet\n")
    for g, t in enumerate(["identity", "identity", "DMA-FQ"]):
        write(tmp_path, f"/sys/kernel/iommu_groups/{g}/type", t + "\n")
    got = collector.iommu_state(str(tmp_path))
    assert got == {
        "cmdline": ["intel_iommu=on", "iommu=pt"],
        "groups": 3,
        "identity_groups": 2,
        "translated_groups": 1,
        "reason": None,
    }


def test_iommu_groups_missing_is_recorded(tmp_path):
    write(tmp_path, "/proc/cmdline", "root=/dev/sda1\n")
    got = collector.iommu_state(str(tmp_path))
    assert got["cmdline"] == [] and got["groups"] is None
    assert got["reason"].startswith("/sys/kernel/iommu_groups: ")


def test_acs_control_from_config_space_and_lspci():
    value, why = collector.acs_from_config(config_space(0x1D))
    assert (value, why) == (0x1D, None)
    assert collector.acs_from_config(config_space(None)) == (None, "no ACS capability")
    value, why = collector.acs_from_config(config_space(0x1D)[:256])
    assert value is None and "needs root" in why
    assert collector.parse_lspci_acsctl(LSPCI_ACS) == 0x1D
    assert collector.parse_lspci_acsctl("\tCapabilities: [100 v2] Advanced Error Reporting\n") is None


def test_acs_on_the_switch_ports_between_gpu_and_nic(tmp_path):
    pci_tree(tmp_path, redirect=True)
    gpus = {"devices": [{"index": 0, "pci_address": "0000:03:00.0"}, {"index": 1, "pci_address": "0000:83:00.0"}]}
    nics = [{"netdev": "eth2", "rdma": {"device": "mlx5_0"}}, {"netdev": "eth0", "rdma": None}]
    pairs = collector.acs_paths(gpus, nics, 1.0, str(tmp_path))
    # GPU 1 shares only the root complex with eth2: no pair
    assert [(p["gpu"], p["netdev"]) for p in pairs] == [(0, "eth2")]
    bridges = pairs[0]["bridges"]
    assert [(b["pci_address"], b["redirect"], b["source"]) for b in bridges] == [
        ("0000:02:00.0", True, "config"),
        ("0000:02:01.0", False, "config"),
    ]
    assert bridges[0]["acs_ctl"] == ["SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"]


def test_acs_short_config_space_in_a_fixture_tree_says_why(tmp_path):
    pci_tree(tmp_path, redirect=False)
    write(tmp_path, "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/config", b"\0" * 64)
    got = collector.acs_control(str(tmp_path), "0000:02:00.0", 1.0)
    assert got["redirect"] is None and "needs root" in got["reason"]


def test_unit_environment_names_kept_secret_values_dropped():
    show = (
        "Id=clusterctl-qwen.service\nLimitMEMLOCK=8388608\n"
        "Environment=NCCL_IB_TC=106 \"VLLM_EXTRA=a b\" HF_TOKEN=hf_abc VLLM_API_KEY=sk-1 "
        "NCCL_SOCKET_IFNAME==eth2 MY_PASSWORD=x\n"
        "EnvironmentFiles=/etc/clusterctl/qwen.env (ignore_errors=no)\n"
    )
    env = collector.parse_unit_environment(show)["clusterctl-qwen.service"]
    assert env["environment"] == {
        "NCCL_IB_TC": "106",
        "VLLM_EXTRA": "a b",
        "HF_TOKEN": None,
        "VLLM_API_KEY": None,
        "NCCL_SOCKET_IFNAME": "=eth2",
        "MY_PASSWORD": None,
    }
    assert env["environment_files"] == ["/etc/clusterctl/qwen.env"]
    red = collector.redact_environment(show)
    assert "hf_abc" not in red and "sk-1" not in red and "'HF_TOKEN=<redacted>'" in red
    assert "NCCL_IB_TC=106" in red and "LimitMEMLOCK=8388608" in red
    assert collector.unit_entry(collector.parse_show(show)[0], None)["limit_memlock"] == 8388608
    assert collector.parse_limit("infinity") == "infinity" and collector.parse_limit("") is None


# --------------------------------------------------------------- doctor side


def gpu_doc(host: str, **prereqs) -> dict:
    d = R.doc(host)
    d["gpus"]["devices"] = [{"index": 0, "numa_node": 0}]
    for n in d["nics"]:
        n.setdefault("numa_node", 0)
    d["rdma_prereqs"] = R.prereqs(**prereqs)
    return d


def spanning(ctx, hosts) -> None:
    """Place one TP group across ``hosts`` (GPU 0 of each): NCCL between them uses GPUDirect RDMA."""
    ctx.inventory.instances["tp-across"] = Instance("tp-across", "m", "e", tuple(GpuRef(h, 0) for h in hosts), 8000)


def run(special, n=4, across=True):
    ctx = R.cluster(n, {h: d for h, d in special.items()}, per_leaf=2)
    if across:
        spanning(ctx, sorted(ctx.facts))
    for h, d in ctx.facts.items():
        if h not in special:
            special_free = gpu_doc(h)
            d.update(gpus=special_free["gpus"], rdma_prereqs=special_free["rdma_prereqs"])
    return [f for f in run_analyzers(ctx, [CHECK]) if f.check == CHECK]


def bad(fs):
    """Non-OK findings."""
    return [f for f in fs if f.severity != Severity.OK]


def test_healthy_hosts_report_ok():
    fs = run({})
    assert fs and not bad(fs)
    assert {f.subject for f in fs if f.host == "gpu01"} >= {"peermem", "host"}


def test_hosts_whose_instances_stay_on_one_host_need_no_peer_memory():
    fs = run({"gpu03": gpu_doc("gpu03", peermem=False)}, across=False)
    assert not [f for f in fs if f.subject == "peermem"]


def test_peermem_missing_warns_with_modprobe():
    b = bad(run({"gpu03": gpu_doc("gpu03", peermem=False)}))
    assert [(f.host, f.subject, f.severity) for f in b] == [("gpu03", "peermem", Severity.WARN)]
    assert b[0].action.startswith("modprobe nvidia-peermem")


def test_peermem_unreadable_is_unknown_and_hosts_without_gpus_are_skipped():
    b = bad(run({"gpu02": gpu_doc("gpu02", peermem=None)}))
    assert [(f.host, f.severity) for f in b] == [("gpu02", Severity.UNKNOWN)]
    no_gpu = R.doc("gpu04")
    no_gpu["rdma_prereqs"] = R.prereqs(peermem=False)
    assert not bad(run({"gpu04": no_gpu}))


def test_acs_redirect_between_gpu_and_nic_warns():
    acs = [
        {
            "gpu": 0,
            "netdev": "eth2",
            "bridges": [
                {
                    "pci_address": "0000:02:00.0",
                    "acs_ctl": ["SrcValid", "ReqRedir", "CmpltRedir"],
                    "redirect": True,
                    "source": "config",
                    "reason": None,
                },
                {"pci_address": "0000:02:01.0", "acs_ctl": [], "redirect": False, "source": "config", "reason": None},
            ],
        }
    ]
    b = bad(run({"gpu01": gpu_doc("gpu01", acs=acs)}))
    assert [(f.host, f.subject, f.severity) for f in b] == [("gpu01", "pcie", Severity.WARN)]
    assert "root complex" in b[0].message
    assert b[0].evidence == ("0000:02:00.0 (GPU 0 - eth2): ACS redirect on",)


def test_acs_unreadable_is_unknown():
    acs = [
        {
            "gpu": 0,
            "netdev": "eth2",
            "bridges": [
                {
                    "pci_address": "0000:02:00.0",
                    "acs_ctl": None,
                    "redirect": None,
                    "source": "config",
                    "reason": "extended config space not readable (64 bytes; needs root); lspci not installed",
                }
            ],
        }
    ]
    b = bad(run({"gpu01": gpu_doc("gpu01", acs=acs)}))
    assert [(f.subject, f.severity) for f in b] == [("pcie", Severity.UNKNOWN)]


def test_iommu_translating_without_passthrough_warns():
    b = bad(run({"gpu02": gpu_doc("gpu02", translated=12, cmdline=["intel_iommu=on"])}))
    assert [(f.host, f.subject, f.severity) for f in b] == [("gpu02", "iommu", Severity.WARN)]
    assert "iommu=pt" in b[0].action
    assert not bad(run({"gpu02": gpu_doc("gpu02", translated=12, cmdline=["intel_iommu=on", "iommu=pt"])}))


def test_memlock_of_a_vllm_unit():
    d = gpu_doc("gpu01")
    d["units"] = [
        {"unit": "clusterctl-qwen.service", "limit_memlock": 8 << 20},
        {"unit": "clusterctl-llama.service", "limit_memlock": "infinity"},
    ]
    b = bad(run({"gpu01": d}, across=False))
    assert [(f.subject, f.severity) for f in b] == [("unit:clusterctl-qwen.service", Severity.WARN)]
    assert "LimitMEMLOCK=8388608 bytes (8 MiB)" in b[0].message
    d["units"][0]["limit_memlock"] = "infinity"
    fs = run({"gpu01": d}, across=False)
    assert not bad(fs) and any(f.subject == "memlock" for f in fs)


def test_no_vllm_unit_deployed_yet_is_nothing_to_check_not_unknown():
    # These documents run no unit: a cluster with nothing deployed must not exit 3 for memlock.
    fs = [f for f in run({}) if f.subject == "memlock"]
    assert fs and all(f.severity == Severity.OK for f in fs)
    assert "no vLLM unit deployed on this host yet: LimitMEMLOCK not applicable" in fs[0].message
