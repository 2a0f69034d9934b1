"""``doctor --active``: RDMA write bandwidth between host pairs with ``ib_write_bw``.

Hosts whose facts show perftest's ``ib_write_bw`` (``tools.ib_write_bw``) and
an RDMA device behind a data NIC are paired in inventory order
(:func:`plan_rounds`): in each round every host is in at most one pair, a
server on one host and a client on its partner, all pairs of a round at
once.  The client writes to the server for ``active.duration_s`` seconds over
the data NIC's RDMA device (``-d DEV -i PORT``, RoCE v2 GID index ``-x``);
perftest's out-of-band exchange goes to the server's inventory address.
Each command is bounded by ``timeout`` on the node, and the round by the
runner's timeout: a hung test is an UNKNOWN row, never a stalled run.

Check ``roce.active``, one finding per pair on the client (the writer) with
subject ``pair:SERVER``: the client's ``BW average[MB/sec]`` (perftest's MB
is 2**20 bytes) in Gbit/s against the per-link-speed row of
``checks/roce.yaml`` ``speeds`` (``ib_write_bw_warn_gbps`` /
``ib_write_bw_crit_gbps``) for the slower of the two data NICs — OK, WARN
or CRIT.  UNKNOWN, with the reason, for a host without perftest, without an
RDMA data NIC, without a partner, without facts, for a test that failed or
timed out, and for a bundle (nothing can be run).  It is not a registered
analyzer: the rows appear only when ``--active`` is asked for.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.inventory.model import Inventory
from clusterctl.probe.factgroups import FactsDoc, NicsFact, ToolsFact
from clusterctl.probe.gid import ipv4_of_gid

CHECK = "roce.active"

#: perftest reports MB/sec in units of 2**20 bytes (its MBS format factor 0x100000).
MB = 1 << 20

#: Defaults where checks/roce.yaml has no ``active`` section.
DEFAULTS = {"duration_s": 5.0, "tcp_port": 18515, "slack_s": 15.0}

#: Fractions of the link speed used where a speed row has no ib_write_bw thresholds.
DEFAULT_WARN_FRACTION, DEFAULT_CRIT_FRACTION = 0.8, 0.5

_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(MB|Gb)/sec\]\s+BW average\[(MB|Gb)/sec\]")


@dataclass(frozen=True)
class BwResult:
    """One ``ib_write_bw`` result row: message size (bytes), iterations, and
    peak/average bandwidth in Gbit/s (peak is 0 in duration mode, ``-D``)."""

    size: int
    iterations: int
    peak_gbps: float
    avg_gbps: float


@dataclass(frozen=True)
class RunOutput:
    """What a runner returns per host: exit status (``None``: never finished),
    stdout, and a one-line reason when the command could not run."""

    rc: int | None
    stdout: str
    error: str | None = None


#: ``runner({host: shell command}, timeout_s)`` runs the commands at once and
#: returns every host's :class:`RunOutput`.
Runner = Callable[[Mapping[str, str], float], Mapping[str, RunOutput]]


def parse_ib_write_bw(text: str) -> BwResult | None:
    """The last result row under perftest's ``#bytes #iterations BW peak[...]``
    header, converted to Gbit/s; ``None`` when the output has no result."""
    unit_gbps: float | None = None
    found: BwResult | None = None
    for line in text.splitlines():
        m = _HEADER.search(line)
        if m:
            unit_gbps = MB * 8 / 1e9 if m.group(2) == "MB" else 1.0
            continue
        if unit_gbps is None:
            continue
        words = line.split()
        if len(words) >= 4 and words[0].isdigit() and words[1].isdigit():
            try:
                peak, avg = float(words[2]), float(words[3])
            except ValueError:
                continue
            found = BwResult(int(words[0]), int(words[1]), peak * unit_gbps, avg * unit_gbps)
    return found


def plan_rounds(hosts: Sequence[str]) -> list[list[tuple[str, str]]]:
    """``(server, client)`` pairs in rounds: consecutive hosts pair up
    (h1-h2, h3-h4, ...); with an odd count the last host is the client of
    the first in a second round.  Every host is tested at least once and is
    in at most one pair per round."""
    pairs = [(hosts[i], hosts[i + 1]) for i in range(0, len(hosts) - 1, 2)]
    rounds = [pairs] if pairs else []
    if len(hosts) % 2 and len(hosts) > 1:
        rounds.append([(hosts[0], hosts[-1])])
    return rounds


@dataclass(frozen=True)
class Endpoint:
    """A host's side of a test: its ``ib_write_bw``, RDMA device/port, GID index, link speed."""

    host: str
    program: str
    device: str
    port: int
    gid_index: int | None
    gbps: float | None


