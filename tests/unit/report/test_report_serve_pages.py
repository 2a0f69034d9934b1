"""``report serve`` as a small web site: the latest report at /, the history at /history,
one run at /runs/ID; checked over HTTP and in Debian's Chromium (headless, real rendering)."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request

import pytest

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.report.run import Options, report_run
from clusterctl.report.serve import make_server
from report_findings import crit, warn


@pytest.fixture
def site(tmp_path):
    db, out = tmp_path / "report.db", tmp_path / "out"
    server = make_server(None, "127.0.0.1", 0, out_dir=out, db=db)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield db, out, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def test_pages_before_and_after_runs_and_nothing_outside_them(site):
    db, out, base = site
    assert get(base + "/")[0] == 503 and get(base + "/history")[0] == 503
    assert not db.exists()  # serving does not create the history
    hostile = Finding("gpu.xid", Severity.CRIT, "<script>alert(1)</script>", "gpu:0", "XID <b>79</b>", "")
    for i, findings in enumerate([[crit()], [crit(), warn(), hostile]]):
        report_run(findings, Options(db=db, out_dir=out), started=1000 + 300 * i, now=1005 + 300 * i)
    code, ctype, page = get(base + "/")
    assert code == 200 and ctype.startswith("text/html") and "clusterctl report" in page
    assert get(base + "/report.json")[1] == "application/json"
    code, _, hist = get(base + "/history")
    assert code == 200 and hist.index('href="/runs/2"') < hist.index('href="/runs/1"')
    code, _, run = get(base + "/runs/2")
    assert code == 200 and "XID &lt;b&gt;79&lt;/b&gt;" in run and "<script>" not in run
    assert get(base + "/runs/99")[0] == 404
    for path in ("/metrics", "/../report.db", "/out/report.html", "/runs/1x"):
        assert get(base + path)[0] == 404, path


def test_the_served_site_in_a_real_browser(site, tmp_path):
    db, out, base = site
    for i, findings in enumerate([[crit()], [warn()]]):
        report_run(findings, Options(db=db, out_dir=out), started=1000 + 300 * i, now=1005 + 300 * i)
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is not installed: run scripts/install-deps"

    def dom(path: str) -> str:
        p = subprocess.run(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={tmp_path / ('profile' + path.replace('/', '_'))}",
                "--dump-dom",
                base + path,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        return p.stdout

    latest = dom("/")
    assert "<h2>Overview</h2>" in latest and "Resolved (1)" in latest
    history = dom("/history")
    assert re.findall(r'<a href="/runs/(\d+)">', history) == ["2", "1"]
    assert 'aria-label="Problems per run"' in history and "<polyline" in history
    run1 = dom("/runs/1")
    assert "<h1>Run 1: " in run1 and "XID 79: GPU fell off the bus" in run1
