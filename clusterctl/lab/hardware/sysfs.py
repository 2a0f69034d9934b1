"""The fake ``/sys/class`` tree of a lab host (``<hw>/sys-class``).

The whole directory is bind-mounted read-only over the host's ``/sys/class``
(nspawn cannot create mount points under sysfs, see lab.md §3.5), so it also
carries the classes the host really has: every other class directory of the
control machine is mirrored as relative symlinks into ``/sys/devices``, which
resolve inside the container's own sysfs; ``net/eth0`` and ``net/lo`` point at
the container's real interfaces.

Counter files are rewritten by :func:`refresh_counters` (the ticker), each
with write-to-temp + rename, from the same state and clock as the fake tools.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from clusterctl.lab.hardware.tools import nicmodel

TREE = "sys-class"
TMP = ".tmp"
REAL_SYS_CLASS = Path("/sys/class")
#: Classes built here rather than mirrored.
OWN_CLASSES = ("net", "infiniband", "infiniband_verbs")
#: Hidden directory holding the simulated PCI functions (see _build_pci_function).
DEVICES = ".devices"
#: Real interfaces of the container, linked to its own sysfs.
REAL_NETDEVS = ("lo", "eth0")


def _write(path: Path, text: str, tmp: Path | None) -> None:
    """Write one file: atomically via ``tmp``, or directly (``None``) into a tree not yet in use."""
    if tmp is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    try:
        nicmodel.atomic_write(str(path), text, tmp_dir=str(tmp))
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        nicmodel.atomic_write(str(path), text, tmp_dir=str(tmp))


def _mirror_real_classes(root: Path, real: Path) -> None:
    if not real.is_dir():
        return
    for cls in sorted(os.listdir(real)):
        if cls in OWN_CLASSES:
            continue
        src = real / cls
        dst = root / cls
        dst.mkdir(exist_ok=True)
        try:
            entries = os.listdir(src)
        except OSError:
            continue
        for entry in entries:
            link = dst / entry
            if link.is_symlink() or link.exists():
                continue
            p = src / entry
            if p.is_symlink():
                os.symlink(os.readlink(p), link)


def _eui64(mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")]
    b[0] ^= 0x02
    e = b[:3] + [0xFF, 0xFE] + b[3:]
    return ":".join(f"{e[i]:02x}{e[i + 1]:02x}" for i in range(0, 8, 2))


def build(hw: Path, state: dict, real_sys_class: Path = REAL_SYS_CLASS) -> Path:
    """Create ``hw/sys-class`` from the NIC state (removing an older tree first)."""
    root = hw / TREE
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    _mirror_real_classes(root, real_sys_class)
    net = root / "net"
    net.mkdir()
    for dev in REAL_NETDEVS:
        os.symlink(f"../../devices/virtual/net/{dev}", net / dev)
    (hw / TMP).mkdir(exist_ok=True)
    cfs = hw / nicmodel.CONFIGFS
    if cfs.exists():
        shutil.rmtree(cfs)
    for nic in state.get("nics", {}).values():  # rdma_cm loaded, each device's directory made
        nicmodel.write_cm_tos(str(hw), nic["rdma_device"], int(nic.get("port", 1)), nicmodel.DEFAULT_CM_TOS)
    write_config(hw, state, atomic=False)
    refresh_counters(hw, state, atomic=False)
    return root


def write_config(hw: Path, state: dict, atomic: bool = True) -> None:
    """(Re)write every non-counter file (link state, QoS, ECN, GIDs).

    Faults call this after changing ``nic.json`` so sysfs agrees with the
    tools; each file is replaced atomically unless ``atomic`` is False (a
    tree being built, which nobody reads yet).
    """
    root = hw / TREE
    net = root / "net"
    tmp: Path | None = hw / TMP if atomic else None
    if tmp is not None:
        tmp.mkdir(exist_ok=True)
    flavour = state.get("flavour", "mlnx")
    for k, (ifname, nic) in enumerate(sorted(state.get("nics", {}).items())):
        _build_netdev(net / ifname, ifname, nic, flavour, tmp)
        _build_ibdev(root / "infiniband" / nic["rdma_device"], ifname, nic, flavour, tmp)
        _write(root / "infiniband_verbs" / f"uverbs{k}" / "ibdev", nic["rdma_device"] + "\n", tmp)
        _write(root / "infiniband_verbs" / f"uverbs{k}" / "abi_version", "1\n", tmp)
    _write(root / "infiniband_verbs" / "abi_version", "6\n", tmp)


def _build_netdev(d: Path, ifname: str, nic: dict, flavour: str, tmp: Path | None) -> None:
    up = nic.get("link_up", True)
    for name, text in {
        "address": nic["mac"],
        "broadcast": "ff:ff:ff:ff:ff:ff",
        "mtu": str(nic["mtu"]),
        "speed": str(nic["speed_mbps"] if up else -1),
        "duplex": "full" if up else "unknown",
        "operstate": "up" if up else "down",
        "carrier": "1" if up else "0",
        "type": "1",
        "addr_len": "6",
        "tx_queue_len": "1000",
        "ifalias": "",
    }.items():
        _write(d / name, text + "\n", tmp)
    _build_pci_function(d.parent.parent, nic, flavour, tmp)
    _link(d / "device", f"../../{DEVICES}/{nic['pci']}")
    (d / "statistics").mkdir(exist_ok=True)
    if flavour == "mlnx":
        for rel, text in nicmodel.qos_files(ifname, nic).items():
            if rel.startswith("net/"):
                _write(d.parent.parent / rel, text, tmp)


def _link(link: Path, target: str) -> None:
    if not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)


def _build_pci_function(root: Path, nic: dict, flavour: str, tmp: Path | None) -> None:
    """``.devices/<pci>``: what ``device`` of the netdev and the RDMA device point at.

    Real ``device`` links lead to ``/sys/devices/pci…/<pci>``, outside
    ``/sys/class``; here they stay inside the bound tree, so readers that take
    ``basename(realpath(device))`` as the PCI address, or ``driver``'s link
    name as the driver, get the real answers.
    """
    d = root / DEVICES / nic["pci"]
    _write(d / "numa_node", f"{nic.get('numa_node', 0)}\n", tmp)
    _write(d / "vendor", "0x15b3\n", tmp)
    _write(d / "device", "0x1021\n" if flavour == "mlnx" else "0x101d\n", tmp)
    (d / "infiniband" / nic["rdma_device"]).mkdir(parents=True, exist_ok=True)
    (root / DEVICES / "drivers" / "mlx5_core").mkdir(parents=True, exist_ok=True)
    _link(d / "driver", "../drivers/mlx5_core")


def _build_ibdev(d: Path, ifname: str, nic: dict, flavour: str, tmp: Path | None) -> None:
    up = nic.get("link_up", True)
    _link(d / "device", f"../../{DEVICES}/{nic['pci']}")
    _write(d / "node_type", "1: CA\n", tmp)
    _write(d / "fw_ver", nic.get("fw", "28.39.1002") + "\n", tmp)
    _write(d / "hca_type", ("MT4129" if flavour == "mlnx" else "MT4125") + "\n", tmp)
    _write(d / "board_id", ("MT_0000000838" if flavour == "mlnx" else "MT_0000000359") + "\n", tmp)
    _write(d / "node_guid", nic.get("node_guid", "") + "\n", tmp)
    _write(d / "sys_image_guid", nic.get("node_guid", "") + "\n", tmp)
    port = d / "ports" / str(nic.get("port", 1))
    _write(port / "state", "4: ACTIVE\n" if up else "1: DOWN\n", tmp)
    _write(port / "phys_state", "5: LinkUp\n" if up else "3: Disabled\n", tmp)
    _write(port / "rate", f"{nic['speed_mbps'] // 1000} Gb/sec (4X NDR)\n", tmp)
    _write(port / "link_layer", "Ethernet\n", tmp)
    _write(port / "lid", "0x0\n", tmp)
    _write(port / "sm_lid", "0x0\n", tmp)
    _write(port / "cap_mask", "0x00010000\n", tmp)
    mac6 = _eui64(nic["mac"])
    gids = [f"fe80:0000:0000:0000:{mac6}"] * 2
    types = ["IB/RoCE v1", "RoCE v2"]
    ip = nic.get("ipv4")
    if ip:
        a, b, c, e = (int(x) for x in ip.split("."))
        gid4 = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{e:02x}"
        gids += [gid4, gid4]
        types += ["IB/RoCE v1", "RoCE v2"]
    for i, (gid, typ) in enumerate(zip(gids, types)):
        _write(port / "gids" / str(i), gid + "\n", tmp)
        _write(port / "gid_attrs" / "types" / str(i), typ + "\n", tmp)
        _write(port / "gid_attrs" / "ndevs" / str(i), ifname + "\n", tmp)
    if flavour == "mlnx":
        for rel, text in nicmodel.qos_files(ifname, nic).items():
            if rel.startswith("infiniband/"):
                _write(d.parent.parent / rel, text, tmp)
    (port / "hw_counters").mkdir(parents=True, exist_ok=True)
    (port / "counters").mkdir(parents=True, exist_ok=True)
    _write(port / "hw_counters" / "lifespan", "10\n", tmp)


def counter_files(root: Path, ifname: str, nic: dict) -> dict[Path, str]:
    """Every counter file of one port and the counter name its value comes from."""
    files: dict[Path, str] = {}
    port = root / "infiniband" / nic["rdma_device"] / "ports" / str(nic.get("port", 1))
    for name in nicmodel.hw_counter_names(nic):
        files[port / "hw_counters" / name] = name
    for name in nicmodel.PMA_COUNTERS:
        files[port / "counters" / name] = name
    for sysname, name in nicmodel.NETDEV_STATS.items():
        files[root / "net" / ifname / "statistics" / sysname] = name
    return files


def refresh_counters(
    hw: Path, state: dict, now: float | None = None, cache: dict[Path, int] | None = None, atomic: bool = True
) -> int:
    """Rewrite the counter files whose value changed; returns how many were written.

    ``cache`` (path -> last written value) lets the ticker skip unchanged
    files; ``atomic`` False writes in place (a tree being built).
    """
    root = hw / TREE
    tmp = hw / TMP
    tmp.mkdir(exist_ok=True)
    t = time.time() if now is None else now
    written = 0
    dirs: dict[Path, bool] = {}
    for ifname, nic in state.get("nics", {}).items():
        for path, name in counter_files(root, ifname, nic).items():
            v = nicmodel.value(nic, name, t)
            if cache is not None and cache.get(path) == v:
                continue
            if path.parent not in dirs:
                dirs[path.parent] = path.parent.is_dir()
            if not dirs[path.parent]:
                continue
            if atomic:
                nicmodel.atomic_write(str(path), f"{v}\n", tmp_dir=str(tmp))
            else:
                path.write_text(f"{v}\n", encoding="utf-8")
            if cache is not None:
                cache[path] = v
            written += 1
    return written
