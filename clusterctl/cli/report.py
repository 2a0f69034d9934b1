"""``clusterctl report``: unattended health reports with history (issue #12).

``report run`` runs doctor's passive checks (or reads a bundle), stores the
run in the history database, compares it with the previous run (new,
ongoing, resolved) and writes JSON/Markdown/HTML and node_exporter textfile
output.  Exit status as doctor: 0 OK, 1 WARN, 2 CRIT, 3 UNKNOWN (also usage
errors, a locked or unreadable history).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from clusterctl.cli import _complete
from clusterctl.cli._common import (
    cluster_meta,
    console,
    err_console,
    fail,
    load_inventory,
    print_json,
    user_config,
    write_files,
)
from clusterctl.cli._options import (
    ConnectTimeoutOpt,
    DeadlineOpt,
    FanoutOpt,
    HostKeyOpt,
    HostsAllArg,
    InventoryOpt,
    JsonOpt,
    ProbeTimeoutOpt,
)
from clusterctl.errors import ClusterctlError

app = typer.Typer(
    help="Unattended health reports: history, changes, trends, Prometheus textfile.\n\n"
    "Example:\n\n  clusterctl report run all --out /var/www/report --textfile "
    "/var/lib/node_exporter/textfile/clusterctl.prom",
    no_args_is_help=True,
    rich_markup_mode=None,
)

DbOpt = typer.Option(None, "--db", help="History database [default: $XDG_STATE_HOME/clusterctl/report.db].")


def db_path(db: Optional[str]) -> Path:
    from clusterctl.ops.report import db_path as path

    return path(db, user_config())


@app.command(
    "run",
    help="""Run doctor's passive checks, store the run and report what changed.

Compares with the previous run of the same PATTERN: problems new, ongoing
and resolved. --out DIR gets report.json, report.md and report.html (self-
contained); --textfile a node_exporter .prom file (written atomically).
--notify-cmd runs only when something changed, or a problem lasted --renotify;
it gets the JSON of the change on stdin. Overlapping runs wait for each
other's lock (--lock-wait) and then exit 3. --active drift,leak,bench sends
requests to the instances instead (drift against a baseline named after the
instance, the context-leak check, a short TTFT bench); it is stored and compared
as its own series. Exit status: 0 OK, 1 WARN, 2 CRIT, 3 UNKNOWN.

Examples:

  clusterctl report run all --out ~/report --textfile /var/lib/node_exporter/textfile/clusterctl.prom

  clusterctl report run --from bundle.tar.gz --notify-cmd '/usr/local/bin/page-oncall --team gpu' --renotify 6h

  clusterctl report run all --active drift,leak --out ~/report/active

  clusterctl report run all --failover      # then move UNAVAILABLE TP groups (docs/gateway.md)
