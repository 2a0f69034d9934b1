"""A damaged history database: a clear error (exit 3) from every path, and nothing deleted (issue 21)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from clusterctl.cli.main import main
from clusterctl.report.history import History, HistoryError, Metric
from clusterctl.report.run import Options, report_run

from report_findings import crit, warn
from test_report_cli import bundle

COMMANDS = (["history"], ["trends", "--days", "3650"], ["run", "--from", "BUNDLE", "--out", "OUT"])


def _db(tmp_path: Path, runs: int = 40) -> Path:
    db = tmp_path / "r.db"
    with History(db) as h:
        for i in range(runs):
            h.record(
                [crit(), warn(host=f"gpu{i:02d}")],
                started=time.time() - 3600 + i,
                pattern="all",
                metrics=[Metric("gpu01", "gpu_util_pct", float(i), f"gpu:{g}") for g in range(8)],
            )
    return db


def _run(tmp_path: Path, db: Path, args: list[str]) -> int:
    args = [
        str(bundle(tmp_path / str(len(list(tmp_path.iterdir()))), xid=True))
        if a == "BUNDLE"
        else str(tmp_path / "out")
        if a == "OUT"
        else a
        for a in args
    ]
    return main(["report", *args, "--db", str(db)])


def _damage_pages(db: Path) -> None:
    """Overwrite pages in the middle of the file, keeping its header: the database still opens."""
    with sqlite3.connect(db) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for n in range(2, len(data) // page):
        data[n * page : n * page + 64] = b"\xff" * 64
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
@pytest.mark.parametrize("damage", ["pages", "dropped-table", "junk-rows", "junk-severity"])
def test_every_command_reports_damage_as_unknown_without_deleting(tmp_path: Path, capsys, args, damage) -> None:
    db = _db(tmp_path)
    if damage == "pages":
        _damage_pages(db)
    else:
        with sqlite3.connect(db) as c:
            if damage == "dropped-table":
                c.execute("DROP TABLE findings")
            elif damage == "junk-rows":
                c.execute(
                    "INSERT INTO runs(started, finished, pattern, exit_code, meta) "
                    "VALUES ('soon', x'00ff', 'all', 'two', 'not json')"
                )
                c.execute("UPDATE samples SET value = 'abc'")
            else:
                c.execute("UPDATE findings SET severity = 'BOGUS', evidence = '{'")
    before = db.read_bytes()
    rc = _run(tmp_path, db, args)
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "Traceback" not in err and f"{db}:" in err and err.count("\n") == 1, err
    if args[0] != "run":
        assert db.read_bytes() == before  # read-only commands never write
    assert db.exists()
    if damage != "pages":
        with sqlite3.connect(db) as c:
            assert c.execute("SELECT count(*) FROM runs").fetchone()[0] >= 40  # no run was deleted


def test_report_run_on_a_database_damaged_after_open_fails_cleanly(tmp_path: Path) -> None:
    db = _db(tmp_path, 5)
    with History(db) as h:
        _damage_pages(db)
        with pytest.raises(HistoryError, match="damaged"):
            h.runs()
    with pytest.raises(HistoryError):
        report_run([crit()], Options(db=db, retention_days=0.0001), started=time.time())
