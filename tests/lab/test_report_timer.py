"""A lab host acting as the control host: ``report install-timer`` there, the timer fires, a report
and a history database appear.

The lab hosts have Debian's python3 (3.11, as here) but none of clusterctl's Python
dependencies, and nothing outside the bridge is reachable from them.  So the test installs
clusterctl as pip would: this tree's ``clusterctl`` package and the installed files of every
distribution it requires (the closure of its requirements, from their metadata) are copied
to ``/opt/clusterctl-test/lib`` on the host, and a ``.pth`` file puts that directory on the
host python3's path.  Compiled extensions (cryptography, pydantic-core, ...) are manylinux
wheels for CPython 3.11 and load on the host's glibc.  Then the real ``install-timer``
writes the units, a drop-in makes the timer fire a few seconds after it starts, and the run
reaches every lab host over SSH with the lab's key, as a control host would.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

import clusterctl

PREFIX = "/opt/clusterctl-test"
PTH = "/usr/local/lib/python3.11/dist-packages/clusterctl-test.pth"
STATE = "/var/lib/clusterctl"


def _closure(root: str = "clusterctl") -> list[md.Distribution]:
    """The installed distributions ``root`` requires, transitively (markers evaluated, no extras)."""
    seen: dict[str, md.Distribution] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen[key] = dist = md.distribution(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [d for k, d in seen.items() if k != "clusterctl"]


def _copy_payload(lib: Path) -> None:
    src = Path(clusterctl.__file__).resolve().parent
    shutil.copytree(src, lib / "clusterctl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(src.parent / "checks", lib / "clusterctl" / "_checks")  # where a built package carries them
    for dist in _closure():
        for f in dist.files or []:
            if ".." in f.parts or "__pycache__" in f.parts:
                continue  # console scripts outside site-packages; caches
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                (lib / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, lib / f)


@pytest.fixture
def control(lab):
    """The last lab host with clusterctl installed for its python3; everything removed afterwards."""
    name = lab.names[-1]
    root = lab.host_dir(name) / "root"
    opt = root / PREFIX.lstrip("/")
    _copy_payload(opt / "lib")
    (opt / "ssh").mkdir()
    for f in ("id_ed25519", "known_hosts"):
        shutil.copy2(lab.lab_dir / "ssh" / f, opt / "ssh" / f)
    inv = yaml.safe_load(Path(lab.inventory).read_text())
    inv["defaults"]["ssh"].update(identity_file=f"{PREFIX}/ssh/id_ed25519", known_hosts=f"{PREFIX}/ssh/known_hosts")
    (opt / "site.yaml").write_text(yaml.safe_dump(inv, sort_keys=False))
    lab.run(name, f"mkdir -p {Path(PTH).parent} && echo {PREFIX}/lib > {PTH}", check=True)
    yield name, root
    lab.run(
        name,
        "systemctl disable --now clusterctl-report.timer; systemctl stop clusterctl-report.service; "
        "rm -rf /etc/systemd/system/clusterctl-report.* /etc/systemd/system/clusterctl-report.timer.d "
        f"{PREFIX} {PTH} {STATE}; systemctl daemon-reload",
        timeout=60,
    )


def test_the_timer_on_a_lab_control_host_writes_a_report_and_the_history(lab, control):
    name, root = control
    r = lab.run(
        name,
        f"python3 -m clusterctl.cli.main report install-timer all -i {PREFIX}/site.yaml "
        f"--db {STATE}/report.db --out {STATE}/report --textfile {STATE}/clusterctl.prom",
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "wrote /etc/systemd/system/clusterctl-report.timer" in r.stdout
    # fire a few seconds after start instead of 2 minutes after boot
    lab.run(
        name,
        "mkdir -p /etc/systemd/system/clusterctl-report.timer.d && printf '[Timer]\\nOnActiveSec=3s\\n"
        "AccuracySec=1s\\n' > /etc/systemd/system/clusterctl-report.timer.d/soon.conf && "
        "systemctl daemon-reload && systemctl start clusterctl-report.timer",
        check=True,
    )
    t0 = time.monotonic()
    report = root / STATE.lstrip("/") / "report" / "report.json"
    while not report.exists() and time.monotonic() - t0 < 120:
        time.sleep(1)
    took = time.monotonic() - t0
    state = lab.run(
        name,
        "systemctl show clusterctl-report.service -p ExecMainStatus -p Result; "
        "journalctl -u clusterctl-report.service --no-pager | tail -20",
    ).stdout
    assert report.exists(), state
    print(f"timer started -> report.json in {took:.1f} s")
    doc = json.loads(report.read_text())
    assert {h["host"] for h in doc["hosts"]} >= set(lab.names), doc["hosts"]
    assert not [h for h in doc["hosts"] if h["worst"] == "UNKNOWN"], doc["hosts"]  # every host reached over SSH
    html = (report.parent / "report.html").read_text()
    assert "<svg" in html and "Problems per run" in html
    assert "clusterctl_report_last_run_timestamp_seconds" in (root / STATE.lstrip("/") / "clusterctl.prom").read_text()
    # the unit finished (a WARN/CRIT cluster is a success exit too) and the run is stored
    # report.json is written before the run ends (history, textfile): wait for the unit to go inactive,
    # not for Result=success, which systemd already shows while the service is still running
    show = "systemctl show clusterctl-report.service -p ActiveState -p ExecMainStatus -p Result"
    state = lab.run(name, show).stdout
    while "ActiveState=inactive" not in state and time.monotonic() - t0 < 150:
        time.sleep(1)
        state = lab.run(name, show).stdout
    assert "Result=success" in state and f"ExecMainStatus={doc['run']['exit_code']}" in state, state
    db = root / STATE.lstrip("/") / "report.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        assert c.execute("SELECT count(*), min(pattern) FROM runs").fetchone() == (1, "all")
        assert c.execute("PRAGMA journal_mode").fetchone() == ("wal",)
