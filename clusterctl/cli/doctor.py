"""``clusterctl doctor``: what is wrong with the cluster, and what to do about it.

Collects facts (and each instance's journal and /metrics) over SSH, or reads a
bundle (``--from``), runs the analyzers of ``clusterctl.diagnose`` and prints
the findings: a table of identical findings grouped over hosts (node sets),
worst first, each with its action; or JSON, Markdown, Prometheus text.
Exit status is the worst finding: 0 OK, 1 WARN, 2 CRIT, 3 UNKNOWN (could
not check anything worse; also usage and configuration errors).
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer

from clusterctl.cli._common import cluster_meta, console, err_console, fail, load_inventory, user_config
from clusterctl.cli._hosts import HostProgress, become_password, check_host_key_policy, select
from clusterctl.cli._options import (
    AskBecomePassOpt,
    ConnectTimeoutOpt,
    DeadlineOpt,
    FanoutOpt,
    HostKeyOpt,
    HostsAllArg,
    InventoryOpt,
    JsonOpt,
    ProbeSudoOpt,
    ProbeTimeoutOpt,
)
from clusterctl.diagnose.findings import Finding, Severity, exit_code
from clusterctl.errors import ClusterctlError

if TYPE_CHECKING:
    from clusterctl.diagnose.bundle import Snapshot
    from clusterctl.inventory.model import Inventory
    from clusterctl.ops.doctor import DoctorEvent, DoctorRequest, Learned, Resolved

HELP = """Diagnose GPUs (XIDs, ECC, remapped rows, lost GPUs, PCIe, NVLink, clocks,
temperature), the cause of an instance's OOM, serving health from /metrics,
TP groups (one bad GPU makes its group UNAVAILABLE), and the RoCE fabric.

Log lines count from each unit's last start and the current boot (older
problems are OK "history" rows; --since counts more). Acknowledged findings
(doctor ack) are OK rows until they expire.

Never changes node state. Findings identical on many hosts are one row with a
node set; CRIT first, each with its action. A host that cannot be reached, or
a check without data, is UNKNOWN. Exit status: 0 OK, 1 WARN, 2 CRIT, 3 UNKNOWN
(also usage and configuration errors).

Examples:

  clusterctl doctor all -i /var/lib/clusterctl-lab/inventory.yaml

  clusterctl doctor 'gpu[01-04]' --checks xid,remap,tp --format markdown

  clusterctl doctor --from bundle.tar.gz --json

  clusterctl doctor --from nvidia-bug-report.log.gz --host gpu07   # one file, any raw output

  clusterctl doctor --from ./gpu07-outputs/ --explain-input   # what was recognised, what ignored, why

  clusterctl doctor all --learn baseline.yaml; clusterctl doctor all --baseline baseline.yaml

  clusterctl doctor all --checks serving,drift,leak   # drift vs each instance's baseline, context-leak canaries

  clusterctl doctor all --since 6h   # also count log lines of earlier runs/boots from the last 6 h

  clusterctl doctor ack gpu.xid gpu:3 --host gpu07 --until 3d --reason "RMA 4411"   # --list, --remove
