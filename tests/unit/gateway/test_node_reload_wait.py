"""The gateway node program's wait after an nginx reload (``confirm_config``), on a fake /proc:
no health answer counts while a worker of the old generation may still accept a connection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clusterctl.node import gateway as node

WANT = "0123456789abcdef"


class FakeProc:
    def __init__(self, root: Path) -> None:
        self.root = root

    def proc(self, pid: int, ppid: int, title: str, started: int = 1000) -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        # comm may hold spaces and parentheses: the fields are read after the last ")"
        (d / "stat").write_text(f"{pid} (nginx (x)) S {ppid} " + " ".join(["0"] * 17) + f" {started} 0 0\n")
        (d / "cmdline").write_bytes(title.encode() + b"\0")

    def gone(self, pid: int) -> None:
        for f in (self.root / str(pid)).iterdir():
            f.unlink()
        (self.root / str(pid)).rmdir()


@pytest.fixture
def proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeProc:
    root = tmp_path / "proc"
    root.mkdir()
    monkeypatch.setattr(node, "PROC", str(root))
    p = FakeProc(root)
    p.proc(100, 1, "nginx: master process /usr/sbin/nginx -g daemon on; master_process on;")
    p.proc(101, 100, "nginx: worker process")
    p.proc(102, 100, "nginx: worker process")
    p.proc(103, 100, "nginx: cache manager process")
    p.proc(200, 1, "nginx: worker process")  # another master's worker
    (tmp_path / "nginx.pid").write_text("100\n")
    return p


def _health(monkeypatch: pytest.MonkeyPatch, answers: list[str]) -> list[int]:
    calls: list[int] = []

    def fake(port: int, timeout: float = 2.0) -> dict[str, Any]:
        calls.append(port)
        return {"config": answers[min(len(calls), len(answers)) - 1]}

    monkeypatch.setattr(node, "_health", fake)
    return calls


def test_the_masters_workers_only(proc: FakeProc, tmp_path: Path) -> None:
    assert node._workers(str(tmp_path / "nginx.pid")) == {101: "1000", 102: "1000"}
    assert node._workers(str(tmp_path / "none.pid")) is None
    (tmp_path / "nginx.pid").write_text("200\n")  # not a master
    assert node._workers(str(tmp_path / "nginx.pid")) is None


def test_no_health_answer_counts_until_every_old_worker_stops_accepting(
    proc: FakeProc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = node._workers(str(tmp_path / "nginx.pid"))
    calls = _health(monkeypatch, [WANT])  # a new worker answers with the new config at once
    sleeps: list[float] = []

    def step(s: float) -> None:  # the master's reload, one step per poll
        sleeps.append(s)
        if len(sleeps) == 3:
            proc.proc(104, 100, "nginx: worker process")
            proc.proc(101, 100, "nginx: worker process is shutting down")
        if len(sleeps) == 5:
            proc.gone(102)

    monkeypatch.setattr(node.time, "sleep", step)
    seen = node.confirm_config(8080, WANT, old)
    assert seen == {"ok": True, "polls": 1}
    assert len(sleeps) == 5 and calls == [8080]  # asked once, after 102 had gone


def test_a_pid_reused_is_not_the_old_worker(proc: FakeProc) -> None:
    proc.proc(101, 100, "nginx: worker process", started=2000)  # 101 left; a new worker got its pid
    assert node._still_accepting({101: "1000"}) == []
    assert node._still_accepting({101: "2000"}) == [101]


def test_an_exiting_old_worker_is_not_accepting(proc: FakeProc) -> None:
    """Between its shutting-down title and its exit a worker's memory is released and its cmdline
    reads empty (seen on real nginx 1.22: the live test saw it right after the reload was confirmed):
    it runs no more code, so it accepts nothing; a live worker's title still counts."""
    proc.proc(101, 100, "")
    (proc.root / "101" / "cmdline").write_bytes(b"")
    proc.proc(102, 100, "nginx: worker process")
    assert node._still_accepting({101: "1000", 102: "1000"}) == [102]


def test_a_process_exiting_while_proc_is_read_is_gone_not_an_error(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading ``/proc/PID/stat`` or ``cmdline`` of a process in the middle of its exit fails with
    ESRCH (ProcessLookupError), not ENOENT: the scan of /proc for the master's workers and the
    wait after a reload take it as gone (the lab's gateway apply failed with "ProcessLookupError:
    [Errno 3] No such process" twice in one CI-style run)."""
    real_open = open  # the fixture's master 100 has workers 101 and 102; 102 is exiting

    def exiting(path: str, *a: Any, **kw: Any) -> Any:
        if "/102/" in str(path):
            raise ProcessLookupError(3, "No such process")
        return real_open(path, *a, **kw)

    monkeypatch.setattr(node, "open", exiting, raising=False)
    assert node._workers(str(proc.root.parent / "nginx.pid")) == {101: "1000"}
    assert node._still_accepting({101: "1000", 102: "1000"}) == [101]


def test_an_old_worker_that_keeps_accepting_fails_the_apply_in_time(
    proc: FakeProc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = node._workers(str(tmp_path / "nginx.pid"))
    calls = _health(monkeypatch, [WANT])
    seen = node.confirm_config(8080, WANT, old, wait_s=0.1)
    assert seen["ok"] is False and seen["accepting"] == [101, 102] and calls == []


def test_a_fresh_start_needs_one_answer_and_an_unknown_master_eight_in_a_row(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node.time, "sleep", lambda s: None)
    calls = _health(monkeypatch, ["old", WANT])
    assert node.confirm_config(8080, WANT, {}) == {"ok": True, "polls": 2}
    calls = _health(monkeypatch, [WANT, "old", WANT])
    assert node.confirm_config(8080, WANT, None) == {"ok": True, "polls": 2 + node.HEALTH_AGREE}
    assert len(calls) == 2 + node.HEALTH_AGREE


def test_apply_reads_the_workers_before_the_reload_and_waits_for_them(
    proc: FakeProc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "gateway.conf"
    conf.write_text("old\n")
    ran: list[list[str]] = []

    def run(argv: list[str], timeout: float = 60, session: bool = False) -> tuple[int, str]:
        ran.append(argv)
        if argv[:2] == ["systemctl", "reload"]:  # the master retires 101 and 102 and starts 105
            proc.proc(101, 100, "nginx: worker process is shutting down")
            proc.gone(102)
            proc.proc(105, 100, "nginx: worker process")
        return 0, ""

    waited: list[Any] = []
    monkeypatch.setattr(node, "ensure_nginx", lambda: None)
    monkeypatch.setattr(node, "_active", lambda: True)
    monkeypatch.setattr(node, "_run", run)
    monkeypatch.setattr(node, "_write", lambda path, data, mode, group: Path(path).write_bytes(data))
    monkeypatch.setattr(
        node, "confirm_config", lambda port, want, old: waited.append((port, want, old)) or {"ok": True}
    )
    job = {
        "op": "apply",
        "digest": WANT + "ffff",
        "port": 8081,
        "pid_file": str(tmp_path / "nginx.pid"),
        "files": [{"path": str(conf), "text": "new\n", "mode": 0o644}],
    }
    out = node.apply(job)
    assert out["ok"] and out["action"] == "reloaded"
    assert ["systemctl", "reload", "nginx.service"] in ran
    assert waited == [(8081, WANT, {101: "1000", 102: "1000"})]
