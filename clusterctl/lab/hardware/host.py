"""Provision the simulated hardware of one lab host and install the fakes into the template.

On the control side a host's hardware is the directory ``<host_dir>/hw``:

===================  ==========================================================
``host.json``        how it was provisioned (for ``heal``)
``nvml.json``        GPU state, read by the fake ``libnvidia-ml.so.1``
``nic.json``         NIC counters, rates and QoS, read by the fake NIC tools
``sys-class/``       the fake ``/sys/class`` (bind-mounted read-only)
``configfs/``        a fake ``/sys/kernel/config/rdma_cm`` for unit tests (not bound into hosts)
``libnvidia-ml.so.1``  symlink to the library build for the GPU profile's driver
``bin/``             ``mlnx_qos``, ``ibdev2netdev``, ``cma_roce_tos`` (only on "mlnx" hosts)
===================  ==========================================================

Inside the host the directory is ``/var/lib/lab-hw`` (read-write).  The
template's ``/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1``, ``/usr/bin/mlnx_qos``
and ``/usr/bin/ibdev2netdev`` are symlinks into it, so a host without GPUs has
no NVML library and an "inbox" host has no MLNX_OFED tools, as on real nodes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from clusterctl.errors import LabError
from clusterctl.lab.hardware import gpus as gpustate
from clusterctl.lab.hardware import nics, nvml, sysfs
from clusterctl.lab.hardware.profiles import gpu_profile
from clusterctl.lab.hardware.tools import nicmodel

HW = "hw"
HOST_FILE = "host.json"
#: The state directory as the host sees it; only the fakes know this path.
GUEST_HW_DIR = "/var/lib/lab-hw"
GUEST_TOOLS_DIR = "/usr/lib/lab-hw"
GUEST_NVML_DIR = "/usr/lib/x86_64-linux-gnu/lab-hw-nvml"
GUEST_LIBNVML = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"

TOOLS_SRC = Path(__file__).with_name("tools")
#: Fake command -> (path in the host, script).  "gated" tools exist only on mlnx hosts.
TOOLS = {
    "ethtool": ("/usr/sbin/ethtool", "ethtool.py", False),
    "dcb": ("/usr/sbin/dcb", "dcb.py", False),
    "rdma": ("/usr/sbin/rdma", "rdma.py", False),
    "mlnx_qos": ("/usr/bin/mlnx_qos", "mlnx_qos.py", True),
    "ibdev2netdev": ("/usr/bin/ibdev2netdev", "ibdev2netdev.py", True),
    "cma_roce_tos": ("/usr/sbin/cma_roce_tos", "cma_roce_tos.py", True),
}


def hw_dir(host_dir: Path) -> Path:
    """The control-side hardware state directory of a host."""
    return Path(host_dir) / HW


def _inside(rootfs: Path, guest_path: str) -> Path:
    return rootfs / guest_path.lstrip("/")


def _replace_symlink(link: Path, target: str) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.lab-tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def install_into_rootfs(rootfs: Path) -> None:
    """Build the fake NVML library and install it and the fake NIC tools into ``rootfs``.

    Compiles both library variants with the control machine's gcc (the
    template is the same Debian release), copies the tool scripts to
    ``/usr/lib/lab-hw`` and points the real tool paths at them.  A real binary
    already at such a path (iproute2's ``dcb``/``rdma``) is kept as
    ``<path>.distrib``.  Idempotent; raises :class:`LabError` on failure.
    """
    rootfs = Path(rootfs)
    if not rootfs.is_dir():
        raise LabError(f"{rootfs}: template root file system not found")
    with tempfile.TemporaryDirectory(prefix="lab-hw-build-") as tmp:
        for variant in nvml.VARIANTS:
            built = nvml.build(Path(tmp), variant)
            dest = _inside(rootfs, f"{GUEST_NVML_DIR}/{variant}/{nvml.SONAME}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, dest.with_name(".lab-tmp"))
            os.replace(dest.with_name(".lab-tmp"), dest)
    _replace_symlink(_inside(rootfs, GUEST_LIBNVML), f"{GUEST_HW_DIR}/{nvml.SONAME}")
    _replace_symlink(_inside(rootfs, GUEST_LIBNVML[:-2]), nvml.SONAME)  # libnvidia-ml.so

    tools_dir = _inside(rootfs, GUEST_TOOLS_DIR)
    tools_dir.mkdir(parents=True, exist_ok=True)
    for src in sorted(TOOLS_SRC.glob("*.py")):
        if src.name == "__init__.py":
            continue
        dest = tools_dir / src.name
        shutil.copyfile(src, dest.with_name(".lab-tmp"))
        os.chmod(dest.with_name(".lab-tmp"), 0o755 if src.name != "nicmodel.py" else 0o644)
        os.replace(dest.with_name(".lab-tmp"), dest)
    for _name, (guest, script, gated) in TOOLS.items():
        link = _inside(rootfs, guest)
        target = f"{GUEST_HW_DIR}/bin/{Path(guest).name}" if gated else f"{GUEST_TOOLS_DIR}/{script}"
        if link.exists() and not link.is_symlink():
            os.replace(link, link.with_name(link.name + ".distrib"))
        _replace_symlink(link, target)


def provision_host(host_dir: Path, name: str, index: int, gpus: int, gpu_model: str, flavour: str = "mlnx") -> None:
    """Create ``host_dir/hw``: GPU and NIC state, the fake ``/sys/class`` and per-host links.

    ``index`` (0-based) makes MACs, UUIDs and counter values differ between
    hosts; ``gpus`` GPUs of ``gpu_model`` (see :data:`.profiles.PROFILES`;
    0 = no GPU, so no NVML library); ``flavour`` is "mlnx" or "inbox".
    Re-provisioning replaces the state.  Raises :class:`LabError` for an
    unknown model or flavour.
    """
    count = int(gpus)
    if count < 0 or count > 64:
        raise LabError(f"{name}: GPU count must be 0..64, not {count}")
    profile = gpu_profile(gpu_model)
    hw = hw_dir(host_dir)
    hw.mkdir(parents=True, exist_ok=True)
    # Any user may use a GPU, as /dev/nvidia* (mode 0666) allows on real nodes: a
    # simulator running as a service user (User=vllm) registers its memory in
    # nvml.json under flock(nvml.json.lock), written temp + rename in this directory.
    os.chmod(hw, 0o777)
    nic_state = nics.new_state(name, index, flavour)
    gpustate.save(hw, gpustate.new_state(profile, name, index, count))
    lock = hw / (gpustate.STATE_FILE + ".lock")
    lock.touch()
    os.chmod(lock, 0o666)
    nics.save(hw, nic_state)
    sysfs.build(hw, nic_state)

    lib = hw / nvml.SONAME
    if lib.is_symlink() or lib.exists():
        lib.unlink()
    if count:
        os.symlink(f"{GUEST_NVML_DIR}/{profile.nvml_variant}/{nvml.SONAME}", lib)
    bindir = hw / "bin"
    if bindir.exists():
        shutil.rmtree(bindir)
    bindir.mkdir()
    if flavour == "mlnx":
        for _name, (guest, script, gated) in TOOLS.items():
            if gated:
                os.symlink(f"{GUEST_TOOLS_DIR}/{script}", bindir / Path(guest).name)
    record = {"name": name, "index": index, "gpus": count, "gpu_model": profile.key, "flavour": flavour}
    nicmodel.atomic_write(str(hw / HOST_FILE), json.dumps(record, indent=1) + "\n")


def host_record(host_dir: Path) -> dict[str, Any]:
    """What :func:`provision_host` was called with (raises LabError when not provisioned)."""
    path = hw_dir(host_dir) / HOST_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise LabError(f"{path}: no simulated hardware here (provision the host first): {e}") from None


def describe_host(host_dir: Path) -> dict[str, Any]:
    """GPUs and data NICs of a provisioned host, for writing the lab inventory.

    Returns ``{"gpus": {"count", "model", "name", "memory_gib", "interconnect",
    "uuids"}, "nics": [{"netdev", "rdma_device", "port", "speed_gbps", "mtu",
    "mac"}]}``.
    """
    hw = hw_dir(host_dir)
    rec = host_record(host_dir)
    profile = gpu_profile(rec["gpu_model"])
    gstate = gpustate.load(hw)
    nstate = nics.load(hw)
    return {
        "gpus": {
            "count": rec["gpus"],
            "model": profile.key,
            "name": profile.name,
            "memory_gib": round(profile.memory_total_mib / 1024, 1),
            "interconnect": "nvlink" if profile.nvlinks else "pcie",
            "uuids": [g["uuid"] for g in gstate["gpus"]],
        },
        "nics": [
            {
                "netdev": ifname,
                "rdma_device": n["rdma_device"],
                "port": n["port"],
                "speed_gbps": n["speed_mbps"] / 1000,
                "mtu": n["mtu"],
                "mac": n["mac"],
            }
            for ifname, n in sorted(nstate["nics"].items())
        ],
    }