def endpoint(host: str, facts: FactsDoc, inv: Inventory | None) -> Endpoint | str:
    """The host's test endpoint, or why it cannot take part."""
    tools = ToolsFact.parse(facts)
    if not tools.read:
        return (
            "the facts do not say whether perftest is installed ("
            + ("; ".join(tools.reasons) or "an older collector")
            + ")"
        )
    program = tools.path("ib_write_bw")
    if not program:
        return "ib_write_bw (perftest) is not installed: no RDMA bandwidth test"
    ports = [(n, n.rdma) for n in NicsFact.parse(facts).nics if n.rdma is not None]
    if inv is not None and host in getattr(inv, "hosts", {}):
        data = {s.netdev for s in inv.hosts[host].nics_with_role("data")}
        ports = [(n, r) for n, r in ports if n.netdev in data]
    nic, rdma = next(((n, r) for n, r in ports if (r.state or "ACTIVE") == "ACTIVE"), (None, None))
    if nic is None or rdma is None:
        return "no active RDMA device behind a data NIC"
    gids = [g for g in rdma.gids if "RoCE v2" in str(g.type)]
    gid = next((g for g in gids if ipv4_of_gid(g.gid) is not None), gids[0] if gids else None)
    return Endpoint(
        host,
        str(program),
        str(rdma.device),
        int(rdma.port or 1),
        gid.index if gid is not None else None,
        nic.gbps,
    )


def _argv(ep: Endpoint, duration: float, tcp_port: int) -> list[str]:
    argv = [ep.program, "-d", ep.device, "-i", str(ep.port), "-F", "-D", f"{duration:g}", "-p", str(tcp_port)]
    if ep.gid_index is not None:
        argv += ["-x", str(ep.gid_index)]
    return argv


def commands(
    server: Endpoint, client: Endpoint, server_address: str, duration: float, tcp_port: int, limit_s: float
) -> tuple[str, str]:
    """Shell commands for a pair: the server waits for one client; the client
    retries for a few seconds while the server starts.  Both run under
    ``timeout`` (``limit_s`` seconds, then KILL 2 s later)."""
    bound = ["timeout", "-k", "2", f"{limit_s:g}"]
    srv = shlex.join(bound + _argv(server, duration, tcp_port))
    cli = shlex.join(bound + _argv(client, duration, tcp_port) + [server_address])
    client_cmd = f"for i in 1 2 3 4 5; do {cli} && exit 0; rc=$?; [ $rc -ge 124 ] && exit $rc; sleep 1; done; exit $rc"
    return srv, client_cmd


def _threshold(thresholds: Mapping[str, Any] | None, gbps: float | None) -> tuple[float, float] | None:
    """``(warn, crit)`` Gbit/s for a link of ``gbps``: the speed row's values, else fractions of it."""
    if gbps is None:
        return None
    rows = ((thresholds or {}).get("roce") or {}).get("speeds") if isinstance(thresholds, Mapping) else None
    rows = sorted((r for r in rows or [] if isinstance(r, Mapping)), key=lambda r: -float(r.get("min_gbps", 0)))
    row: Mapping[str, Any] = next((r for r in rows if gbps >= float(r.get("min_gbps", 0))), {})
    warn = row.get("ib_write_bw_warn_gbps", gbps * DEFAULT_WARN_FRACTION)
    crit = row.get("ib_write_bw_crit_gbps", gbps * DEFAULT_CRIT_FRACTION)
    return float(warn), float(crit)


def _settings(thresholds: Mapping[str, Any] | None) -> dict[str, float]:
    sec = ((thresholds or {}).get("roce") or {}).get("active") if isinstance(thresholds, Mapping) else None
    out = dict(DEFAULTS)
    if isinstance(sec, Mapping):
        out.update({k: float(v) for k, v in sec.items() if k in DEFAULTS and isinstance(v, (int, float))})
    return out


