"""Serve the report over HTTP: ``/metrics`` for a Prometheus, the latest report and its history.

* ``/metrics``: the textfile (``textfile``), for a Prometheus to scrape;
* ``/``: the latest ``report.html`` of ``out_dir`` (also ``/report.json``, ``/report.md``);
* ``/history``: the runs of the history database ``db`` (newest first: time, checks,
  exit status, problem counts, with the problems-per-run chart), each linking to
  ``/runs/ID``: the problems that run stored.

Files are read on every request (the timer's runs replace them atomically), so
what is served is always one whole run.  A file not written yet is a 503, a path
not listed (or a source not configured) a 404.  Pages are self-contained (no
script, nothing fetched) and every stored value is HTML-escaped.  Binds loopback
unless told otherwise.
"""

from __future__ import annotations

import html
import http.server
import time
from pathlib import Path
from typing import Any, Callable

from clusterctl.errors import ClusterctlError
from clusterctl.report.history import HistoryError
from clusterctl.report.history import History
from clusterctl.report.html import SEVERITY_COLOURS
from clusterctl.report.svg import line_chart

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


HTML = "text/html; charset=utf-8"
#: Runs listed on /history.
HISTORY_RUNS = 200


def make_server(
    textfile: str | Path | None,
    host: str = "127.0.0.1",
    port: int = 9477,
    *,
    out_dir: str | Path | None = None,
    db: str | Path | None = None,
) -> http.server.ThreadingHTTPServer:
    """A server (not yet serving: call ``serve_forever``); port 0 picks a free one."""
    metrics = Path(textfile) if textfile else None
    out = Path(out_dir) if out_dir else None
    files = {
        "/": ("report.html", HTML),
        "/report.html": ("report.html", HTML),
        "/report.json": ("report.json", "application/json"),
        "/report.md": ("report.md", "text/markdown; charset=utf-8"),
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            route = self.path.split("?")[0]
            if route == "/metrics" and metrics is not None:
                self._file(metrics, CONTENT_TYPE)
            elif route in files and out is not None:
                self._file(out / files[route][0], files[route][1])
            elif route == "/history" and db is not None:
                self._page(lambda: history_page(Path(db)))
            elif route.startswith("/runs/") and route[6:].isdigit() and db is not None:
                self._page(lambda: run_page(Path(db), int(route[6:])))
            else:
                served = (
                    ([] if metrics is None else ["/metrics"])
                    + ([] if out is None else ["/", "/report.json"])
                    + ([] if db is None else ["/history", "/runs/ID"])
                )
                self._send(404, f"not here; served: {', '.join(served)}\n".encode(), "text/plain")

        def _file(self, path: Path, ctype: str) -> None:
            try:
                body = path.read_bytes()
            except OSError as e:
                self._send(503, f"{path}: {e.strerror} (no report run yet?)\n".encode(), "text/plain")
                return
            self._send(200, body, ctype)

        def _page(self, build: Callable[[], str]) -> None:
            try:
                body = build()
            except LookupError as e:
                self._send(404, f"{e.args[0]}\n".encode(), "text/plain")
                return
            except ClusterctlError as e:
                self._send(503, f"{e}\n".encode(), "text/plain")
                return
            self._send(200, body.encode(), HTML)

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass  # a scrape every 15 s is not news

    return http.server.ThreadingHTTPServer((host, port), Handler)


_STYLE = (
    "body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
    "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}th{background:#f3f3f3}"
    ".CRIT{background:#f8d0d0}.WARN{background:#fbeec0}.UNKNOWN{background:#e6dcf3}.OK{background:#d9f0d9}"
)
_EXIT = {0: "OK", 1: "WARN", 2: "CRIT", 3: "UNKNOWN"}


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _open(db: Path) -> History:
    if not db.is_file():
        raise HistoryError(f"{db}: no history yet (no report run has written it)")
    return History(db)


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{body}</body></html>\n"
    )


def history_page(db: Path) -> str:
    """The runs of the history, newest first, with the problems-per-run chart."""
    with _open(db) as hist:
        runs = hist.runs(limit=HISTORY_RUNS)
        sev = hist.severity_series(since=runs[-1].started if runs else 0.0)
    chart = line_chart(
        "Problems per run",
        {name: [(t, float(c.get(name, 0))) for t, c in sev] for name in ("CRIT", "WARN", "UNKNOWN")},
        colours=SEVERITY_COLOURS,
    )
    rows = "".join(
        f'<tr><td><a href="/runs/{r.id}">{r.id}</a></td><td>{_utc(r.started)}</td><td>{html.escape(r.pattern)}</td>'
        f'<td class="{_EXIT.get(r.exit_code, "UNKNOWN")}">{r.exit_code}</td><td>{r.hosts}</td>'
        f'<td>{r.counts.get("CRIT", 0)}</td><td>{r.counts.get("WARN", 0)}</td><td>{r.counts.get("UNKNOWN", 0)}</td></tr>'
        for r in runs
    )
    body = (
        f'<h1>clusterctl report history</h1><p><a href="/">latest report</a> &middot; {len(runs)} runs '
        f"(newest first, at most {HISTORY_RUNS})</p>{chart}<table><tr><th>run</th><th>started (UTC)</th>"
        "<th>checks</th><th>exit</th><th>hosts</th><th>CRIT</th><th>WARN</th><th>UNKNOWN</th></tr>"
        f"{rows}</table>"
    )
    return _page("clusterctl report history", body)


def run_page(db: Path, run_id: int) -> str:
    """The problems one run stored."""
    with _open(db) as hist:
        run = next((r for r in hist.runs(limit=1, before=run_id + 1) if r.id == run_id), None)
        if run is None:
            raise LookupError(f"no run {run_id} in {db}")
        findings = hist.findings(run_id)
    rows = "".join(
        f'<tr><td class="{f.severity.name}">{f.severity.name}</td><td>{html.escape(f.host or "-")}</td>'
        f"<td>{html.escape(f.check)}</td><td>{html.escape(f.subject)}</td><td>{html.escape(f.message)}</td>"
        f"<td>{html.escape(f.action or '-')}</td></tr>"
        for f in findings
    )
    table = (
        (
            "<table><tr><th>severity</th><th>host</th><th>check</th><th>subject</th><th>finding</th><th>action</th>"
            f"</tr>{rows}</table>"
        )
        if findings
        else "<p>no problems</p>"
    )
    body = (
        f'<h1>Run {run.id}: <span class="{_EXIT.get(run.exit_code, "UNKNOWN")}">'
        f'{_EXIT.get(run.exit_code, run.exit_code)}</span></h1><p><a href="/history">history</a> &middot; '
        f"started {_utc(run.started)} UTC, checks {html.escape(run.pattern)}, {run.hosts} hosts, "
        f"{len(findings)} problems</p>{table}"
    )
    return _page(f"clusterctl run {run.id}", body)
