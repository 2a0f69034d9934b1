"""Network faults of lab hosts: bandwidth, loss, cut, freeze.

=========  ==============================================================
fault      how (kernel facilities only; netem is absent here, lab.md §5)
=========  ==============================================================
bandwidth  tbf on both directions: the bridge-side veth (traffic to the
           host) and the host's eth0 (traffic from it)
loss       nftables ``numgen random`` drops ``percent`` % of the packets
           on eth0 in the host's netns, in each direction
cut        the host's bridge port is set down: nothing gets in or out
freeze     cgroup2 freeze of the host's whole process tree: the kernel
           still completes TCP handshakes, but sshd never answers
=========  ==============================================================

Active faults are recorded in ``hosts/NAME/faults.json``; :func:`heal`
removes them all (``thaw`` is ``heal`` of a freeze alone).
"""

from __future__ import annotations

import json
import os
import re
import shlex

from clusterctl.errors import LabError
from clusterctl.lab import container, procs
from clusterctl.lab._run import ok, run
from clusterctl.lab.config import HostSpec, LabConfig

NET_FAULTS = ("bandwidth", "loss", "cut", "freeze", "thaw")
NFT_TABLE = "clusterctl_loss"
#: tbf queue limit: packets waiting longer than this are dropped.
TBF_LATENCY = "50ms"
_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}


def parse_rate(rate: str) -> int:
    """``"100mbit"`` → 100_000_000 (bit/s); raises :class:`LabError` on nonsense."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(kbit|mbit|gbit|bit)\s*", rate.lower())
    if not m or float(m.group(1)) <= 0:
        raise LabError(f"bad rate {rate!r}: use a number with kbit, mbit or gbit, e.g. 100mbit")
    bits = int(float(m.group(1)) * _UNITS[m.group(2)])
    if bits < 8000:
        raise LabError(f"rate {rate!r} is below 8kbit")
    return bits


def tbf_burst_bytes(rate_bps: int) -> int:
    """Bucket size: 20 ms worth of data, at least 16 KiB (one timer tick's worth)."""
    return max(16 * 1024, rate_bps // 8 // 50)


def _faults_file(cfg: LabConfig, name: str):  # -> Path
    return container.host_dir(cfg, name) / "faults.json"


def active(cfg: LabConfig, name: str) -> list[str]:
    """The faults recorded for host ``name``, as ``"kind value"`` strings."""
    try:
        d = json.loads(_faults_file(cfg, name).read_text())
    except (FileNotFoundError, ValueError):
        return []
    return [f"{k} {v}" if v is not True else k for k, v in d.items()]


def _record(cfg: LabConfig, name: str, kind: str, value: object | None) -> None:
    f = _faults_file(cfg, name)
    try:
        d = json.loads(f.read_text())
    except (FileNotFoundError, ValueError):
        d = {}
    if value is None:
        d.pop(kind, None)
    else:
        d[kind] = value
    if not d:
        f.unlink(missing_ok=True)
        return
    tmp = f.with_name(f.name + ".tmp")
    tmp.write_text(json.dumps(d))
    os.replace(tmp, f)


def bandwidth(cfg: LabConfig, h: HostSpec, rate: str) -> None:
    """Limit ``h``'s traffic to ``rate`` in each direction (replaces an earlier limit)."""
    bps = parse_rate(rate)
    tbf = ["root", "tbf", "rate", f"{bps}bit", "burst", str(tbf_burst_bytes(bps)), "latency", TBF_LATENCY]
    run(["tc", "qdisc", "replace", "dev", h.veth, *tbf])
    run(["ip", "netns", "exec", h.netns, "tc", "qdisc", "replace", "dev", "eth0", *tbf])
    _record(cfg, h.name, "bandwidth", rate)


def loss(cfg: LabConfig, h: HostSpec, percent: float) -> None:
    """Drop ``percent`` % of ``h``'s packets on eth0, independently per direction."""
    if not 0 < percent <= 100:
        raise LabError(f"--percent must be in (0, 100], not {percent}")
    # numgen draws 0..9999: basis points give 0.01 % resolution.
    bp = round(percent * 100)
    rules = (
        f"table inet {NFT_TABLE} {{\n"
        f" chain in {{ type filter hook input priority -10; policy accept;\n"
        f"  iifname \"eth0\" numgen random mod 10000 < {bp} counter drop\n }}\n"
        f" chain out {{ type filter hook output priority -10; policy accept;\n"
        f"  oifname \"eth0\" numgen random mod 10000 < {bp} counter drop\n }}\n"
        f"}}\n"
    )
    _nft_delete(h)
    run(["ip", "netns", "exec", h.netns, "nft", "-f", "-"], input=rules)
    _record(cfg, h.name, "loss", f"{percent:g}%")


def _nft_delete(h: HostSpec) -> None:
    ok(["ip", "netns", "exec", h.netns, "nft", "delete", "table", "inet", NFT_TABLE])


def cut(cfg: LabConfig, h: HostSpec) -> None:
    """Take ``h`` off the network: its bridge port goes down (carrier lost on eth0)."""
    run(["ip", "link", "set", h.veth, "down"])
    _record(cfg, h.name, "cut", True)


def freeze(cfg: LabConfig, h: HostSpec) -> None:
    """Freeze every process of ``h`` (systemd, sshd, sessions, services)."""
    rel = container.cgroup_rel(cfg, h.name)
    if not procs.cgroup_dirs(rel):
        raise LabError(f"{h.name} has no cgroup: is it running?")
    if not procs.freeze_cgroup(rel):
        raise LabError(
            f"could not freeze {h.name}: cgroup2 freezer unavailable (/sys/fs/cgroup/unified/{rel}/cgroup.freeze)"
        )
    _record(cfg, h.name, "freeze", True)


def thaw(cfg: LabConfig, h: HostSpec) -> None:
    procs.thaw_cgroup(container.cgroup_rel(cfg, h.name))
    _record(cfg, h.name, "freeze", None)


def heal(cfg: LabConfig, h: HostSpec) -> list[str]:
    """Remove every network fault of ``h``; return the ones that were recorded."""
    was = active(cfg, h.name)
    thaw(cfg, h)
    ok(["tc", "qdisc", "del", "dev", h.veth, "root"])
    ok(["ip", "netns", "exec", h.netns, "tc", "qdisc", "del", "dev", "eth0", "root"])
    _nft_delete(h)
    ok(["ip", "link", "set", h.veth, "up"])
    _faults_file(cfg, h.name).unlink(missing_ok=True)
    return was


def inject(cfg: LabConfig, h: HostSpec, fault: str, *, rate: str | None = None, percent: float | None = None) -> str:
    """Apply network fault ``fault`` to ``h``; return a one-line description."""
    if fault == "bandwidth":
        if rate is None:
            raise LabError("bandwidth needs --rate, e.g. --rate 100mbit")
        bandwidth(cfg, h, rate)
        return f"{h.name}: bandwidth limited to {rate} each way"
    if fault == "loss":
        if percent is None:
            raise LabError("loss needs --percent, e.g. --percent 10")
        loss(cfg, h, percent)
        return f"{h.name}: dropping {percent:g}% of packets each way"
    if fault == "cut":
        cut(cfg, h)
        return f"{h.name}: cut off the network"
    if fault == "freeze":
        freeze(cfg, h)
        return f"{h.name}: frozen (`clusterctl lab inject {shlex.quote(h.name)} thaw` or `lab heal`)"
    if fault == "thaw":
        thaw(cfg, h)
        return f"{h.name}: thawed"
    raise LabError(f"unknown network fault {fault!r} (known: {', '.join(NET_FAULTS)})")