def _pair_finding(
    server: Endpoint,
    client: Endpoint,
    out: Mapping[str, RunOutput],
    duration: float,
    thresholds: Mapping[str, Any] | None,
) -> Finding:
    subj = f"pair:{server.host}"
    what = f"{client.host} {client.device} -> {server.host} {server.device}"
    res = out.get(client.host)
    got = parse_ib_write_bw(res.stdout) if res is not None else None
    if got is None:
        if res is None:
            why = "no result"
        elif res.error:
            why = res.error
        elif res.rc is not None and res.rc >= 124:
            why = "timed out"
        else:
            why = f"exit status {res.rc}, no bandwidth in its output"
        srv = out.get(server.host)
        tail = f"; server: {srv.error}" if srv is not None and srv.error else ""
        return Finding(
            CHECK,
            Severity.UNKNOWN,
            client.host,
            subj,
            f"{what}: ib_write_bw failed ({why}{tail})",
            "run ib_write_bw by hand on the pair to see why (device, GID index, firewall on the perftest port)",
        )
    speeds = [g for g in (server.gbps, client.gbps) if g]
    link = min(speeds) if speeds else None
    limits = _threshold(thresholds, link)
    msg = f"{what}: {got.avg_gbps:.1f} Gb/s average over {duration:g} s"
    ev = (f"message size {got.size} B, {got.iterations} iterations",)
    if limits is None:
        return Finding(CHECK, Severity.OK, client.host, subj, msg + " (link speed unknown: not judged)", "", ev)
    warn, crit = limits
    if got.avg_gbps < crit:
        sev = Severity.CRIT
    elif got.avg_gbps < warn:
        sev = Severity.WARN
    else:
        return Finding(CHECK, Severity.OK, client.host, subj, f"{msg} on a {link:g} Gb/s link", "", ev)
    return Finding(
        CHECK,
        sev,
        client.host,
        subj,
        f"{msg}, below {warn if sev is Severity.WARN else crit:g} Gb/s for a {link:g} Gb/s link",
        "check the pair's roce.* and net.data findings (PFC, link speed, MTU), then each host "
        "against a third one to find the slow side",
        ev,
    )


def active_findings(
    facts: Mapping[str, FactsDoc],
    missing: Mapping[str, str],
    live: bool = True,
    *,
    inventory: Inventory | None = None,
    runner: Runner | None = None,
    addresses: Mapping[str, str] | None = None,
    thresholds: Mapping[str, Any] | None = None,
    max_pairs: int | None = None,
) -> list[Finding]:
    """``roce.active`` findings: pair results where a ``runner`` can run the
    tests, UNKNOWN rows saying why for every host that was not tested.
    ``max_pairs`` caps the pairs run at once (a server holds its SSH slot
    until its client connects, so at most half the fan-out)."""
    out: list[Finding] = []
    if not live:
        return [
            Finding(
                CHECK,
                Severity.UNKNOWN,
                h,
                "host",
                "no active test on a bundle",
                "run doctor --active against the live hosts",
            )
            for h in facts
        ]
    order = list(facts)
    if inventory is not None:
        pos = {h: i for i, h in enumerate(getattr(inventory, "hosts", {}))}
        order.sort(key=lambda h: pos.get(h, len(pos)))
    eps: dict[str, Endpoint] = {}
    for host in order:
        ep = endpoint(host, facts[host], inventory)
        if isinstance(ep, str):
            act = (
                "install perftest on the hosts to measure RDMA bandwidth between them"
                if "not installed" in ep
                else "upgrade clusterctl on the control host"
                if "older collector" in ep
                else "check the data NIC's RDMA device (net.data)"
            )
            out.append(Finding(CHECK, Severity.UNKNOWN, host, "host", ep, act))
        elif runner is None:
            out.append(
                Finding(
                    CHECK,
                    Severity.UNKNOWN,
                    host,
                    "host",
                    f"ib_write_bw found at {ep.program}, but no way to run it from here",
                    "run doctor --active against the live hosts",
                )
            )
        else:
            eps[host] = ep
    for host, why in missing.items():
        out.append(
            Finding(
                CHECK,
                Severity.UNKNOWN,
                host,
                "host",
                f"no facts: {why}",
                "make the host reachable and run doctor again",
            )
        )
    if runner is None:
        return out
    names = list(eps)
    if len(names) == 1:
        out.append(
            Finding(
                CHECK,
                Severity.UNKNOWN,
                names[0],
                "host",
                "no partner: no other host with perftest and an RDMA data NIC",
                "install perftest on a second host",
            )
        )
        return out
    cfg = _settings(thresholds)
    duration, port = cfg["duration_s"], int(cfg["tcp_port"])
    limit = duration + cfg["slack_s"]
    step = max(1, max_pairs or len(names))
    batches = [rnd[i : i + step] for rnd in plan_rounds(names) for i in range(0, len(rnd), step)]
    for rnd in batches:
        cmds: dict[str, str] = {}
        for server, client in rnd:
            addr = (addresses or {}).get(server, server)
            cmds[server], cmds[client] = commands(eps[server], eps[client], addr, duration, port, limit)
        results = runner(cmds, limit + 10)
        for server, client in rnd:
            out.append(_pair_finding(eps[server], eps[client], results, duration, thresholds))
    return out
