"""The SQLite history: round trip, WAL, migrations, retention, bad files."""

from __future__ import annotations

import sqlite3
import time

import pytest

from clusterctl.report.history import MIGRATIONS, SCHEMA_VERSION, History, HistoryError, Metric

from report_findings import crit, ok, warn


def test_round_trip_of_findings_metrics_and_counts(tmp_path):
    with History(tmp_path / "h.db") as h:
        rid = h.record(
            [crit(), warn(), ok()],
            started=1000.0,
            finished=1010.0,
            pattern="all",
            metrics=[Metric("gpu01", "gpu_util_pct", 87.5, "gpu:0")],
        )
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
        assert h.db.execute("SELECT count(*) FROM samples").fetchone()[0] == 0
        assert h.db.execute("SELECT count(*) FROM series").fetchone()[0] == 0
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


def test_a_version_3_database_keeps_its_metrics_as_series_and_samples(tmp_path):
    path = tmp_path / "v3.db"
    db = sqlite3.connect(path)
    db.executescript(";".join(MIGRATIONS[:3]) + "; PRAGMA user_version=3;")
    db.execute("INSERT INTO runs(started, finished, exit_code) VALUES (5, 6, 0)")
    db.execute("INSERT INTO runs(started, finished, exit_code) VALUES (7, 8, 0)")
    db.executemany(
        "INSERT INTO metrics VALUES (?,?,?,?,?)",
        [(1, "gpu01", "gpu:0", "util", 0.5), (2, "gpu01", "gpu:0", "util", 0.7), (2, "gpu02", "host", "load", 3.0)],
    )
    db.commit()
    db.close()
    with History(path) as h:
        assert h.version == SCHEMA_VERSION == 4
        assert h.series("util") == {("gpu01", "gpu:0"): [(5.0, 0.5), (7.0, 0.7)]}
        assert h.metric_names() == ["load", "util"] and h.series_hosts("util") == {"gpu01": 1}
        assert not h.db.execute("SELECT name FROM sqlite_master WHERE name='metrics'").fetchall()


def test_series_are_averaged_in_sqlite_into_time_slices_and_per_host(tmp_path):
    with History(tmp_path / "h.db") as h:
        for i in range(100):  # 100 runs a minute apart, 2 GPUs each on two hosts
            h.record(
                [],
                started=60.0 * i,
                metrics=[Metric(host, "util", float(i % 2) + g, f"gpu:{g}") for host in ("a", "b") for g in range(2)],
            )
        s = h.series_buckets("util", since=0.0, buckets=10)
        assert set(s) == {(host, f"gpu:{g}") for host in ("a", "b") for g in range(2)}
        assert all(len(pts) == 10 for pts in s.values())
        assert s[("a", "gpu:1")][0] == (270.0, 1.5)  # runs 0..9: mean time 4.5 min, mean of 1,2,1,2...
        per_host = h.series_buckets("util", since=0.0, buckets=10, per_host=True)
        assert set(per_host) == {("a", "*"), ("b", "*")} and per_host[("b", "*")][0] == (270.0, 1.0)
        # slices span the runs, not the whole window asked for; few runs are not merged at all
        assert len(h.series_buckets("util", since=-35 * 86400.0, buckets=10)[("a", "gpu:0")]) == 10
        assert h.series_buckets("util", since=5400.0, buckets=10)[("a", "gpu:0")] == [
            (60.0 * i, float(i % 2)) for i in range(90, 100)
        ]
        assert h.series_hosts("util") == {"a": 2, "b": 2}
        assert h.metric_names(since=6000.0 * 2) == []  # no run that recent


def test_a_host_mean_is_stored_beside_several_subjects_and_read_only_by_per_host_charts(tmp_path):
    path = tmp_path / "v3.db"
    db = sqlite3.connect(path)
    db.executescript(";".join(MIGRATIONS[:3]) + "; PRAGMA user_version=3;")
    db.execute("INSERT INTO runs(started, finished, exit_code) VALUES (5, 6, 0)")
    db.executemany(
        "INSERT INTO metrics VALUES (?,?,?,?,?)",
        [(1, "a", "gpu:0", "util", 0.2), (1, "a", "gpu:1", "util", 0.4), (1, "b", "gpu:0", "util", 0.9)],
    )
    db.commit()
    db.close()
    with History(path) as h:  # the v3 rows get their host means in the migration
        h.record(
            [],
            started=7.0,
            metrics=[
                Metric("a", "util", 0.6, "gpu:0"),
                Metric("a", "util", 1.0, "gpu:1"),
                Metric("b", "util", 0.1, "gpu:0"),
            ],
        )
        assert set(h.series("util")) == {("a", "gpu:0"), ("a", "gpu:1"), ("b", "gpu:0")}
        assert h.series_hosts("util") == {"a": 2, "b": 1}
        per_host = h.series_buckets("util", since=0.0, buckets=10, per_host=True)
        assert per_host == {
            ("a", "*"): [(5.0, pytest.approx(0.3)), (7.0, pytest.approx(0.8))],
            ("b", "*"): [(5.0, 0.9), (7.0, 0.1)],
        }
        with pytest.raises(HistoryError, match="host mean"):
            h.record([], started=8.0, metrics=[Metric("a", "util", 1.0, "*")])