""",
)
def run(
    pattern: str = HostsAllArg,
    inventory: Optional[str] = InventoryOpt,
    db: Optional[str] = DbOpt,
    out: Optional[str] = typer.Option(None, "--out", help="Directory for report.json, report.md, report.html."),
    textfile: Optional[str] = typer.Option(None, "--textfile", help="node_exporter textfile (.prom) to write."),
    notify_cmd: Optional[str] = typer.Option(
        None, "--notify-cmd", help="Command that gets the JSON of what changed on stdin."
    ),
    renotify: str = typer.Option("6h", "--renotify", help="Re-notify a lasting problem this often (0: never)."),
    retention: float = typer.Option(35.0, "--retention-days", min=0.01, help="Days of history to keep."),
    lock_wait: float = typer.Option(0.0, "--lock-wait", min=0, help="Seconds to wait for a running report."),
    source: Optional[str] = typer.Option(None, "--from", help="Analyse a bundle instead of hosts."),
    active: Optional[str] = typer.Option(
        None,
        "--active",
        metavar="CHECKS",
        help="Instead of doctor's checks, active ones per instance: "
        "drift,leak,bench (drift: instances with a baseline named "
        "after them).",
    ),
    fmt: str = typer.Option("markdown", "--format", help="What to print: markdown, json or none."),
    as_json: bool = JsonOpt,
    failover: bool = typer.Option(
        False,
        "--failover",
        help="Then run `clusterctl failover` (defaults: "
        "--max-share 0.25); its summary on stderr, the worse exit code wins.",
    ),
    interval: float = typer.Option(2.0, "--interval", min=0, help="Seconds between counter samples."),
    timeout: float = ProbeTimeoutOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    deadline: Optional[float] = DeadlineOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
) -> None:
    from clusterctl.ops import report as ops_report

    fmt = "json" if as_json else fmt
    if fmt not in ("markdown", "json", "none"):
        fail(f"--format must be markdown, json or none (got {fmt!r})")
    if failover and (source or active):
        fail("--failover acts on live hosts: not with --from or --active")
    try:
        renotify_s = ops_report.renotify_seconds(renotify)
    except ClusterctlError as e:
        fail(str(e))
    started = time.time()
    if active:
        checked = _active(pattern, inventory, active, timeout)
    else:
        checked = _passive(
            pattern,
            inventory,
            source,
            interval=interval,
            timeout=timeout,
            fanout=fanout,
            connect_timeout=connect_timeout,
            deadline=deadline,
            host_key_policy=host_key_policy,
        )
    outputs = ops_report.Outputs(
        db=db,
        out=out,
        textfile=textfile,
        notify_cmd=notify_cmd,
        renotify_s=renotify_s,
        retention_days=retention,
        lock_wait_s=lock_wait,
    )
    meta = {**checked.meta, **cluster_meta()}
    try:
        result = ops_report.store_run(checked, outputs, user_config(), started=started, meta=meta)
    except ClusterctlError as e:
        fail(str(e))
    for w in result.warnings:
        err_console.print(f"warning: {w}", markup=False)
    text = ops_report.rendered(result, meta, fmt)
    if text is not None:
        sys.stdout.write(text)
    if failover:
        raise typer.Exit(max(result.exit_code, _failover(inventory, fanout, connect_timeout, host_key_policy)))
    raise typer.Exit(result.exit_code)


def _passive(pattern: str, inventory: Optional[str], source: Optional[str], **probe: Any) -> Any:
    """Doctor's passive checks on the hosts or a bundle (``ops.report.Checked``)."""
    from clusterctl.cli import doctor as d
    from clusterctl.ops import doctor as ops_doctor
    from clusterctl.ops.report import passive_run

    try:
        resolved = ops_doctor.resolve()
    except ClusterctlError as e:
        fail(str(e))
    if source:
        req = d.bundle_request(source, inventory, pattern=pattern, resolved=resolved)
    else:
        req = d.live_request(pattern, inventory, sudo=False, ask_become_pass=False, resolved=resolved, **probe)
    try:
        # the acknowledgements after the snapshot: the state of the cluster a bundle's -i names
        return passive_run(req, d.ProbeView(progress=False), acks=lambda: ops_doctor.load_acks(user_config().state_dir))
    except ClusterctlError as e:
        fail(str(e))


def _active(pattern: str, inventory: Optional[str], kinds_text: str, timeout: float) -> Any:
    """The active checks on the instances of the selected hosts (``ops.report.Checked``)."""
    from clusterctl.cli._hosts import select
    from clusterctl.ops import report as ops_report

    try:
        kinds = ops_report.kinds(kinds_text)
    except ClusterctlError as e:
        fail(str(e))
    path, hosts = select(inventory, pattern)
    inv = load_inventory(path)
    try:
        return ops_report.active_checks(
            inv,
            user_config(),
            path,
            {h.name for h in hosts},
            pattern,
            kinds,
            timeout=timeout,
            on_event=lambda s: err_console.print(s, markup=False),
        )
    except ClusterctlError as e:
        fail(str(e))


def _failover(
    inventory: Optional[str], fanout: Optional[int], connect_timeout: Optional[float], host_key_policy: Optional[str]
) -> int:
    """``--failover``: failover with its defaults, its summary on stderr; its exit code."""
    from clusterctl.cli.failover import failover_request, show
    from clusterctl.ops.failover import for_report

    req = failover_request(
        inventory,
        None,
        fanout=fanout,
        connect_timeout=connect_timeout,
        ask_become_pass=False,
        host_key_policy=host_key_policy,
    )
    try:
        rep = for_report(req, on_event=lambda s: err_console.print(s, markup=False, highlight=False))
    except ClusterctlError as e:
        fail(str(e))
    show(rep, err_console)
    return int(rep.exit_code)


