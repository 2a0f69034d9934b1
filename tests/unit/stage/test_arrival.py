"""Chunks as they arrive: re-verified on disk at once (the final check re-reads only the rest), relayed when ready."""

from __future__ import annotations

import os
import threading

from clusterctl.node.stage import fetch

from unit.stage.nodehelp import CHUNK, make_model, manifest_for

SIZES = {"a.safetensors": 6 * CHUNK + 17, "b.json": 300}


def _store(tmp_path):
    src = make_model(tmp_path / "src", SIZES)
    man = manifest_for(src)
    store = fetch.ChunkStore(str(tmp_path / "dst"), man)
    return src, store


def _put_all(src, store) -> None:
    for c in store.chunks:
        with open(src / c.path, "rb") as fh:
            assert store.put(c.index, os.pread(fh.fileno(), c.length, c.offset))


def _run_reverifier(store, work) -> None:
    stop = threading.Event()
    t = threading.Thread(target=store.reverify_as_done, args=(stop,))
    t.start()
    work()
    deadline = 50
    while store._written and deadline:  # let it drain what was written
        threading.Event().wait(0.05)
        deadline -= 1
    stop.set()
    t.join(5)
    assert not t.is_alive()


def test_chunks_reread_while_arriving_are_not_read_again(tmp_path, monkeypatch):
    src, store = _store(tmp_path)
    _run_reverifier(store, lambda: _put_all(src, store))
    assert all(store.reverified)
    reads = []
    monkeypatch.setattr(store, "_chunk_ok", lambda c: reads.append(c.index) or True)
    assert store.verify_all() == [] and reads == []


def test_a_chunk_corrupted_on_disk_before_the_reread_is_reported(tmp_path):
    src, store = _store(tmp_path)
    victim = store.chunks[2]

    def put_and_corrupt() -> None:
        with store.cond:  # hold the reverifier off until the chunk is damaged on disk
            _put_all(src, store)
            os.pwrite(store.fds[victim.file], b"\xff\xfe", victim.offset + 5)

    _run_reverifier(store, put_and_corrupt)
    assert not store.reverified[victim.index]
    bad = store.verify_all()
    assert [c.index for c in bad] == [victim.index] and not store.done[victim.index]


def test_a_rewritten_chunk_is_read_again_by_the_final_check(tmp_path):
    src, store = _store(tmp_path)
    _put_all(src, store)
    assert store.verify_all() == [] and all(store.reverified)
    os.pwrite(store.fds[store.chunks[0].file], b"\x00", 1)
    store.done[0] = False
    with open(src / store.chunks[0].path, "rb") as fh:
        assert store.put(0, os.pread(fh.fileno(), store.chunks[0].length, 0))
    assert not store.reverified[0]
    assert store.verify_all() == [] and store.reverified[0]


def test_a_relay_sends_ready_chunks_past_one_that_is_late_then_the_late_one(tmp_path):
    """The head's parallel reads complete out of order: a child gets what is ready, and every chunk once."""
    import socket

    from clusterctl.node.stage import relay

    src, store = _store(tmp_path)
    late = 0
    for c in store.chunks[1:]:
        with open(src / c.path, "rb") as fh:
            assert store.put(c.index, os.pread(fh.fileno(), c.length, c.offset))
    server = relay.RelayServer(store, "d" * 64, "127.0.0.1", 0, stall_timeout=5)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            conn.sendall(b"STAGE " + b"d" * 64 + b" 0\n")
            assert relay._readline(conn) == b"OK\n"
            order = []
            for _ in range(len(store.chunks) - 1):
                index, length = relay.HEADER.unpack(relay._recv_exact(conn, relay.HEADER.size))
                relay._recv_exact(conn, length)
                order.append(index)
            c = store.chunks[late]
            with open(src / c.path, "rb") as fh:
                assert store.put(late, os.pread(fh.fileno(), c.length, c.offset))
            index, length = relay.HEADER.unpack(relay._recv_exact(conn, relay.HEADER.size))
            assert relay._recv_exact(conn, length) == store.read(late)
            order.append(index)
            conn.sendall(b"DONE\n")
        assert order == list(range(1, len(store.chunks))) + [late]
    finally:
        server.stop()


def test_a_fresh_start_reads_nothing_and_a_resume_rereads_only_written_chunks(tmp_path, monkeypatch):
    src, store = _store(tmp_path)
    reads: list[int] = []
    real = store._chunk_ok
    monkeypatch.setattr(store, "_chunk_ok", lambda c: reads.append(c.index) or real(c))
    assert store.scan() == 0 and reads == []  # sparse files of the model's size: all holes
    written = [store.chunks[1], store.chunks[4]]
    for c in written:
        with open(src / c.path, "rb") as fh:
            os.pwrite(store.fds[c.file], os.pread(fh.fileno(), c.length, c.offset), c.offset)
    os.fsync(store.fds[written[0].file])
    assert store.scan() == 2
    assert sorted(reads) == [1, 4] and store.done[1] and store.done[4] and not store.done[0]
