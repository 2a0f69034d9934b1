"""Reading the settings shared by defaults, groups and hosts, and the fabric profile.

One :class:`Layer` is one level of the precedence chain, unmerged; the loader
merges them per host.  Readers record ``file:line`` problems in the
:class:`~clusterctl.inventory.fields.Ctx` and return what was valid.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.inventory.fields import NAME, Ctx
from clusterctl.inventory.model import FabricProfile, NicSpec, SSHSettings
from clusterctl.inventory.yamlnodes import Y

SSH_KEYS = (
    "user",
    "port",
    "identity_file",
    "proxy_jump",
    "known_hosts",
    "host_key_policy",
    "become",
    "become_method",
    "connect_timeout",
)
LAYER_KEYS = ("ssh", "vars", "labels", "gpus", "nics")
GPU_KEYS = ("count", "model", "memory_gib", "interconnect")
NIC_KEYS = ("netdev", "role", "rdma_device", "port", "speed_gbps", "address")


@dataclass
class Layer:
    """One level of settings (defaults, a group or a host entry), unmerged."""

    ssh: SSHSettings = field(default_factory=SSHSettings)
    vars: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    gpus: dict[str, Any] = field(default_factory=dict)
    nics: list[NicSpec] | None = None


class SettingsReader:
    """Reads layers; paths are resolved against ``base_dir``.

    ``use_ssh_config`` becomes False when ``defaults.ssh.use_ssh_config: false``
    was read.
    """

    def __init__(self, ctx: Ctx, base_dir: Path):
        self.ctx = ctx
        self.base_dir = base_dir
        self.use_ssh_config = True

    def layer(self, y: Y | None, what: str, extra: tuple[str, ...] = (), allow_use_ssh_config: bool = False) -> Layer:
        """Read the keys shared by defaults, groups and hosts."""
        layer = Layer()
        m = self.ctx.mapping(y, what)
        if m is None:
            return layer
        assert y is not None
        known = self.ctx.keys(y, LAYER_KEYS + extra, what)
        if "ssh" in known:
            layer.ssh = self._ssh(known["ssh"], f"{what}.ssh", allow_use_ssh_config)
        if "vars" in known:
            vm = self.ctx.mapping(known["vars"], f"{what}.vars")
            if vm is not None:
                layer.vars = {k: v.plain() for k, v in vm.items()}
        if "labels" in known:
            layer.labels = self._labels(known["labels"], f"{what}.labels")
        if "gpus" in known:
            layer.gpus = self._gpus(known["gpus"], f"{what}.gpus")
        if "nics" in known:
            layer.nics = self._nics(known["nics"], f"{what}.nics")
        return layer

    def _ssh(self, y: Y, what: str, allow_use_ssh_config: bool) -> SSHSettings:
        ctx = self.ctx
        s = SSHSettings()
        if ctx.mapping(y, what) is None:
            return s
        allowed = SSH_KEYS + (("use_ssh_config",) if allow_use_ssh_config else ())
        known = ctx.keys(y, allowed, what)
        for key, v in known.items():
            w = f"{what}.{key}"
            if key in ("user", "proxy_jump", "become_method"):
                setattr(s, key, ctx.string(v, w))
            elif key in ("identity_file", "known_hosts"):
                path = ctx.string(v, w)
                setattr(s, key, self._path(path) if path else None)
            elif key == "port":
                s.port = ctx.integer(v, w, 1, 65535)
            elif key == "host_key_policy":
                s.host_key_policy = ctx.string(v, w, ("accept-new", "strict", "off"))  # type: ignore[assignment]
            elif key == "become":
                s.become = ctx.boolean(v, w)
            elif key == "connect_timeout":
                s.connect_timeout = ctx.number(v, w, positive=True)
            elif key == "use_ssh_config":
                flag = ctx.boolean(v, w)
                if flag is not None:
                    self.use_ssh_config = flag
        if y.kind == "map" and "use_ssh_config" in y.value and not allow_use_ssh_config:
            ctx.error(y.key_lines["use_ssh_config"], f"{what}: use_ssh_config is only allowed in defaults.ssh")
        return s

    def _path(self, value: str) -> str:
        p = Path(os.path.expanduser(value))
        return str(p if p.is_absolute() else self.base_dir / p)

    def _labels(self, y: Y, what: str) -> dict[str, str]:
        ctx = self.ctx
        m = ctx.mapping(y, what)
        out: dict[str, str] = {}
        for key, v in (m or {}).items():
            line = y.key_lines[key]
            if not NAME.match(key):
                ctx.error(line, f"{what}: label name {key!r} may hold only letters, digits, '_', '.', '-'")
                continue
            if v.kind != "scalar" or v.value is None or isinstance(v.value, bool):
                ctx.error(v.line, f"{what}.{key}: a label value must be a string or number")
                continue
            out[key] = str(v.value)
        return out

    def _gpus(self, y: Y, what: str) -> dict[str, Any]:
        ctx = self.ctx
        out: dict[str, Any] = {}
        if ctx.mapping(y, what) is None:
            return out
        for key, v in ctx.keys(y, GPU_KEYS, what).items():
            w = f"{what}.{key}"
            if key == "count":
                val: Any = ctx.integer(v, w, 0, 1024)
            elif key == "model":
                val = ctx.string(v, w)
            elif key == "memory_gib":
                val = ctx.number(v, w, positive=True)
            else:
                val = ctx.string(v, w, ("nvlink", "pcie"))
            if val is not None:
                out[key] = val
        return out

    def _nics(self, y: Y, what: str) -> list[NicSpec] | None:
        ctx = self.ctx
        if y.kind != "seq":
            ctx.error(y.line, f"{what}: expected a list of NICs")
            return None
        nics = []
        seen: dict[str, int] = {}
        for i, item in enumerate(y.value):
            w = f"{what}[{i}]"
            if ctx.mapping(item, w) is None:
                continue
            known = ctx.keys(item, NIC_KEYS, w)
            if "netdev" not in known:
                ctx.error(item.line, f"{w}: missing 'netdev' (the interface name, e.g. eth0)")
                continue
            netdev = ctx.string(known["netdev"], f"{w}.netdev")
            if netdev is None:
                continue
            if netdev in seen:
                ctx.error(item.line, f"{w}: netdev {netdev!r} listed twice (first at line {seen[netdev]})")
            seen[netdev] = item.line
            nic = NicSpec(netdev=netdev)
            if "role" in known:
                nic.role = ctx.string(known["role"], f"{w}.role", ("management", "data", "storage")) or "data"  # type: ignore[assignment]
            if "rdma_device" in known:
                nic.rdma_device = ctx.string(known["rdma_device"], f"{w}.rdma_device")
            if "port" in known:
                nic.port = ctx.integer(known["port"], f"{w}.port", 1, 255) or 1
            if "speed_gbps" in known:
                nic.speed_gbps = ctx.number(known["speed_gbps"], f"{w}.speed_gbps", positive=True)
            if "address" in known:
                addr = ctx.string(known["address"], f"{w}.address")
                if addr is not None and ctx.address(addr.split("/")[0], known["address"].line, f"{w}.address"):
                    nic.address = addr
            nics.append(nic)
        return nics

    def fabric(self, y: Y) -> FabricProfile:
        ctx = self.ctx
        f = FabricProfile()
        if ctx.mapping(y, "fabric") is None:
            return f
        ranges = {"pfc_priority": (0, 7), "roce_dscp": (0, 63), "cnp_dscp": (0, 63), "mtu": (576, 9216)}
        for key, v in ctx.keys(y, ("kind", "trust", "pfc_priority", "roce_dscp", "cnp_dscp", "mtu"), "fabric").items():
            w = f"fabric.{key}"
            if key == "kind":
                f.kind = ctx.string(v, w, ("roce", "ib", "ethernet")) or f.kind  # type: ignore[assignment]
            elif key == "trust":
                f.trust = ctx.string(v, w, ("dscp", "pcp")) or f.trust  # type: ignore[assignment]
            else:
                val = ctx.integer(v, w, *ranges[key])
                if val is not None:
                    setattr(f, key, val)
        return f
