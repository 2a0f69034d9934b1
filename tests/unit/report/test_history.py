"""The SQLite history: round trip, WAL, migrations, retention, bad files."""

from __future__ import annotations

import sqlite3
import time

import pytest

from clusterctl.report.history import MIGRATIONS, SCHEMA_VERSION, History, HistoryError, Metric

from report_findings import crit, ok, warn


def test_round_trip_of_findings_metrics_and_counts(tmp_path):
    with History(tmp_path / "h.db") as h:
        rid = h.record([crit(), warn(), ok()], started=1000.0, finished=1010.0, pattern="all",
                       metrics=[Metric("gpu01", "gpu_util_pct", 87.5, "gpu:0")])
        assert h.findings(rid) == [crit(), warn()]  # OK findings are counted, not stored
        run = h.last_run()
        assert run is not None and run.id == rid and run.exit_code == 2 and run.hosts == 3
        assert run.counts == {"OK": 1, "WARN": 1, "CRIT": 1, "UNKNOWN": 0}
        assert h.series("gpu_util_pct") == {("gpu01", "gpu:0"): [(1000.0, 87.5)]}
        assert h.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_last_run_is_per_pattern(tmp_path):
    with History(tmp_path / "h.db") as h:
        a = h.record([crit()], started=1.0, pattern="all")
        h.record([], started=2.0, pattern="@rack1")
        assert h.last_run(pattern="all").id == a


def test_a_version_1_database_is_migrated_in_place(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0] + "; PRAGMA user_version=1;")
    db.execute("INSERT INTO runs(started, finished, exit_code) VALUES (5, 6, 0)")
    db.commit()
    db.close()
    with History(path) as h:
        assert h.version == SCHEMA_VERSION
        assert [r.id for r in h.runs()] == [1] and h.runs()[0].counts["OK"] == 0
        h.set_notified({("gpu.xid", "gpu01", "gpu:3"): ("CRIT", 7.0)})  # the table version 2 added
        assert h.notified() == {("gpu.xid", "gpu01", "gpu:3"): ("CRIT", 7.0)}


def test_a_newer_schema_is_refused_not_damaged(tmp_path):
    path = tmp_path / "new.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(HistoryError, match=rf"{path}: schema version {SCHEMA_VERSION + 1} is newer"):
        History(path)


def test_a_file_that_is_not_a_database_is_an_error_naming_it(tmp_path):
    path = tmp_path / "junk.db"
    path.write_text("this is not sqlite\n" * 100)
    with pytest.raises(HistoryError, match=str(path)):
        History(path)


def test_prune_keeps_35_days_by_default_and_drops_findings_with_their_run(tmp_path):
    now = time.time()
    with History(tmp_path / "h.db") as h:
        old = h.record([crit()], started=now - 36 * 86400, metrics=[Metric("gpu01", "x", 1)])
        kept = h.record([crit()], started=now - 34 * 86400)
        assert h.prune(now=now) == 1
        assert [r.id for r in h.runs()] == [kept]
        assert h.findings(old) == []
        assert h.db.execute("SELECT count(*) FROM metrics").fetchone()[0] == 0
        with pytest.raises(HistoryError, match="more than 0 days"):
            h.prune(0)


def test_a_failure_mid_record_leaves_no_partial_run(tmp_path, monkeypatch):
    with History(tmp_path / "h.db") as h:
        h.record([warn()], started=1.0)
        bad = Metric("gpu01", "x", float("nan"))
        with pytest.raises(Exception):
            h.record([crit()], started=2.0, metrics=[bad, Metric("gpu01", "y", "not a number")])  # type: ignore[arg-type]
        assert [r.started for r in h.runs()] == [1.0]
        assert h.db.execute("SELECT count(*) FROM findings").fetchone()[0] == 1
