"""GPU model profiles and the fixed data-NIC layout of a lab host.

A profile says what a GPU model reports and what it does not support:
retired pages exist only before Ampere (row remapping replaced them), NVLink
only on SXM parts, ECC error locations differ by generation.  The "old driver"
profile pairs an A100 with an R470-like library that lacks newer NVML symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterctl.errors import LabError


@dataclass(frozen=True)
class GpuProfile:
    """What one GPU model reports through NVML.  Memory in MiB, power in mW."""

    key: str
    name: str
    memory_total_mib: int
    memory_reserved_mib: int
    pci_device_id: int
    pci_subsystem_id: int
    pcie_gen: int
    pcie_width: int
    nvlinks: int  # 0 = PCIe card: NVLink calls are NOT_SUPPORTED
    power_limit_mw: int
    idle_power_mw: int
    arch: int  # NVML_DEVICE_ARCH_*
    cuda_cc: int  # 90 = 9.0
    vbios: str
    row_remapping: bool  # Ampere and later
    retired_pages: bool  # Volta and earlier
    ecc_locations: tuple[str, ...]
    remap_banks: int  # row-remapper histogram "max" at birth
    max_sm_mhz: int
    max_mem_mhz: int
    brand: int = 14  # NVML_BRAND_NVIDIA
    driver_version: str = "550.90.07"
    nvml_version: str = "12.550.90.07"
    cuda_driver_version: int = 12040
    nvml_variant: str = "current"  # which build of the fake library


_HOPPER_ECC = ("dram", "sram")
_VOLTA_ECC = ("l1_cache", "l2_cache", "dram", "register_file")

PROFILES: dict[str, GpuProfile] = {
    p.key: p
    for p in [
        GpuProfile(
            "H100-SXM5-80GB",
            "NVIDIA H100 80GB HBM3",
            81559,
            512,
            0x233010DE,
            0x16C110DE,
            5,
            16,
            18,
            700_000,
            71_000,
            9,
            90,
            "96.00.74.00.01",
            True,
            False,
            _HOPPER_ECC,
            2560,
            1980,
            2619,
        ),
        GpuProfile(
            "H200-SXM5-141GB",
            "NVIDIA H200",
            143771,
            512,
            0x233510DE,
            0x18A610DE,
            5,
            16,
            18,
            700_000,
            76_000,
            9,
            90,
            "96.00.A5.00.01",
            True,
            False,
            _HOPPER_ECC,
            2560,
            1980,
            3201,
        ),
        GpuProfile(
            "A100-SXM4-80GB",
            "NVIDIA A100-SXM4-80GB",
            81920,
            448,
            0x20B210DE,
            0x147F10DE,
            4,
            16,
            12,
            400_000,
            62_000,
            7,
            80,
            "92.00.45.00.06",
            True,
            False,
            _HOPPER_ECC,
            640,
            1410,
            1593,
        ),
        GpuProfile(
            "L40S-48GB",
            "NVIDIA L40S",
            46068,
            460,
            0x26B910DE,
            0x185110DE,
            4,
            16,
            0,
            350_000,
            34_000,
            8,
            89,
            "95.02.66.00.02",
            True,
            False,
            _HOPPER_ECC,
            384,
            2520,
            9001,
        ),
        GpuProfile(
            "V100-SXM2-32GB",
            "Tesla V100-SXM2-32GB",
            32768,
            256,
            0x1DB510DE,
            0x124910DE,
            3,
            16,
            6,
            300_000,
            42_000,
            5,
            70,
            "88.00.80.00.01",
            False,
            True,
            _VOLTA_ECC,
            0,
            1530,
            877,
            brand=2,
        ),
        GpuProfile(
            "A100-SXM4-80GB-R470",
            "NVIDIA A100-SXM4-80GB",
            81920,
            448,
            0x20B210DE,
            0x147F10DE,
            4,
            16,
            12,
            400_000,
            62_000,
            7,
            80,
            "92.00.45.00.06",
            True,
            False,
            _HOPPER_ECC,
            640,
            1410,
            1593,
            driver_version="470.239.06",
            nvml_version="11.470.239.06",
            cuda_driver_version=11040,
            nvml_variant="old",
        ),
    ]
}

ALIASES = {
    "old-driver": "A100-SXM4-80GB-R470",
    "H100": "H100-SXM5-80GB",
    "H200": "H200-SXM5-141GB",
    "A100": "A100-SXM4-80GB",
    "A100-80GB": "A100-SXM4-80GB",
    "L40S": "L40S-48GB",
}

#: PCI bus numbers of GPUs 0..7 (an HGX H100 board), then more for larger counts.
GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def gpu_profile(model: str) -> GpuProfile:
    """The profile for ``model`` (a key or alias); raises :class:`LabError` naming the known ones."""
    key = ALIASES.get(model, model)
    try:
        return PROFILES[key]
    except KeyError:
        known = ", ".join(sorted(PROFILES) + sorted(ALIASES))
        raise LabError(f"unknown GPU model {model!r} (known: {known})") from None


@dataclass(frozen=True)
class DataNic:
    """A simulated ConnectX port: its netdev, RDMA device and link numbers."""

    netdev: str
    rdma_device: str
    port: int = 1
    speed_mbps: int = 400_000
    mtu: int = 4200
    pci: str = ""
    numa_node: int = 0
    extra: dict[str, str] = field(default_factory=dict)


#: Every lab host has the same two data ports, so the netns and sysfs sides agree
#: without passing state around.  MTU 4200 matches the default fabric profile.
DATA_NICS: tuple[DataNic, ...] = (
    DataNic("eth2", "mlx5_0", pci="0000:1a:00.0", numa_node=0),
    DataNic("eth3", "mlx5_1", pci="0000:9c:00.0", numa_node=1),
)

FLAVOURS = ("mlnx", "inbox")


def check_flavour(flavour: str) -> str:
    """Return ``flavour`` or raise :class:`LabError` listing the known ones."""
    if flavour not in FLAVOURS:
        raise LabError(f"unknown NIC flavour {flavour!r} (known: {', '.join(FLAVOURS)})")
    return flavour