@app.command(
    "history",
    help="""List the latest runs: when, exit code, counts per severity.

Example:

  clusterctl report history --limit 10
""",
)
def history(
    db: Optional[str] = DbOpt,
    limit: int = typer.Option(20, "--limit", "-n", min=1, help="How many runs."),
    as_json: bool = JsonOpt,
) -> None:
    from rich.table import Table

    from clusterctl.ops.report import history_runs

    try:
        runs = history_runs(db_path(db), limit)
    except ClusterctlError as e:
        fail(str(e))
    if as_json:
        print_json([r.to_json() for r in runs])
        return
    table = Table(
        "run", "started (UTC)", "pattern", "exit", "hosts", "CRIT", "WARN", "UNKNOWN", box=None, header_style="bold"
    )
    for r in runs:
        table.add_row(
            str(r.id),
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.started)),
            r.pattern,
            str(r.exit_code),
            str(r.hosts),
            str(r.counts["CRIT"]),
            str(r.counts["WARN"]),
            str(r.counts["UNKNOWN"]),
        )
    console.print(table)


@app.command(
    "trends",
    help="""Problems per run over the last DAYS, and every recorded metric's latest,
minimum and maximum per host.

Example:

  clusterctl report trends --days 7
""",
)
def trends(
    db: Optional[str] = DbOpt,
    days: float = typer.Option(7.0, "--days", min=0.01, help="How far back."),
    as_json: bool = JsonOpt,
) -> None:
    from clusterctl.ops.report import trends as read_trends

    try:
        got = read_trends(db_path(db), days)
    except ClusterctlError as e:
        fail(str(e))
    sev, rows = got.runs, got.metrics
    if as_json:
        print_json({"runs": [{"started": t, "counts": c} for t, c in sev], "metrics": rows})
        return
    for name in ("CRIT", "WARN", "UNKNOWN"):
        values = [c[name] for _, c in sev]
        console.print(
            f"{name:8} {_spark(values)}  latest {values[-1] if values else '-'}, "
            f"max {max(values) if values else '-'} over {len(values)} run(s)",
            markup=False,
        )
    for r in rows:
        console.print(
            f"{r['metric']} {r['host']} {r['subject']}: latest {r['latest']:g} "
            f"(min {r['min']:g}, max {r['max']:g}, {r['samples']} samples)",
            markup=False,
        )


def _spark(values: list[int]) -> str:
    bars = " ▁▂▃▄▅▆▇█"
    top = max(values, default=0) or 1
    return "".join(bars[round(v / top * 8)] for v in values[-60:])


