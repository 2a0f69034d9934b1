"""/metrics over HTTP from the textfile: whole files, 503 before the first run, 404 elsewhere."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest

from clusterctl.files import write_atomic
from clusterctl.report.diff import diff
from clusterctl.report.serve import make_server
from clusterctl.report.textfile import render
from unit.vllm_sim.promparse import parse

from report_findings import crit


@pytest.fixture
def served(tmp_path):
    path = tmp_path / "clusterctl.prom"
    server = make_server(path, "127.0.0.1", 0)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_serves_the_current_file_and_503_before_it_exists(served):
    path, base = served
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(base + "/metrics", timeout=5)
    assert e.value.code == 503
    write_atomic(path, render([crit()], diff(None, [crit()]), finished=1.0, duration_s=2.0))
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        m = parse(r.read().decode())
    assert m["clusterctl_report_problems"][(("state", "new"),)] == 1
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(base + "/", timeout=5)
    assert e.value.code == 404