"""

SEVERITY_STYLE = {Severity.CRIT: "bold red", Severity.WARN: "yellow", Severity.UNKNOWN: "magenta", Severity.OK: "green"}
FORMATS = ("table", "json", "markdown", "prom")


def checks_option() -> Any:
    return typer.Option(
        None,
        "--checks",
        "-c",
        help="Comma-separated checks or groups: gpu, xid, oom, serving, tp, roce, gpu.remap ...; "
        "drift and leak (they send requests to the instances) run only when named.",
    )


class ProbeView:
    """Renders a doctor workflow's events (and inventory discover's and diff's): the per-host probe
    bar (``label``: its name), notes, warnings on stderr."""

    def __init__(self, progress: bool = True, label: str = "probe"):
        self.progress, self.label, self.bar = progress, label, None

    def __call__(self, e: DoctorEvent) -> None:
        if e.kind == "probe-start":
            self.bar = HostProgress(e.count, self.label, self.progress).__enter__()
        elif e.kind == "probe-end" and self.bar is not None:
            bar, self.bar = self.bar, None
            bar.__exit__(None, None, None)
        elif e.kind == "host" and self.bar is not None:
            self.bar(e.result)
        elif e.kind == "note" and self.bar is not None:
            self.bar.note(e.text)
        elif e.kind == "warning":
            err_console.print(f"warning: {e.text}", markup=False)


def live_request(
    pattern: str,
    inventory: Optional[str],
    *,
    interval: float,
    timeout: float,
    sudo: bool,
    ask_become_pass: bool,
    fanout: Optional[int],
    connect_timeout: Optional[float],
    deadline: Optional[float],
    host_key_policy: Optional[str],
    raw_outputs: bool = False,
    resolved: Optional[Resolved] = None,
    load_acks: Optional[Callable[[], list[dict[str, Any]]]] = None,
) -> DoctorRequest:
    """The workflow's request for the hosts ``pattern`` selects (exits 3 on bad options or inventory):
    the hosts selected, the sudo password read here, at the CLI's edge; ``resolved``: the checks
    (``ops.doctor.resolve``; None: every analyzer, no thresholds)."""
    from clusterctl.ops import doctor as ops

    policy = check_host_key_policy(host_key_policy)
    path, hosts = select(inventory, pattern)
    inv = load_inventory(path)
    password = become_password(ask_become_pass, hosts, sudo)
    probe = ops.Probe(
        interval=interval,
        timeout=timeout,
        fanout=fanout,
        connect_timeout=connect_timeout,
        deadline=deadline,
        sudo=sudo,
        become_password=password,
        host_key_policy=policy,
        raw_outputs=raw_outputs,
    )
    return ops.live_request(
        user_config(), pattern, inv, path, hosts, probe, resolved or ops.Resolved(), load_acks=load_acks
    )


def live_snapshot(
    pattern: str,
    inventory: Optional[str],
    *,
    interval: float,
    timeout: float,
    sudo: bool,
    ask_become_pass: bool,
    fanout: Optional[int],
    connect_timeout: Optional[float],
    deadline: Optional[float],
    host_key_policy: Optional[str],
    progress: bool = True,
    raw_outputs: bool = False,
) -> tuple[Snapshot, Optional[Inventory], str]:
    """``(snapshot, inventory, inventory path)`` gathered over SSH from the selected hosts."""
    from clusterctl.ops.doctor import gather

    req = live_request(
        pattern,
        inventory,
        interval=interval,
        timeout=timeout,
        sudo=sudo,
        ask_become_pass=ask_become_pass,
        fanout=fanout,
        connect_timeout=connect_timeout,
        deadline=deadline,
        host_key_policy=host_key_policy,
        raw_outputs=raw_outputs,
    )
    got = gather(req, ProbeView(progress))
    assert req.inventory_path is not None  # a live request always names its inventory (ops.live_request)
    return got.snapshot, got.inventory, req.inventory_path


def bundle_request(
    source: str,
    inventory: Optional[str],
    host: Optional[str] = None,
    pattern: str = "all",
    resolved: Optional[Resolved] = None,
    load_acks: Optional[Callable[[], list[dict[str, Any]]]] = None,
) -> DoctorRequest:
    """The workflow's request for a bundle; ``-i`` (loaded after the bundle is read) beats its own inventory."""
    from clusterctl.ops import doctor as ops

    return ops.bundle_request(
        user_config(),
        source,
        pattern=pattern,
        host=host,
        load_inventory=(lambda: load_inventory(inventory)) if inventory else None,
        load_config=user_config,  # the cluster's state, as bound by loading the inventory
        resolved=resolved or ops.Resolved(),
        load_acks=load_acks,
    )


