"""The relay chain with real node programs on loopback: source read once, dead relay, fallback."""

from __future__ import annotations

import os
import signal
import socket
import time

from clusterctl.node.stage import verify_model

from unit.stage.nodehelp import CHUNK, make_model, manifest_for, result_of, start_node, stage_job
from unit.stage.rangeserver import RangeServer

SIZES = {"config.json": 300, "model.safetensors": 40 * CHUNK + 7}


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _chain(tmp_path, man, url, n, ports, stall=3.0):
    """Start ``n`` node programs as a chain on 127.0.0.1 (node i's upstreams: i-1, ..., 0)."""
    procs = []
    for i in range(n):
        relay = {
            "bind": "127.0.0.1",
            "port": ports[i] if i < n - 1 else None,
            "upstreams": [["127.0.0.1", ports[j]] for j in range(i - 1, -1, -1)],
            "children": 1 if i < n - 1 else 0,
            "stall_timeout": stall,
            "linger": stall + 2,
        }
        job = stage_job(man, tmp_path / f"node{i}" / "m", {"kind": "http", "url": url}, relay=relay)
        procs.append(start_node(job))
    return procs


def test_chain_reads_the_source_once(tmp_path):
    src = make_model(tmp_path / "src", SIZES)
    man = manifest_for(src)
    with RangeServer(str(src)) as srv:
        procs = _chain(tmp_path, man, srv.url, 4, _free_ports(4))
        results = [result_of(p) for p in procs]
    assert all(rc == 0 for rc, _ in results), results
    assert len(srv.requests) == len(man.chunks())  # only the head read the source
    for i, (_, r) in enumerate(results):
        assert r["bytes"] == man.total_bytes
        assert verify_model.check(str(tmp_path / f"node{i}" / "m")) is None
        if i:
            assert r["upstream"].startswith("127.0.0.1:")
        if i < 3:
            assert r["served_bytes"] == man.total_bytes  # passed every chunk on


def test_a_dead_relay_node_is_bypassed_and_the_others_complete(tmp_path):
    src = make_model(tmp_path / "src", SIZES)
    man = manifest_for(src)
    ports = _free_ports(4)
    with RangeServer(str(src)) as srv:
        srv.delay = 0.03  # a slow source, so the chain is mid-transfer when node1 dies
        procs = _chain(tmp_path, man, srv.url, 4, ports)
        deadline = time.monotonic() + 20
        while len(srv.requests) < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        procs[1].send_signal(signal.SIGKILL)
        assert procs[1].wait(timeout=10) == -signal.SIGKILL
        results = {i: result_of(procs[i]) for i in (0, 2, 3)}
    for i in (0, 2, 3):
        rc, r = results[i]
        assert rc == 0, r
        assert verify_model.check(str(tmp_path / f"node{i}" / "m")) is None
    # node2 re-attached to node0 (its grandparent); the source was still read once.
    assert results[2][1]["upstream"] == f"127.0.0.1:{ports[0]}", results[2][1]["events"]
    assert any(f"127.0.0.1:{ports[1]}" in e for e in results[2][1]["events"])
    assert len(srv.requests) == len(man.chunks())
    assert not os.path.lexists(tmp_path / "node1" / "m")


def test_without_any_upstream_left_a_node_reads_the_source(tmp_path):
    src = make_model(tmp_path / "src", SIZES)
    man = manifest_for(src)
    dead = _free_ports(2)  # nothing listens there
    with RangeServer(str(src)) as srv:
        job = stage_job(
            man,
            tmp_path / "n" / "m",
            {"kind": "http", "url": srv.url},
            relay={"port": None, "upstreams": [["127.0.0.1", p] for p in dead], "children": 0, "start_grace": 0.5},
        )
        rc, r = result_of(start_node(job))
    assert rc == 0 and r["upstream"] == "source"
    assert "fetching the remaining 42 chunks" in r["events"][-1]
    assert all(
        any(f"127.0.0.1:{p}: [Errno 111] Connection refused -> next upstream" in e for e in r["events"]) for p in dead
    )


def test_a_chain_whose_nodes_already_have_the_version_ends_without_lingering(tmp_path):
    """Pre-staged nodes (the release then only switches): each child tells its parent it has
    every chunk, so no relay server waits out its linger (stall + 2 s here, 42 s) for a child
    that will never ask for anything."""
    src = make_model(tmp_path / "src", SIZES)
    man = manifest_for(src)
    with RangeServer(str(src)) as srv:
        first = [result_of(p) for p in _chain(tmp_path, man, srv.url, 3, _free_ports(3))]
        assert all(rc == 0 for rc, _ in first), first
        served = len(srv.requests)
        again = [result_of(p, timeout=120) for p in _chain(tmp_path, man, srv.url, 3, _free_ports(3), stall=40.0)]
    assert all(rc == 0 and r["already_present"] and r["bytes"] == 0 for rc, r in again), again
    assert [r.get("told_parent") for _, r in again] == [None, True, True]
    assert len(srv.requests) == served
    # A node's own seconds (from its job's start; the interpreter's start-up is not counted):
    # a parent left waiting would show its 42 s linger here.
    slowest = max(r["seconds"] for _, r in again)
    assert slowest < 30, f"a node took {slowest:.1f} s: its relay server waited out its linger"


def test_a_parent_that_started_late_is_told_by_the_child_that_went_further_up(tmp_path):
    """A chain of 3 whose middle node starts after its child gave up on it (refused while the chain
    starts: the child is served by the head).  The child tells the middle node it is done, so the
    middle node's relay server does not wait out its linger (stall + 2 s, 42 s here) for it."""
    src = make_model(tmp_path / "src", SIZES)
    man = manifest_for(src)
    ports = _free_ports(3)

    def node(i: int):
        relay = {
            "bind": "127.0.0.1",
            "port": ports[i] if i < 2 else None,
            "upstreams": [["127.0.0.1", ports[j]] for j in range(i - 1, -1, -1)],
            "children": 1 if i < 2 else 0,
            "stall_timeout": 40.0,
            "linger": 42.0,
        }
        return start_node(stage_job(man, tmp_path / f"node{i}" / "m", {"kind": "http", "url": srv.url}, relay=relay))

    with RangeServer(str(src)) as srv:
        head, child = node(0), node(2)
        time.sleep(2.5)  # the child gives up on its parent after about 1 s of refusals
        middle = node(1)
        rc, got = result_of(child, timeout=120)
        results = [result_of(head, timeout=120), result_of(middle, timeout=120)]
    assert rc == 0 and got["upstream"] == f"127.0.0.1:{ports[0]}", got
    assert any("trying further up" in e for e in got["events"]), got["events"]
    assert any(e.endswith("told the parent we are done") for e in got["events"]), got["events"]
    assert all(r == 0 for r, _ in results), results
    assert results[1][1]["seconds"] < 30, "the middle node waited out its linger for a child told elsewhere"
