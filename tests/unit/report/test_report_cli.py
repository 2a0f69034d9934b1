"""``clusterctl report`` through the CLI, on a bundle (no SSH): run, history, trends, bad input."""

from __future__ import annotations

import json
from pathlib import Path

from clusterctl.cli.main import main

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "diagnose"


def bundle(tmp: Path, *, xid: bool) -> Path:
    """A hand-made bundle of one host: a kernel log with XIDs, or a clean one."""
    d = tmp / ("xid" if xid else "clean") / "hosts" / "gpu01"
    d.mkdir(parents=True)
    (d / "kernel.log").write_text(
        (FIXTURES / "gpu" / "journal_short_iso_xid.log").read_text()
        if xid
        else "Nov 30 10:00:00 gpu01 kernel: Linux version 6.1.0\n"
    )
    return d.parents[1]


def test_run_from_bundle_new_then_resolved_and_history(tmp_path: Path, capsys):
    db, out = tmp_path / "r.db", tmp_path / "out"
    rc = main(
        [
            "report",
            "run",
            "--from",
            str(bundle(tmp_path, xid=True)),
            "--db",
            str(db),
            "--out",
            str(out),
            "--textfile",
            str(tmp_path / "c.prom"),
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == doc["run"]["exit_code"] == 2
    new_xid = [f for f in doc["changes"]["new"] if f["check"] == "gpu.xid"]
    assert new_xid and new_xid[0]["host"] == "gpu01"
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "report.html"}
    rc = main(["report", "run", "--from", str(bundle(tmp_path, xid=False)), "--db", str(db), "--format", "markdown"])
    md = capsys.readouterr().out
    assert rc != 2 and "## Resolved" in md and "gpu.xid" in md.split("## Resolved")[1].split("## Ongoing")[0]
    assert main(["report", "history", "--db", str(db), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in runs] == [2, 1] and runs[1]["exit_code"] == 2
    assert main(["report", "trends", "--db", str(db), "--days", "1"]) == 0
    assert "CRIT" in capsys.readouterr().out


def test_bad_input_exits_3_with_a_message_not_a_traceback(tmp_path: Path, capsys):
    assert main(["report", "history", "--db", str(tmp_path / "none.db")]) == 3
    assert "no report history yet" in capsys.readouterr().err
    junk = tmp_path / "junk.db"
    junk.write_text("not a database\n" * 200)
    assert main(["report", "run", "--from", str(bundle(tmp_path, xid=False)), "--db", str(junk)]) == 3
    err = capsys.readouterr().err
    assert str(junk) in err and "Traceback" not in err
    assert main(["report", "run", "--from", str(bundle(tmp_path / "b", xid=False)), "--renotify", "soon"]) == 3
    assert "--renotify: bad duration 'soon'" in capsys.readouterr().err


def test_every_report_command_has_an_example_in_its_help(capsys):
    for cmd in ("run", "history", "trends", "install-timer"):
        assert main(["report", cmd, "--help"]) == 0
        assert "Example" in capsys.readouterr().out, cmd
