"""The HTML report as a browser sees it: Debian's Chromium (installed by scripts/install-deps)
loads it headless from disk and dumps the DOM it built; the tables and SVG charts are there,
and the page asked for nothing outside itself."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.report.history import Metric
from clusterctl.report.run import Options, report_run
from report_findings import crit, ok, warn


class _Dom(HTMLParser):
    """Counts of elements in the dumped DOM, the h2 headings, and every URL-valued attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: dict[str, int] = {}
        self.h2: list[str] = []
        self.urls: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self._in_h2 = tag == "h2"
        self.urls += [v for k, v in attrs if k in ("src", "href", "action", "data", "poster") and v]

    def handle_data(self, data: str) -> None:
        if self._in_h2:
            self.h2.append(data.strip())
            self._in_h2 = False


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is not installed: run scripts/install-deps (it installs Debian's chromium)"
    return exe


def test_chromium_renders_the_report_tables_and_svg_charts_from_disk(tmp_path):
    db, out = tmp_path / "report.db", tmp_path / "out"
    tp = Finding("tp.group", Severity.CRIT, None, "tp-group:qwen-a", "UNAVAILABLE: member gpu01:3 is critical", "")
    runs = [[ok()], [crit(), tp, warn()], [warn()]]
    for i, findings in enumerate(runs):
        metrics = [
            Metric("gpu01", "gpu_utilization_ratio", 0.2 * i, "gpu:0"),
            Metric("gpu01", "vllm_kv_cache_usage_ratio", 0.1 * i, "instance:qwen-a"),
            Metric("gpu02", "roce_paused_ratio", 0.3 * i, "nic:eth2"),
        ]
        report_run(
            findings, Options(db=db, out_dir=out), started=1_000 + 300 * i, now=1_000 + 300 * i + 5, metrics=metrics
        )
    page = out / "report.html"
    proc = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = _Dom()
    dom.feed(proc.stdout)
    # top hosts, top problems, hosts, resolved (the CRITs of run 2), ongoing (the WARN), all problems, recent runs
    assert dom.tags.get("table", 0) == 7, dom.tags
    assert dom.h2[:7] == [
        "Overview",
        "Hosts",
        "New (0)",
        "Resolved (2)",
        "Ongoing (1)",
        "All problems, grouped",
        "Trends",
    ]
    # overview: hosts x GPUs and hosts x NICs, by worst finding and by load; then problems per run + one
    # chart per metric, each with a line per series
    assert dom.tags.get("svg") == 8 and dom.tags.get("polyline", 0) >= 6
    titles = re.findall(r'aria-label="([^"]+)"', proc.stdout)
    assert titles == [
        "Hosts x GPUs: worst finding (1 GPUs)",
        "Hosts x GPUs: GPU utilisation",
        "Hosts x data NICs: worst finding (1 data NICs)",
        "Hosts x data NICs: fraction of time paused (PFC)",
        "Problems per run",
        "GPU utilisation",
        "KV-cache usage per instance",
        "RoCE: fraction of time paused (PFC) per NIC",
    ]
    assert "<title>gpu02: nic:eth2 WARN (roce.pfc: paused 3% of the time)</title>" in proc.stdout
    assert "<title>gpu01: gpu:0 40%</title>" in proc.stdout  # the last run's utilisation of GPU 0, 0.2 x 2
    # self-contained: no element refers to anything (the SVG namespace is an identifier, not a request)
    assert dom.urls == [] and dom.tags.get("script", 0) == 0 and dom.tags.get("link", 0) == 0
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page.read_text())
