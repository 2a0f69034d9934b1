"""Check ``net.link_flap``: a data NIC whose carrier went down and came back, from the logs.

The RoCE counters (``roce.link``) see a flap only while doctor samples them
(a few seconds); the kernel log keeps it.  Lines read (kernel log, or a
bundle's ``kernel.log``, which may hold the whole journal):

- mlx5: ``mlx5_core 0000:3b:00.0 eth2: Link down`` / ``Link up``
  (drivers/net/ethernet/mellanox/mlx5/core/en_main.c, ``mlx5e_update_carrier``);
- Intel and others: ``eth2: NIC Link is Down`` / ``NIC Link is Up ...``;
- systemd-networkd: ``eth2: Lost carrier`` / ``Gained carrier``.

Each data NIC of the inventory (``role: data``) with a down event is WARN
("flapped N times"), CRIT when its last event is a down with no up after it
(the link is still down as far as the log knows).  NICs that are not data
NICs are not reported.  No inventory or no data NIC: no finding.
"""

from __future__ import annotations

import re

from clusterctl.diagnose import sources
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer

CHECK = "net.link_flap"
_DOWN = re.compile(r"\b(?P<nic>[\w.-]+): (?:Link down|NIC Link is Down|Lost carrier)\b")
_UP = re.compile(r"\b(?P<nic>[\w.-]+): (?:Link up|NIC Link is Up|Gained carrier)\b")


def _data_nics(ctx: AnalysisContext, host: str) -> list[str]:
    inv = ctx.inventory
    if inv is None or host not in inv.hosts:
        return []
    return [n.netdev for n in inv.hosts[host].nics if n.role == "data"]


@analyzer(CHECK)
def check_link_flaps(ctx: AnalysisContext) -> list[Finding]:
    out: list[Finding] = []
    for host in sources.all_hosts(ctx):
        nics = _data_nics(ctx, host)
        if not nics or (host in ctx.missing and host not in ctx.raw):
            continue
        lines, origin = sources.kernel_lines(ctx, host)
        if lines is None:
            out.append(
                Finding(
                    CHECK,
                    Severity.UNKNOWN,
                    host,
                    "host",
                    f"link flaps not checked: {origin}",
                    "make the kernel log readable (run with --sudo)",
                )
            )
            continue
        downs: dict[str, list[str]] = {}
        last: dict[str, str] = {}
        for line in lines:
            for rx, kind in ((_DOWN, "down"), (_UP, "up")):
                m = rx.search(line)
                if m and m["nic"] in nics:
                    last[m["nic"]] = kind
                    if kind == "down":
                        downs.setdefault(m["nic"], []).append(line.strip())
        for nic in nics:
            events = downs.get(nic, [])
            if not events:
                continue
            still = last.get(nic) == "down"
            out.append(
                Finding(
                    CHECK,
                    Severity.CRIT if still else Severity.WARN,
                    host,
                    f"nic:{nic}",
                    f"data NIC {nic} lost its carrier {len(events)} time(s) in the log ({origin})"
                    + ("; the last event is a link down with no link up after it" if still else ", and came back"),
                    "every flap resets the RDMA/NCCL connections over it (a TP group across hosts fails or stalls): "
                    "check the cable or transceiver and the switch port's log; replace the cable if it repeats",
                    tuple(events[-3:]),
                )
            )
        if not downs:
            out.append(
                Finding(
                    CHECK, Severity.OK, host, "host", f"no carrier loss on {', '.join(nics)} in {len(lines)} log lines"
                )
            )
    return out
