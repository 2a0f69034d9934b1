"""The report history: an SQLite database of runs, their findings and per-host metrics.

WAL mode, one transaction per run (a run killed mid-write leaves no trace),
``busy_timeout`` so a reader never fails while a run writes.  The schema
version is SQLite's ``user_version``; :data:`MIGRATIONS` takes a database
from version *n-1* to *n* and runs in order on open.

A damaged database (corrupt pages found after it opened, a dropped table, rows
of the wrong type) is a :class:`HistoryError` naming the file from every
method, never a traceback, and nothing is deleted or rewritten to "repair" it:
the user decides (move it aside, or ``sqlite3 FILE .recover``).

Times are Unix seconds (UTC).  The default path is
``$XDG_STATE_HOME/clusterctl/report.db``; a system service passes
``--db /var/lib/clusterctl/report.db``.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, TypeVar

from clusterctl.diagnose.findings import Finding, Severity, exit_code
from clusterctl.errors import ClusterctlError

#: Days of history kept by default (the issue asks for at least 35).
DEFAULT_RETENTION_DAYS = 35.0
#: The subject of a host's mean over its subjects (GPUs, NICs), stored beside them when it has several.
HOST_MEAN = "*"
#: Seconds a connection waits for another writer before failing.
BUSY_TIMEOUT_S = 30.0

MIGRATIONS: tuple[str, ...] = (
    # 1: runs, their findings, per-host metrics
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started REAL NOT NULL,
        finished REAL NOT NULL,
        pattern TEXT NOT NULL DEFAULT 'all',
        exit_code INTEGER NOT NULL,
        hosts INTEGER NOT NULL DEFAULT 0,
        meta TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX runs_started ON runs(started);
    CREATE TABLE findings (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        check_name TEXT NOT NULL,
        severity TEXT NOT NULL,
        host TEXT NOT NULL DEFAULT '',
        subject TEXT NOT NULL,
        message TEXT NOT NULL,
        action TEXT NOT NULL DEFAULT '',
        evidence TEXT NOT NULL DEFAULT '[]'
    );
    CREATE INDEX findings_run ON findings(run_id);
    CREATE TABLE metrics (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        host TEXT NOT NULL,
        subject TEXT NOT NULL DEFAULT 'host',
        name TEXT NOT NULL,
        value REAL NOT NULL
    );
    CREATE INDEX metrics_name ON metrics(name, host, run_id);
    """,
    # 2: notification state (what was last sent, per problem)
    """
    CREATE TABLE notified (
        check_name TEXT NOT NULL,
        host TEXT NOT NULL,
        subject TEXT NOT NULL,
        severity TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (check_name, host, subject)
    );
    """,
    # 3: OK findings are counted, not stored (a month of 5-minute runs of a 16-host cluster was 250 MB)
    """
    ALTER TABLE runs ADD COLUMN ok_findings INTEGER NOT NULL DEFAULT 0;
    """,
    # 4: metric samples keyed by a series id (name, host, subject stored once): a month of a
    # 16-host cluster's 352 numbers a run was 347 MB as text rows with their index
    """
    CREATE TABLE series (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        host TEXT NOT NULL,
        subject TEXT NOT NULL,
        last_run INTEGER NOT NULL DEFAULT 0,
        UNIQUE (name, host, subject)
    );
    CREATE TABLE samples (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        series_id INTEGER NOT NULL REFERENCES series(id),
        value REAL NOT NULL,
        PRIMARY KEY (run_id, series_id)
    ) WITHOUT ROWID;
    INSERT INTO series(name, host, subject, last_run)
        SELECT name, host, subject, max(run_id) FROM metrics GROUP BY name, host, subject;
    INSERT OR REPLACE INTO samples
        SELECT m.run_id, s.id, m.value FROM metrics m
        JOIN series s ON s.name = m.name AND s.host = m.host AND s.subject = m.subject;
    INSERT INTO series(name, host, subject, last_run)
        SELECT name, host, '*', max(run_id) FROM metrics GROUP BY name, host HAVING count(DISTINCT subject) > 1;
    INSERT OR REPLACE INTO samples
        SELECT m.run_id, s.id, avg(m.value) FROM metrics m
        JOIN series s ON s.name = m.name AND s.host = m.host AND s.subject = '*' GROUP BY m.run_id, s.id;
    DROP TABLE metrics;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


class HistoryError(ClusterctlError):
    """The database cannot be opened, is newer than this clusterctl, or is corrupt."""


_F = TypeVar("_F", bound=Callable[..., Any])
#: What a damaged database or a junk row raises on the way out of sqlite3 and the row conversions.
_DAMAGE = (sqlite3.Error, ValueError, TypeError, KeyError, IndexError, OverflowError)


def _guarded(method: _F) -> _F:
    """``method`` with a damaged database turned into one :class:`HistoryError` naming the file."""

    @functools.wraps(method)
    def wrapper(self: "History", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except HistoryError:
            raise
        except _DAMAGE as e:
            raise HistoryError(
                f"{self.path}: the report history is damaged ({type(e).__name__}: {e}); "
                "nothing was deleted: move the file aside (the next run starts a new one) "
                f"or try `sqlite3 {self.path} .recover`"
            ) from None

    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True)
class Run:
    id: int
    started: float
    finished: float
    pattern: str
    exit_code: int
    hosts: int
    meta: dict[str, Any]
    counts: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "started": self.started,
            "finished": self.finished,
            "pattern": self.pattern,
            "exit_code": self.exit_code,
            "hosts": self.hosts,
            "counts": self.counts,
            "meta": self.meta,
        }


@dataclass(frozen=True)
class Metric:
    """One number about one host (or one subject on it) in one run, e.g. ``gpu_util_pct``."""

    host: str
    name: str
    value: float
    subject: str = "host"


def _host_means(metrics: list[Metric]) -> list[Metric]:
    groups: dict[tuple[str, str], list[float]] = {}
    for m in metrics:
        groups.setdefault((m.host, m.name), []).append(float(m.value))
    return [Metric(h, n, sum(vs) / len(vs), HOST_MEAN) for (h, n), vs in groups.items() if len(vs) > 1]


class History:
    """An open history database; use as a context manager or call :meth:`close`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
        except _DAMAGE as e:  # sqlite3.Error; a damaged header's message can even be bytes that are not UTF-8
            raise HistoryError(f"{self.path}: cannot open the report history: {e}; nothing was changed") from None
        except OSError as e:
            raise HistoryError(f"{self.path}: cannot create the report history: {e.strerror}") from None

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    def _rollback(self) -> None:
        """Roll back the open transaction; a database too damaged to do even that keeps the first error."""
        try:
            self.db.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    @property
    def version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            have = self.version
            if have > SCHEMA_VERSION:
                raise HistoryError(
                    f"{self.path}: schema version {have} is newer than this clusterctl understands ({SCHEMA_VERSION})"
                )
            for n in range(have, SCHEMA_VERSION):
                for stmt in MIGRATIONS[n].split(";"):
                    if stmt.strip():
                        self.db.execute(stmt)
                self.db.execute(f"PRAGMA user_version={n + 1}")
            self.db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def record(
        self,
        findings: list[Finding],
        *,
        started: float,
        finished: float | None = None,
        pattern: str = "all",
        metrics: Iterable[Metric] = (),
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Store one run in a single transaction; returns its id.

        Findings that are not OK are stored; OK findings only counted (``Run.counts``).  For a
        host with several subjects of one metric their mean is stored too, as subject
        :data:`HOST_MEAN` (charts of big clusters read it instead of every GPU's line).
        """
        metrics = list(metrics)
        if any(m.subject == HOST_MEAN for m in metrics):
            raise HistoryError(f"a metric subject cannot be {HOST_MEAN!r} (the host mean)")
        hosts = len({f.host for f in findings if f.host} | {m.host for m in metrics})
        problems = [f for f in findings if f.severity != Severity.OK]
        self.db.execute("BEGIN IMMEDIATE")
        try:
            cur = self.db.execute(
                "INSERT INTO runs(started, finished, pattern, exit_code, hosts, meta, ok_findings) "
                "VALUES (?,?,?,?,?,?,?)",
                (
                    started,
                    finished if finished is not None else time.time(),
                    pattern,
                    exit_code(findings),
                    hosts,
                    json.dumps(meta or {}, default=str),
                    len(findings) - len(problems),
                ),
            )
            run_id = int(cur.lastrowid or 0)
            self.db.executemany(
                "INSERT INTO findings VALUES (?,?,?,?,?,?,?,?)",
                [
                    (
                        run_id,
                        f.check,
                        f.severity.name,
                        f.host or "",
                        f.subject,
                        f.message,
                        f.action,
                        json.dumps(list(f.evidence)),
                    )
                    for f in problems
                ],
            )
            metrics += _host_means(metrics)
            ids = self._series_ids(metrics, run_id)
            self.db.executemany(
                "INSERT OR REPLACE INTO samples VALUES (?,?,?)",
                [(run_id, ids[(m.name, m.host, m.subject)], float(m.value)) for m in metrics],
            )
            self.db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        return run_id

    def _series_ids(self, metrics: list[Metric], run_id: int) -> dict[tuple[str, str, str], int]:
        """Ids of the metrics' series (created when new), each marked as seen in ``run_id``."""
        keys = {(m.name, m.host, m.subject) for m in metrics}
        self.db.executemany("INSERT OR IGNORE INTO series(name, host, subject) VALUES (?,?,?)", sorted(keys))
        ids = {
            (n, h, s): i
            for i, n, h, s in self.db.execute("SELECT id, name, host, subject FROM series")
            if (n, h, s) in keys
        }
        self.db.executemany("UPDATE series SET last_run=? WHERE id=?", [(run_id, i) for i in ids.values()])
        return ids

    def _run(self, row: tuple[Any, ...]) -> Run:
        counts = {s.name: 0 for s in Severity}
        counts["OK"] = row[7]
        for sev, n in self.db.execute(
            "SELECT severity, count(*) FROM findings WHERE run_id=? GROUP BY severity", (row[0],)
        ):
            counts[Severity[sev].name] += n
        meta = json.loads(row[6])
        if not isinstance(meta, dict):
            raise ValueError(f"run {row[0]}: meta is not a JSON object")
        return Run(int(row[0]), _real(row[1]), _real(row[2]), _text(row[3]), int(row[4]), int(row[5]), meta, counts)

    def runs(self, limit: int = 20, *, before: int | None = None) -> list[Run]:
        """The latest runs, newest first (``before``: only runs with a smaller id)."""
        q = "SELECT id, started, finished, pattern, exit_code, hosts, meta, ok_findings FROM runs"
        args: tuple[Any, ...] = ()
        if before is not None:
            q += " WHERE id < ?"
            args = (before,)
        rows = self.db.execute(q + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [self._run(r) for r in rows]

    def last_run(self, *, before: int | None = None, pattern: str | None = None) -> Run | None:
        """The newest run (with the same pattern when given), or None."""
        q = "SELECT id, started, finished, pattern, exit_code, hosts, meta, ok_findings FROM runs WHERE 1=1"
        args: list[Any] = []
        if before is not None:
            q += " AND id < ?"
            args.append(before)
        if pattern is not None:
            q += " AND pattern = ?"
            args.append(pattern)
        row = self.db.execute(q + " ORDER BY id DESC LIMIT 1", args).fetchone()
        return self._run(row) if row else None

    def findings(self, run_id: int) -> list[Finding]:
        """The problems (findings not OK) stored for a run, in the order they were recorded."""
        return [
            Finding(_text(c), Severity[s], _text(h) or None, _text(subj), _text(msg), _text(act), tuple(_evidence(ev)))
            for c, s, h, subj, msg, act, ev in self.db.execute(
                "SELECT check_name, severity, host, subject, message, action, evidence FROM findings "
                "WHERE run_id=? ORDER BY rowid",
                (run_id,),
            )
        ]

    def _first_run(self, since: float) -> int:
        row = self.db.execute("SELECT min(id) FROM runs WHERE started >= ?", (since,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 1 << 62

    def series(self, name: str, *, since: float = 0.0) -> dict[tuple[str, str], list[tuple[float, float]]]:
        """``{(host, subject): [(run start, value), ...]}`` for one metric, oldest first."""
        out: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for host, subject, t, v in self.db.execute(
            "SELECT s.host, s.subject, r.started, x.value FROM series s "
            "JOIN samples x ON x.series_id = s.id JOIN runs r ON r.id = x.run_id "
            "WHERE s.name=? AND s.subject!=? AND s.last_run>=? AND r.started>=? ORDER BY r.started",
            (name, HOST_MEAN, self._first_run(since), since),
        ):
            out.setdefault((_text(host), _text(subject)), []).append((_real(t), _real(v)))
        return out

    def run_values(self, run_id: int, name: str) -> dict[tuple[str, str], float]:
        """``{(host, subject): value}`` of metric ``name`` recorded by run ``run_id``."""
        return {
            (_text(h), _text(subj)): _real(v)
            for h, subj, v in self.db.execute(
                "SELECT s.host, s.subject, x.value FROM samples x JOIN series s ON s.id = x.series_id "
                "WHERE x.run_id=? AND s.name=? AND s.subject!=?",
                (run_id, name, HOST_MEAN),
            )
        }

    def series_hosts(self, name: str, *, since: float = 0.0) -> dict[str, int]:
        """``{host: how many subjects}`` of metric ``name`` with samples since ``since``."""
        return {
            _text(h): int(n)
            for h, n in self.db.execute(
                "SELECT host, count(*) FROM series WHERE name=? AND subject!=? AND last_run>=? GROUP BY host",
                (name, HOST_MEAN, self._first_run(since)),
            )
        }

    def series_buckets(
        self, name: str, *, since: float, buckets: int, per_host: bool = False
    ) -> dict[tuple[str, str], list[tuple[float, float]]]:
        """:meth:`series` since ``since``, averaged in SQLite into at most ``buckets`` equal time
        slices of the span the runs since then cover (mean time and mean value per slice; each
        run its own point when there are no more runs than ``buckets``).  ``per_host``: one line
        per host (subject :data:`HOST_MEAN`): the host's stored mean where it has several
        subjects, else its one subject."""
        t0, t1, runs = self.db.execute(
            "SELECT min(started), max(started), count(*) FROM runs WHERE started >= ?", (since,)
        ).fetchone()
        if not runs:
            return {}
        args: tuple[float, ...] = ()
        if runs <= buckets:
            slice_of = "r.id"
        else:
            slice_of, args = "CAST((r.started - ?) / ? AS INTEGER)", (t0, (t1 - t0) / buckets * (1 + 1e-9) or 1.0)
        first = self._first_run(since)
        if per_host:
            subject = "'*'"
            lines = (
                "(s.subject = '*' OR NOT EXISTS (SELECT 1 FROM series h WHERE h.name = s.name "
                "AND h.host = s.host AND h.subject = '*' AND h.last_run >= ?))"
            )
            line_args: tuple[Any, ...] = (first,)
        else:
            subject, lines, line_args = "s.subject", "s.subject != '*'", ()
        rows = self.db.execute(
            f"SELECT s.host, {subject}, {slice_of} AS b, avg(r.started), avg(x.value) "
            "FROM series s JOIN samples x ON x.series_id = s.id JOIN runs r ON r.id = x.run_id "
            f"WHERE s.name=? AND {lines} AND s.last_run>=? AND r.started>=? "
            f"GROUP BY s.host, {subject}, b ORDER BY b",
            (*args, name, *line_args, first, since),
        )
        out: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for host, subj, _, t, v in rows:
            out.setdefault((_text(host), _text(subj)), []).append((_real(t), _real(v)))
        return out

    def metric_names(self, *, since: float = 0.0) -> list[str]:
        """Metrics with samples in runs started since ``since``."""
        return [
            _text(r[0])
            for r in self.db.execute(
                "SELECT DISTINCT name FROM series WHERE last_run>=? ORDER BY name", (self._first_run(since),)
            )
        ]

    def severity_series(self, *, since: float = 0.0, pattern: str | None = None) -> list[tuple[float, dict[str, int]]]:
        """Per run (oldest first; only runs of ``pattern`` when given): its start and its count of
        findings per severity (one query, not one per run)."""
        out: dict[int, tuple[float, dict[str, int]]] = {}
        for rid, started, ok, sev, n in self.db.execute(
            "SELECT r.id, r.started, r.ok_findings, f.severity, count(f.run_id) FROM runs r "
            "LEFT JOIN findings f ON f.run_id = r.id WHERE r.started >= ? AND (? IS NULL OR r.pattern = ?) "
            "GROUP BY r.id, f.severity ORDER BY r.id",
            (since, pattern, pattern),
        ):
            counts = out.setdefault(rid, (_real(started), {**{s.name: 0 for s in Severity}, "OK": int(ok)}))[1]
            if sev is not None:
                counts[Severity[sev].name] += n
        return list(out.values())

    def prune(self, retention_days: float = DEFAULT_RETENTION_DAYS, *, now: float | None = None) -> int:
        """Delete runs started more than ``retention_days`` ago (with their findings and metrics).

        Returns how many runs were deleted.  ``retention_days`` must be > 0.
        """
        if retention_days <= 0:
            raise HistoryError(f"retention must be more than 0 days (got {retention_days})")
        cutoff = (time.time() if now is None else now) - retention_days * 86400.0
        self.db.execute("BEGIN IMMEDIATE")
        try:
            n = self.db.execute("DELETE FROM runs WHERE started < ?", (cutoff,)).rowcount
            self.db.execute("DELETE FROM series WHERE last_run < (SELECT coalesce(min(id), 1 << 62) FROM runs)")
            self.db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        return int(n)

    # notification state (see clusterctl.report.notify)
    def notified(self) -> dict[tuple[str, str, str], tuple[str, float]]:
        """``{(check, host, subject): (severity, when last notified)}``."""
        return {
            (_text(c), _text(h), _text(s)): (Severity[sev].name, _real(at))
            for c, h, s, sev, at in self.db.execute("SELECT check_name, host, subject, severity, at FROM notified")
        }

    def set_notified(self, entries: dict[tuple[str, str, str], tuple[str, float]]) -> None:
        """Replace the notification state with ``entries`` (one transaction)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("DELETE FROM notified")
            self.db.executemany(
                "INSERT INTO notified VALUES (?,?,?,?,?)",
                [(c, h, s, sev, at) for (c, h, s), (sev, at) in entries.items()],
            )
            self.db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise


def _real(v: Any) -> float:
    """A stored number (a junk row's text or NULL raises, and :func:`_guarded` reports it)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"expected a number, found {type(v).__name__} {str(v)[:40]!r}")
    return float(v)


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected text, found {type(v).__name__} {str(v)[:40]!r}")
    return v


def _evidence(text: Any) -> list[str]:
    ev = json.loads(_text(text))
    if not isinstance(ev, list):
        raise ValueError("evidence is not a JSON list")
    return [str(x) for x in ev]


for _name in (
    "record",
    "runs",
    "last_run",
    "findings",
    "series",
    "run_values",
    "series_hosts",
    "series_buckets",
    "metric_names",
    "severity_series",
    "prune",
    "notified",
    "set_notified",
    "_first_run",
):
    setattr(History, _name, _guarded(getattr(History, _name)))
