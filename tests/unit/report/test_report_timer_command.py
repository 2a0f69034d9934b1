"""The command install-timer puts in ExecStart runs as written: an unreachable host is a row, a run is stored."""

from __future__ import annotations

import json
import shlex
import socket
import sqlite3
import subprocess
from pathlib import Path

from clusterctl.cli.main import main

INVENTORY = """version: 1
defaults:
  ssh: {user: root, port: 1, connect_timeout: 2}
  gpus: {count: 1, model: L40S-48GB, memory_gib: 48, interconnect: pcie}
hosts:
  ctl-test1:
    address: 127.0.0.1
"""


def exec_start(unit: str) -> list[str]:
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))[len("ExecStart=") :]
    return shlex.split(line.replace("%%", "%").replace("$$", "$"))


def test_the_timer_command_stores_a_run_with_the_unreachable_host_unknown(tmp_path: Path):
    inv = tmp_path / "site.yaml"
    inv.write_text(INVENTORY)
    db, out = tmp_path / "state dir" / "report.db", tmp_path / "out"
    assert (
        main(
            ["report", "install-timer", "-i", str(inv), "--db", str(db), "--out", str(out), "--unit-dir", str(tmp_path)]
        )
        == 0
    )
    argv = exec_start((tmp_path / "clusterctl-report.service").read_text())
    p = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    )
    assert p.returncode == 3, p.stderr  # nothing could be checked: UNKNOWN
    assert "Traceback" not in p.stderr
    doc = json.loads((out / "report.json").read_text())
    assert any(f["host"] == "ctl-test1" and f["severity"] == "UNKNOWN" for f in doc["findings"])
    assert sqlite3.connect(db).execute("SELECT count(*) FROM runs").fetchone()[0] == 1


def test_the_active_timer_command_stores_an_active_run_with_the_silent_instance_unknown(tmp_path: Path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inv = tmp_path / "site.yaml"
    inv.write_text(
        INVENTORY
        + f"""engines:
  vllm-0.11: {{path: /opt/vllm-0.11/bin/vllm, version: 0.11.0}}
models:
  m: {{path: /models/m}}
instances:
  inst-a: {{model: m, engine: vllm-0.11, placement: "ctl-test1:[0]", port: {port}}}
"""
    )
    db, out = tmp_path / "report.db", tmp_path / "active"
    assert (
        main(
            [
                "report",
                "install-timer",
                "-i",
                str(inv),
                "--db",
                str(db),
                "--out",
                str(out),
                "--active",
                "leak",
                "--unit-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    argv = exec_start((tmp_path / "clusterctl-report-active.service").read_text())
    p = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    )
    assert p.returncode == 3 and "Traceback" not in p.stderr, p.stderr
    doc = json.loads((out / "report.json").read_text())
    assert [(f["check"], f["subject"], f["severity"]) for f in doc["findings"]] == [
        ("drift.leak", "instance:inst-a", "UNKNOWN")
    ]
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT pattern FROM runs").fetchall() == [("all --active leak",)]


def test_active_without_any_instance_is_a_usage_error_naming_the_inventory(tmp_path: Path, capsys):
    inv = tmp_path / "site.yaml"
    inv.write_text(INVENTORY)
    assert main(["report", "run", "all", "-i", str(inv), "--db", str(tmp_path / "r.db"), "--active", "drift"]) == 3
    assert f"{inv}: no instance with a placement" in capsys.readouterr().err
    assert not (tmp_path / "r.db").exists()
