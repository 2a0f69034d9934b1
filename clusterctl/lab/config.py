"""Where a lab lives and how its hosts are named and addressed.

A lab is identified by its state directory; two labs can run side by side
when they differ in ``lab_dir``, ``bridge``, ``net`` and ``prefix`` (the test
suite brings up a small second lab to check ``lab down``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from clusterctl.errors import LabError

#: Most hosts one lab may have: a Linux bridge holds at most 1024 ports.
MAX_HOSTS = 1000
#: The first host's last address octet (hosts are ``NET.0.101`` upwards).
FIRST_HOST_OFFSET = 100


@dataclass(frozen=True)
class LabConfig:
    """The places and names of one lab.

    ``net`` is the first two octets of the lab's /16 (the bridge holds
    ``NET.0.1/16``); ``prefix`` names hosts (``lab01``), their network
    namespaces and their cgroup directories.
    """

    lab_dir: Path = Path("/var/lib/clusterctl-lab")
    cache_dir: Path = Path("/var/cache/clusterctl-lab")
    bridge: str = "labbr0"
    net: str = "10.77"
    prefix: str = "lab"

    @classmethod
    def from_env(cls) -> "LabConfig":
        """The default lab, overridden by ``CLUSTERCTL_LAB_DIR``, ``_CACHE``,
        ``_BRIDGE``, ``_NET`` and ``_PREFIX`` environment variables."""
        env = os.environ
        d = cls()
        cfg = cls(
            lab_dir=Path(env.get("CLUSTERCTL_LAB_DIR", str(d.lab_dir))),
            cache_dir=Path(env.get("CLUSTERCTL_LAB_CACHE", str(d.cache_dir))),
            bridge=env.get("CLUSTERCTL_LAB_BRIDGE", d.bridge),
            net=env.get("CLUSTERCTL_LAB_NET", d.net),
            prefix=env.get("CLUSTERCTL_LAB_PREFIX", d.prefix),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise :class:`LabError` when a name or the network is unusable."""
        parts = self.net.split(".")
        if len(parts) != 2 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
            raise LabError(f"lab network {self.net!r} must be two octets, e.g. 10.77")
        if not (self.prefix.isalpha() and self.prefix.islower() and 1 <= len(self.prefix) <= 6):
            raise LabError(f"lab host prefix {self.prefix!r} must be 1-6 lower-case letters")
        if not (1 <= len(self.bridge) <= 15 and self.bridge.replace("_", "").isalnum()):
            raise LabError(f"bridge name {self.bridge!r} must be 1-15 letters/digits")
        if not self.lab_dir.is_absolute() or not self.cache_dir.is_absolute():
            raise LabError("the lab and cache directories must be absolute paths")

    # Paths ---------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.lab_dir / "state.json"

    @property
    def inventory_file(self) -> Path:
        return self.lab_dir / "inventory.yaml"

    @property
    def ssh_dir(self) -> Path:
        return self.lab_dir / "ssh"

    @property
    def key_file(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def hosts_dir(self) -> Path:
        return self.lab_dir / "hosts"

    @property
    def gateway(self) -> str:
        return f"{self.net}.0.1"

    @property
    def cgroup_name(self) -> str:
        """The cgroup directory (in ``name=systemd`` and ``unified``) of this lab."""
        return f"clusterctl-{self.prefix}"


@dataclass(frozen=True)
class HostSpec:
    """One lab host: its name, 1-based index, address and veth MAC."""

    name: str
    index: int
    address: str
    mac: str

    @property
    def netns(self) -> str:
        return self.name

    @property
    def veth(self) -> str:
        """The root-namespace end of the host's veth (the bridge port)."""
        return f"v{self.name}"


def plan_hosts(cfg: LabConfig, count: int) -> list[HostSpec]:
    """Name and address ``count`` hosts: ``lab01``.. at ``NET.0.101``..

    MACs are deterministic (``02:NN:00:00:HI:LO``) so a host recreated with
    the same address never meets a stale neighbour entry (lab.md P16).
    """
    if not 1 <= count <= MAX_HOSTS:
        raise LabError(f"--hosts must be between 1 and {MAX_HOSTS}, not {count}")
    width = max(2, len(str(count)))
    second = int(cfg.net.split(".")[1])
    out = []
    for i in range(1, count + 1):
        n = FIRST_HOST_OFFSET + i
        out.append(
            HostSpec(
                name=f"{cfg.prefix}{i:0{width}d}",
                index=i,
                address=f"{cfg.net}.{n // 256}.{n % 256}",
                mac=f"02:{second:02x}:00:00:{i >> 8:02x}:{i & 0xFF:02x}",
            )
        )
    return out