def _table(findings: list[Finding], show_ok: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    from clusterctl.report.findings import group, merge_checks, summary

    groups = merge_checks(group(findings, Severity.OK if show_ok else Severity.UNKNOWN))
    if groups:
        table = Table(
            "severity",
            "hosts",
            "subject",
            "check",
            "finding / action",
            box=None,
            header_style="bold",
            pad_edge=False,
            show_lines=False,
        )
        table.columns[1].overflow = table.columns[2].overflow = "fold"
        for g in groups:
            action = f"\n[dim]-> {escape(g.action)}[/]" if g.action else ""
            table.add_row(
                f"[{SEVERITY_STYLE[g.severity]}]{g.severity.name}[/]",
                escape(g.hosts or "-"),
                escape(g.subject),
                escape(g.check),
                escape(g.message) + action,
            )
        console.print(table)
    s = summary(findings)
    ok_hosts = sorted({f.host for f in findings if f.host and f.severity == Severity.OK})
    counts = ", ".join(f"{n} {k}" for k, n in s["counts"].items() if n) or "no findings"
    from clusterctl.ops.doctor import settled_counts

    settled = settled_counts(findings)
    extra = "".join(f"; {n} {k}" for k, n in settled.items() if n)
    console.print(
        f"{s['worst']}: {counts}{extra}" + ("" if show_ok or not ok_hosts else " (OK rows hidden; --all shows them)"),
        markup=False,
    )


def render(findings: list[Finding], fmt: str, show_ok: bool, meta: dict[str, Any]) -> None:
    from clusterctl.report import findings as rf

    if fmt == "json":
        sys.stdout.write(rf.to_json(findings, meta=meta) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(rf.to_markdown(findings, min_severity=Severity.OK if show_ok else Severity.UNKNOWN))
    elif fmt == "prom":
        sys.stdout.write(rf.to_prometheus(findings))
    else:
        if meta.get("cluster"):  # on stderr, as the progress: stdout stays the table
            err_console.print(f"cluster {meta['cluster']} (state {meta['state_dir']})", markup=False)
        _table(findings, show_ok)


def doctor(
    pattern: str = HostsAllArg,
    inventory: Optional[str] = InventoryOpt,
    checks: Optional[str] = checks_option(),
    as_json: bool = JsonOpt,
    fmt: str = typer.Option("table", "--format", help="table, json, markdown or prom (Prometheus text)."),
    source: Optional[str] = typer.Option(
        None, "--from", help="Analyse a bundle (directory or .tar.gz) instead of hosts."
    ),
    interval: float = typer.Option(
        2.0, "--interval", min=0, help="Seconds between the two /metrics and NIC counter samples (0: one sample)."
    ),
    show_all: bool = typer.Option(False, "--all", help="Show OK rows too."),
    explain_input: bool = typer.Option(
        False,
        "--explain-input",
        help="With --from: list every input file, what it was recognised as or why it was ignored, then exit.",
    ),
    host_name: Optional[str] = typer.Option(
        None,
        "--host",
        help="With --from on loose files: the host they come from "
        "(default: the directory's name, 'local' for one file).",
    ),
    learn: Optional[str] = typer.Option(
        None,
        "--learn",
        help="Record the hosts' GPU configuration as the known-good baseline in this YAML file, then exit.",
    ),
    baseline: Optional[str] = typer.Option(
        None, "--baseline", help="Compare with a baseline written by --learn (gpu.baseline)."
    ),
    active: bool = typer.Option(
        False,
        "--active",
        help="Also test RDMA bandwidth between host pairs with ib_write_bw "
        "(perftest, where installed; UNKNOWN rows say why not).",
    ),
    since: Optional[str] = typer.Option(
        None,
        "--since",
        help="Count log lines from this time (2h, 3d, 2026-11-30T10:00Z) even "
        "before the unit's last start or the last boot (default: only "
        "the current run and boot count; older problems are history rows).",
    ),
    timeout: float = ProbeTimeoutOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    deadline: Optional[float] = DeadlineOpt,
    sudo: bool = ProbeSudoOpt,
    ask_become_pass: bool = AskBecomePassOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.ops import doctor as ops

    fmt = "json" if as_json else fmt
    if fmt not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    options = ops.DoctorOptions(
        checks=checks,
        baseline=baseline,
        since=since,
        active=active,
        bundle=source,
        learn=learn,
        explain_input=explain_input,
    )
    try:
        resolved = ops.resolve(options)
    except ClusterctlError as e:
        fail(str(e))

    def acks() -> list[dict[str, Any]]:  # after the snapshot: the state of the -i inventory's cluster
        return ops.load_acks(user_config().state_dir)

    view = ProbeView(fmt == "table")
    try:
        if source:
            req = bundle_request(source, inventory, host_name, pattern, resolved, acks)
            if explain_input:
                _explain(ops.read_bundle(req)[0], fmt)
        else:
            req = live_request(
                pattern,
                inventory,
                interval=interval,
                timeout=timeout,
                sudo=sudo,
                ask_become_pass=ask_become_pass,
                fanout=fanout,
                connect_timeout=connect_timeout,
                deadline=deadline,
                host_key_policy=host_key_policy,
                resolved=resolved,
                load_acks=acks,
            )
            if learn:
                _learned(ops.learn(req, learn, view))
        run = ops.run_doctor(req, view)
    except ClusterctlError as e:
        fail(str(e))
    meta = {**run.meta, **cluster_meta()}
    render(run.findings, fmt, show_all, meta)
    raise typer.Exit(exit_code(run.findings))


def _explain(snap: Snapshot, fmt: str) -> None:
    """``--explain-input``: per host, each file and what became of it; skipped and cut files."""
    info = snap.meta.get("input") or {}
    if fmt == "json":
        sys.stdout.write(json.dumps({"hosts": snap.inputs, "missing": snap.missing, **info}, indent=2) + "\n")
        raise typer.Exit(0)
    from rich.markup import escape
    from rich.table import Table

    table = Table("host", "file", "read as", "note", box=None, header_style="bold", pad_edge=False)
    for host in sorted(set(snap.inputs) | set(snap.missing)):
        for rec in snap.inputs.get(host) or []:
            kind = rec.get("kind")
            table.add_row(
                escape(host),
                escape(str(rec.get("path"))),
                escape(kind) if kind else "[magenta]ignored[/]",
                escape(str(rec.get("note") or "")),
            )
        if host in snap.missing:
            table.add_row(escape(host), "-", "[magenta]no data[/]", escape(snap.missing[host]))
    for s in info.get("skipped") or []:
        table.add_row("-", escape(str(s["path"])), "[magenta]skipped[/]", escape(str(s["reason"])))
    for path, size in (info.get("truncated") or {}).items():
        table.add_row(
            "-",
            escape(str(path)),
            "[yellow]cut[/]",
            f"{size} bytes; only the last part was read (limits in docs/bundles.md)",
        )
    console.print(table)
    raise typer.Exit(0)


def _learned(done: Learned) -> None:
    """``--learn``'s outcome (``ops.doctor.Learned``); exits 2 when some host was not learned."""
    console.print(f"baseline: {done.hosts} host(s) written to {done.path}", markup=False)
    for host, reason in done.missing.items():
        err_console.print(f"{host}: not learned: {reason}", markup=False)
    raise typer.Exit(2 if done.missing else 0)


ACK_HELP = """Acknowledge a known problem: doctor and report show its finding as an
OK row "acknowledged until TIME (reason)" and leave it out of the exit code
until TIME; after that it counts again. Kept in the state directory (acks.json).
CHECK and SUBJECT are as doctor prints them (--json: check, subject).

Examples:

  clusterctl doctor ack gpu.xid gpu:3 --host gpu07 --until 3d --reason "RMA ticket 4411"

  clusterctl doctor ack --list

  clusterctl doctor ack gpu.xid gpu:3 --remove
"""


def ack(
    check: Optional[str] = typer.Argument(None, help="The finding's check, e.g. gpu.xid."),
    subject: Optional[str] = typer.Argument(None, help="The finding's subject, e.g. gpu:3 or instance:qwen-a."),
    until: Optional[str] = typer.Option(
        None, "--until", help="Until when: a duration (12h, 3d) or a time (2026-12-05T09:00Z)."
    ),
    reason: str = typer.Option("", "--reason", help="Why (shown on the row)."),
    host: Optional[str] = typer.Option(None, "--host", help="Only on this host (default: every host)."),
    list_: bool = typer.Option(False, "--list", help="List the acknowledgements and exit."),
    remove: bool = typer.Option(False, "--remove", help="Remove the acknowledgement of CHECK SUBJECT."),
    inventory: Optional[str] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    from clusterctl.ops import doctor as ops

    if inventory:  # the cluster whose acknowledgements these are (else the default inventory's)
        load_inventory(inventory)
    state = user_config().state_dir
    now = time.time()
    try:
        if list_:
            rows = ops.list_acks(state, now)
            if as_json:
                sys.stdout.write(json.dumps({"state_dir": str(state), "acks": rows}, indent=2) + "\n")
                raise typer.Exit(0)
            for a in rows:
                gone = " (expired)" if a["expired"] else ""
                console.print(
                    f"{a['check']} {a['subject']} on {a.get('host') or 'every host'} until "
                    f"{a['until']}{gone}" + (f": {a['reason']}" if a.get("reason") else ""),
                    markup=False,
                )
            console.print(f"{len(rows)} acknowledgement(s) in {ops.ack_path(state)}", markup=False)
            raise typer.Exit(0)
        if not check or not subject:
            fail("give CHECK and SUBJECT (as doctor --json prints them), or --list")
        if remove:
            n = ops.remove_ack(state, check, subject, host)
            if not n:
                fail(f"no acknowledgement of {check} {subject}" + (f" on {host}" if host else ""))
            console.print(f"removed {n} acknowledgement(s) of {check} {subject}", markup=False)
            raise typer.Exit(0)
        if not until:
            fail("--until is required (a duration such as 3d, or a time): acknowledgements expire")
        entry = ops.add_ack(state, check, subject, until, host=host, reason=reason, now=now)
    except ClusterctlError as e:
        fail(str(e))
    console.print(
        f"acknowledged {check} {subject} on {host or 'every host'} until {entry['until']} (in {ops.ack_path(state)})",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    app.command("doctor", help=HELP)(doctor)
    app.command("doctor-ack", help=ACK_HELP, hidden=True)(ack)
