"""Check ``gpu.xid``: NVIDIA XIDs and driver failures in the kernel log.

Reads kernel-log lines (facts ``kernel_log`` or a bundle's ``kernel.log``) in
any of the forms seen in the wild: raw dmesg ``[sec.usec]``, ``dmesg -T``,
``journalctl -k`` short/short-iso, syslog and ISO-prefixed kern.log.  Each XID
is mapped to its GPU by PCI address and classified with ``checks/xid.yaml``.
One finding per (GPU, XID) episode, with the number of events; repeated
application XIDs on one GPU escalate to CRIT (``escalate_after``).
Also: ``GPU has fallen off the bus`` lines without an XID (folded into XID 79
of the same GPU), ``The NVIDIA probe routine failed`` and NVSwitch SXids
(fatal -> CRIT, non-fatal -> WARN; subject ``nvswitch:N``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from clusterctl.diagnose import sources
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.diagnose.thresholds import section

CHECK = "gpu.xid"

XID_RE = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
    r"(?: GPU-I:(?P<gi>\d+))?\): (?P<xid>\d+)"
    r"(?:, pid=(?P<pid>'<unknown>'|\d+|[^,]*))?(?:, name=(?P<name>[^,]*))?(?:, (?P<msg>.*))?$"
)
FALLEN_RE = re.compile(
    r"NVRM: GPU (?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?: "
    r"GPU has fallen off the bus"
)
PROBE_FAIL_RE = re.compile(r"NVRM: The NVIDIA probe routine failed for (\d+) device")
NOT_SUPPORTED_RE = re.compile(r"NVRM: The NVIDIA GPU (?P<pci>[0-9a-fA-F:.]+) \(PCI ID: (?P<id>[0-9a-fA-F:]+)\)")
SXID_RE = re.compile(
    r"nvidia-nvswitch(?P<sw>\d+): SXid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+), "
    r"(?P<kind>Non-fatal|Fatal)"
)
DMESG_TS_RE = re.compile(r"^\[\s*(\d+\.\d+)\]")
RECOVERY_RE = re.compile(r"changed from 0x[0-9a-fA-F]+ \([^)]*\) to 0x[0-9a-fA-F]+ \((?P<action>[^)]*)\)")


@dataclass
class XidEvent:
    """One parsed XID line."""

    pci: str
    xid: int
    pid: str | None
    name: str | None
    message: str
    gi: int | None
    stamp: str | None
    line: str


def parse_xid(line: str) -> XidEvent | None:
    """Parse one kernel-log line; None when it is not an XID line."""
    m = XID_RE.search(line.rstrip())
    if not m:
        return None
    ts = DMESG_TS_RE.match(line)
    stamp = ts.group(1) if ts else line[: m.start()].strip() or None
    pid = m["pid"].strip("'") if m["pid"] else None
    return XidEvent(
        pci=sources.normalize_pci(m["pci"]),
        xid=int(m["xid"]),
        pid=None if pid in (None, "<unknown>") else pid,
        name=None if m["name"] in (None, "<unknown>") else m["name"],
        message=(m["msg"] or "").strip(),
        gi=int(m["gi"]) if m["gi"] else None,
        stamp=stamp,
        line=line.strip(),
    )


@dataclass
class _Episode:
    events: list[XidEvent] = field(default_factory=list)

    def distinct(self) -> int:
        """Events, counting lines of one instant and pid once (an XID 13 prints several)."""
        if not all(e.stamp for e in self.events):
            return len(self.events)
        return len({(_second(e.stamp), e.pid) for e in self.events})


def _second(stamp: str | None) -> str:
    """A stamp to the second: dmesg ``103859.498995`` -> ``103859``; text stamps as they are."""
    s = stamp or ""
    return s.split(".")[0] if s.replace(".", "").isdigit() else s


def catalogue(ctx: AnalysisContext) -> dict[str, Any]:
    return section(ctx.thresholds, "xid", "")


def classify(cat: dict[str, Any], code: int, count: int, message: str = "") -> tuple[Severity, str, str]:
    """(severity, meaning, action) of ``count`` events of XID ``code``."""
    codes = cat.get("codes") or {}
    entry = codes.get(code) or codes.get(str(code))
    buckets = cat.get("buckets") or {}
    if not entry:
        unk = cat.get("unknown") or {}
        return (
            Severity[str(unk.get("severity", "WARN"))],
            "not in the XID catalogue",
            str(unk.get("action", "look the code up in NVIDIA's Xid catalogue")),
        )
    sev = Severity[str(entry.get("severity", "WARN"))]
    meaning = str(entry.get("name", "")) + (f" ({entry['note']})" if entry.get("note") else "")
    action = str(buckets.get(entry.get("bucket"), entry.get("bucket", "")))
    if code == 154:
        m = RECOVERY_RE.search(message)
        if m:
            action = f"the driver requires: {m['action']}; " + action
    limit = int(cat.get("escalate_after", 0) or 0)
    if sev == Severity.WARN and entry.get("escalate", True) and limit and count >= limit:
        sev = Severity.CRIT
        action = f"{count} events on one GPU: suspect the hardware; " + str(
            buckets.get("RESET_GPU", "drain and reset the GPU")
        )
    return sev, meaning, action


@analyzer(CHECK)
def check_xid(ctx: AnalysisContext) -> list[Finding]:
    cat = catalogue(ctx)
    out: list[Finding] = []
    for host in sources.all_hosts(ctx):
        if host in ctx.missing and host not in ctx.raw:
            continue  # host.reachable reports it
        lines, origin = sources.kernel_lines(ctx, host)
        if lines is None:
            out.append(
                Finding(
                    CHECK,
                    Severity.UNKNOWN,
                    host,
                    "host",
                    f"XIDs not checked: {origin}",
                    "make the kernel log readable (run with --sudo, or add kernel.log to the bundle)",
                )
            )
            continue
        found = _host_findings(ctx, cat, host, lines)
        out.extend(found or [Finding(CHECK, Severity.OK, host, "host", f"no XID in {len(lines)} kernel-log lines")])
    return out


def _subject(index_of: dict[str, int], pci: str, gi: int | None) -> str:
    idx = index_of.get(pci)
    base = f"gpu:{idx}" if idx is not None else f"gpu:{pci}"
    return base + (f"/gi:{gi}" if gi is not None else "")


def _host_findings(ctx: AnalysisContext, cat: dict[str, Any], host: str, lines: list[str]) -> list[Finding]:
    index_of = sources.pci_to_index(ctx, host)
    episodes: dict[tuple[str, int], _Episode] = {}
    fallen: dict[str, str] = {}
    sxids: dict[tuple[str, str], tuple[bool, int, str]] = {}
    out: list[Finding] = []
    for line in lines:
        ev = parse_xid(line)
        if ev is not None:
            episodes.setdefault((_subject(index_of, ev.pci, ev.gi), ev.xid), _Episode()).events.append(ev)
            continue
        m = FALLEN_RE.search(line)
        if m:
            fallen.setdefault(_subject(index_of, sources.normalize_pci(m["pci"]), None), line.strip())
            continue
        m = SXID_RE.search(line)
        if m:
            sx = f"nvswitch:{m['sw']}"
            fatal = m["kind"] == "Fatal"
            prev = sxids.get((sx, m["code"]))
            sxids[(sx, m["code"])] = (fatal or (prev[0] if prev else False), (prev[1] if prev else 0) + 1, line.strip())
            continue
        m = PROBE_FAIL_RE.search(line)
        if m:
            unsupported = [
                y.strip() for j, x in enumerate(lines) if NOT_SUPPORTED_RE.search(x) for y in lines[j : j + 3]
            ]
            out.append(
                Finding(
                    CHECK,
                    Severity.CRIT,
                    host,
                    "driver",
                    f"the NVIDIA driver failed to probe {m.group(1)} GPU(s)",
                    "check that the driver release supports this GPU (see the lines above it), "
                    "reinstall a matching driver and reboot; RMA if the GPU still fails",
                    tuple(unsupported[:6]) + (line.strip(),),
                )
            )
    for (subject, code), ep in sorted(episodes.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        n = ep.distinct()
        sev, meaning, action = classify(cat, code, n, ep.events[-1].message)
        first, last = ep.events[0], ep.events[-1]
        who = f", last by pid {last.pid} ({last.name})" if last.pid and last.name else ""
        times = f"{n} event" + ("s" if n != 1 else "")
        out.append(
            Finding(
                CHECK,
                sev,
                host,
                subject,
                f"XID {code} {meaning}: {times}{who}" if meaning else f"XID {code}: {times}",
                action,
                tuple(dict.fromkeys([first.line, last.line])),
            )
        )
        if code == 79:
            fallen.pop(subject, None)
    for (switch, sxid), (fatal, count, line) in sorted(sxids.items()):
        out.append(
            Finding(
                CHECK,
                Severity.CRIT if fatal else Severity.WARN,
                host,
                switch,
                f"NVSwitch SXid {sxid} ({'fatal' if fatal else 'non-fatal'}): {count} event"
                + ("s" if count > 1 else ""),
                "drain the node's NVLink-connected instances, restart the fabric manager, reset the "
                "switch tray or reboot; contact NVIDIA support if it recurs"
                if fatal
                else "watch for repeats; a fatal SXid needs a fabric reset",
                (line,),
            )
        )
    for subject, line in fallen.items():
        _, meaning, action = classify(cat, 79, 1)
        out.append(
            Finding(CHECK, Severity.CRIT, host, subject, "GPU has fallen off the bus (no XID line)", action, (line,))
        )
    return out