@app.command(
    "install-timer",
    help="""Install a systemd timer (or, with --cron, a cron entry) that runs
`clusterctl report run` every --every minutes on this control host.

--active drift,leak installs a second timer, clusterctl-report-active, for the
active checks on their own schedule (--on-calendar, daily by default).
--dry-run prints the files instead of writing them. After installing a timer:
systemctl daemon-reload && systemctl enable --now clusterctl-report.timer

Examples:

  clusterctl report install-timer --every 5 --out /var/www/report --dry-run

  clusterctl report install-timer --cron --every 10 --textfile /var/lib/node_exporter/textfile/clusterctl.prom

  clusterctl report install-timer --active drift,leak --on-calendar daily --out /var/www/report/active
""",
)
def install_timer(
    pattern: str = typer.Argument("all", help="Hosts the report covers.", autocompletion=_complete.hosts),
    inventory: Optional[str] = InventoryOpt,
    db: str = typer.Option("/var/lib/clusterctl/report.db", "--db", help="History database."),
    out: Optional[str] = typer.Option(None, "--out", help="Report directory."),
    textfile: Optional[str] = typer.Option(None, "--textfile", help="node_exporter textfile."),
    notify_cmd: Optional[str] = typer.Option(None, "--notify-cmd", help="Notification command."),
    every: int = typer.Option(5, "--every", help="Minutes between runs."),
    active: Optional[str] = typer.Option(
        None, "--active", metavar="CHECKS", help="Active checks (drift,leak,bench) in their own timer."
    ),
    on_calendar: Optional[str] = typer.Option(
        None,
        "--on-calendar",
        help="systemd calendar time instead of --every (daily, hourly, 'Mon..Fri 06:00'); default daily with --active.",
    ),
    cron: bool = typer.Option(False, "--cron", help="Write /etc/cron.d/clusterctl-report instead."),
    user: Optional[str] = typer.Option(None, "--user", help="Run as this user."),
    unit_dir: str = typer.Option("/etc/systemd/system", "--unit-dir", help="Where units go."),
    cron_dir: str = typer.Option("/etc/cron.d", "--cron-dir", help="Where the cron entry goes."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print, do not write."),
) -> None:
    from clusterctl.ops.report import TimerRequest, timer_files

    request = TimerRequest(
        pattern=pattern,
        inventory=inventory,
        db=db,
        out=out,
        textfile=textfile,
        notify_cmd=notify_cmd,
        every=every,
        active=active,
        on_calendar=on_calendar,
        cron=cron,
        user=user,
        unit_dir=unit_dir,
        cron_dir=cron_dir,
    )
    try:
        files = timer_files(request)
    except ClusterctlError as e:
        fail(str(e))
    write_files(files, dry_run=dry_run)


@app.command(
    "file-sd",
    help="""Write a Prometheus file_sd target list of every instance's /metrics endpoint.

One target group per instance (the API server on its first host), labelled
vllm_instance, model, host and tp_size. Written atomically; without --out it
is printed.

Example:

  clusterctl report file-sd -i site.yaml --out /etc/prometheus/file_sd/vllm.json
""",
)
def file_sd(
    inventory: Optional[str] = InventoryOpt,
    out: Optional[str] = typer.Option(None, "--out", help="File to write (JSON)."),
) -> None:
    from clusterctl.files import write_atomic
    from clusterctl.ops.report import file_sd as targets

    text = targets(load_inventory(inventory), user_config())
    if out is None:
        sys.stdout.write(text)
        return
    try:
        write_atomic(out, text)
    except OSError as e:
        fail(f"{out}: cannot write: {e.strerror}")
    console.print(f"wrote {out}", markup=False)


@app.command(
    "serve",
    help="""Serve the report over HTTP (foreground): the latest report and its
history as a small web page, and the textfile at /metrics for a Prometheus.

  /            the latest report.html of --out (/report.json, /report.md too)
  /history     the runs of --db, newest first, with the problems-per-run chart
  /runs/ID     the problems one run stored
  /metrics     the --textfile

Files are re-read on every request; 503 until the first run wrote them. Binds
127.0.0.1 unless --listen says otherwise.

Examples:

  clusterctl report serve --out /srv/report --db /var/lib/clusterctl/report.db --port 8470

  clusterctl report serve --textfile /var/lib/clusterctl/clusterctl.prom --listen 0.0.0.0 --port 9477
""",
)
def serve(
    textfile: Optional[str] = typer.Option(
        None, "--textfile", help="The .prom file `report run --textfile` writes (served at /metrics)."
    ),
    out: Optional[str] = typer.Option(None, "--out", help="The directory `report run --out` writes (served at /)."),
    db: Optional[str] = typer.Option(
        None,
        "--db",
        help="History database (served at /history) [default with --out: $XDG_STATE_HOME/clusterctl/report.db].",
    ),
    listen: str = typer.Option("127.0.0.1", "--listen", help="Address to bind."),
    port: int = typer.Option(9477, "--port", min=1, max=65535, help="TCP port."),
) -> None:
    from clusterctl.ops.report import server as make_server

    if not (textfile or out or db):
        fail("nothing to serve: give --out (the report), --db (its history) and/or --textfile (/metrics)")
    if out and not db:
        db = str(db_path(None))
    try:
        server = make_server(textfile, listen, port, out=out, db=db)
    except OSError as e:
        fail(f"{listen}:{port}: cannot listen: {e.strerror}")
    base = f"http://{listen}:{server.server_address[1]}"
    for what, path in ((out, "/"), (db, "/history"), (textfile, "/metrics")):
        if what:
            console.print(f"serving {what} at {base}{path}", markup=False)
    try:
        server.serve_forever()
    finally:
        server.server_close()
