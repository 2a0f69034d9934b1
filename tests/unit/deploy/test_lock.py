"""The deploy lock: the node program's O_EXCL lock file, driven through a Fleet over FakeTransport.

Each fake host runs the real node program in-process against its own
temporary directory, so the file semantics (exclusive create, stale
recovery, release only by the holder) are the ones a node has.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from clusterctl.deploy.rollout import lock
from clusterctl.node import deploy as node
from clusterctl.fleet import Fleet
from clusterctl.fleet.results import HostStatus
from clusterctl.fleet.transport import FakeReply, FakeTransport, HostFailure
from clusterctl.inventory.model import Host

_node_lock = threading.Lock()


class Nodes:
    """Fake hosts whose node program keeps its files under ``root/<host>/``."""

    def __init__(self, root: Path, names: list[str]):
        self.root, self.names = root, names
        self.down: set[str] = set()
        self.transport = FakeTransport(self.handle)

    def handle(self, host: Host, command: str, stdin: bytes | None) -> FakeReply | HostFailure:
        if host.name in self.down:
            return HostFailure(HostStatus.UNREACHABLE, "connection refused")
        assert "python3" in command and stdin is not None
        job = json.loads(stdin.decode().splitlines()[0])
        base = self.root / host.name
        with _node_lock:  # the node module's paths are globals: one fake host at a time
            saved = (node.LOCK_PATH, node.STATE_DIR, node.AUDIT_PATH)
            node.LOCK_PATH, node.STATE_DIR = str(base / "deploy.lock"), str(base / "deploy")
            node.AUDIT_PATH = node.STATE_DIR + "/audit.jsonl"
            try:
                out = node.OPS[job["op"]](job)
            finally:
                node.LOCK_PATH, node.STATE_DIR, node.AUDIT_PATH = saved
        return FakeReply(0, json.dumps(out) + "\n")

    def fleet(self) -> Fleet:
        return Fleet([Host(n, n) for n in self.names], transport=self.transport)

    def lock_file(self, name: str) -> Path:
        return self.root / name / "deploy.lock"


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    yield Nodes(tmp_path, ["h1", "h2", "h3"])


HOSTS = ["h1", "h2", "h3"]


def test_lock_holds_holder_pid_run_and_time_and_is_released(nodes: Nodes) -> None:
    me = lock.LockInfo(holder="bob@ctl1")
    with nodes.fleet() as fleet:
        got = lock.acquire(fleet, HOSTS, me)
        assert got.locked == HOSTS and got.recovered == {} and got.failed == {}
        data = json.loads(nodes.lock_file("h2").read_text())
        assert data == {"holder": "bob@ctl1", "pid": os.getpid(), "run_id": me.run_id, "time": me.time}
        assert lock.release(fleet, HOSTS, me.run_id, {"kind": "deploy", "result": "ok"}) == {}
    assert not any(nodes.lock_file(h).exists() for h in HOSTS)
    audit = (nodes.root / "h1" / "deploy" / "audit.jsonl").read_text().splitlines()
    assert [json.loads(line)["result"] for line in audit] == ["ok"]


def test_a_second_run_is_refused_with_the_holders_details_and_takes_nothing(nodes: Nodes) -> None:
    first, second = lock.LockInfo(holder="alice@ctl1"), lock.LockInfo(holder="bob@ctl2")
    with nodes.fleet() as fleet:
        lock.acquire(fleet, ["h2"], first)
        with pytest.raises(lock.LockHeld) as e:
            lock.acquire(fleet, HOSTS, second)
        assert "h2: held by alice@ctl1" in str(e.value) and first.run_id in str(e.value)
        # all or nothing: the hosts the second run did lock were released again
        assert not nodes.lock_file("h1").exists() and not nodes.lock_file("h3").exists()
        assert json.loads(nodes.lock_file("h2").read_text())["run_id"] == first.run_id


def test_release_never_removes_another_runs_lock(nodes: Nodes) -> None:
    holder = lock.LockInfo()
    with nodes.fleet() as fleet:
        lock.acquire(fleet, ["h1"], holder)
        lock.release(fleet, ["h1"], "some-other-run")
        assert nodes.lock_file("h1").exists()


@pytest.mark.parametrize("how", ["stale", "break"])
def test_a_stale_or_broken_lock_is_recovered_and_reported(nodes: Nodes, how: str) -> None:
    dead = lock.LockInfo(holder="carol@crashed")
    with nodes.fleet() as fleet:
        lock.acquire(fleet, ["h1"], dead)
        if how == "stale":
            old = nodes.lock_file("h1").stat().st_mtime - 3 * 3600
            os.utime(nodes.lock_file("h1"), (old, old))
        me = lock.LockInfo()
        got = lock.acquire(fleet, HOSTS, me, ttl_s=7200, break_lock=(how == "break"))
        assert got.locked == HOSTS and got.recovered["h1"]["holder"] == "carol@crashed"
        assert json.loads(nodes.lock_file("h1").read_text())["run_id"] == me.run_id


def test_a_fresh_lock_is_not_stale(nodes: Nodes) -> None:
    with nodes.fleet() as fleet:
        lock.acquire(fleet, ["h1"], lock.LockInfo())
        with pytest.raises(lock.LockHeld):
            lock.acquire(fleet, ["h1"], lock.LockInfo(), ttl_s=7200)


def test_an_unreachable_host_is_reported_not_locked_and_does_not_block_the_others(nodes: Nodes) -> None:
    nodes.down.add("h3")
    with nodes.fleet() as fleet:
        got = lock.acquire(fleet, HOSTS, lock.LockInfo())
    assert got.locked == ["h1", "h2"] and "connection refused" in got.failed["h3"]


def test_held_releases_on_an_error_and_on_ctrl_c(nodes: Nodes) -> None:
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        records: list[Any] = []
        with nodes.fleet() as fleet:
            with pytest.raises(type(exc)):
                with lock.held(fleet, HOSTS, lock.LockInfo(), audit=lambda: records.append(1) or {"r": 1}):
                    assert all(nodes.lock_file(h).exists() for h in HOSTS)
                    raise exc
        assert not any(nodes.lock_file(h).exists() for h in HOSTS) and records == [1]


def test_held_releases_with_a_fresh_fleet_when_the_first_was_closed(nodes: Nodes) -> None:
    fleet = nodes.fleet()
    with pytest.raises(KeyboardInterrupt):
        with lock.held(fleet, HOSTS, lock.LockInfo(), fresh_fleet=nodes.fleet):
            fleet.close()  # what Ctrl-C during a Fleet.run does
            raise KeyboardInterrupt
    assert not any(nodes.lock_file(h).exists() for h in HOSTS)
