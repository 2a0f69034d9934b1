"""The lab's network: one bridge in the root namespace, one netns per host.

Host ``i`` lives in network namespace ``NAME`` with ``eth0`` (a veth whose
root-side end ``vNAME`` is a port of the bridge), a deterministic MAC and
``NET.x.y/16``; its default route points at the bridge (``NET.0.1``).
Nothing here is routed or NATed beyond the bridge.
"""

from __future__ import annotations

from pathlib import Path

from clusterctl.lab._run import ok, run
from clusterctl.lab.config import HostSpec, LabConfig

NETNS_DIR = Path("/run/netns")


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def ensure_bridge(cfg: LabConfig) -> None:
    """Create the bridge with the gateway address, if it is not there yet."""
    if not link_exists(cfg.bridge):
        run(["ip", "link", "add", cfg.bridge, "type", "bridge"])
    addrs = run(["ip", "-o", "-4", "addr", "show", "dev", cfg.bridge]).stdout
    if f" {cfg.gateway}/16 " not in addrs:
        run(["ip", "addr", "add", f"{cfg.gateway}/16", "dev", cfg.bridge])
    run(["ip", "link", "set", cfg.bridge, "up"])


def delete_bridge(cfg: LabConfig) -> None:
    if link_exists(cfg.bridge):
        run(["ip", "link", "del", cfg.bridge])


def create_host_net(cfg: LabConfig, h: HostSpec) -> None:
    """Create ``h``'s namespace and veth; any leftover of an earlier run is removed first."""
    delete_host_net(h)
    run(["ip", "netns", "add", h.netns])
    run(["ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "address", h.mac, "netns", h.netns])
    run(["ip", "link", "set", h.veth, "master", cfg.bridge, "up"])
    for argv in (
        ["link", "set", "lo", "up"],
        ["addr", "add", f"{h.address}/16", "dev", "eth0"],
        ["link", "set", "eth0", "up"],
        ["route", "add", "default", "via", cfg.gateway],
    ):
        run(["ip", "-n", h.netns, *argv])
    # A host recreated with the same address must not meet a stale entry (P16).
    ok(["ip", "neigh", "flush", "to", h.address, "dev", cfg.bridge])


def delete_host_net(h: HostSpec) -> None:
    """Remove ``h``'s veth and namespace (deleting the netns drops its links)."""
    if link_exists(h.veth):
        ok(["ip", "link", "del", h.veth])
    if netns_exists(h.netns):
        run(["ip", "netns", "del", h.netns])


def ns_run_argv(netns: str, argv: list[str]) -> list[str]:
    """``argv`` wrapped to run inside network namespace ``netns``."""
    return ["ip", "netns", "exec", netns, *argv]
