"""Pipelined relay chain between nodes over plain TCP (node-side, stdlib).

Every node of a chain runs a :class:`RelayServer` on its data address while
it fetches.  A child connects to its parent and asks for the chunks from
index ``start`` on::

    child  -> parent   b"STAGE <manifest sha256> <start>\\n"
    parent -> child    b"OK\\n", then per chunk: 12-byte header (>IQ: index,
                       length) and the chunk's bytes, in manifest order
    child  -> parent   b"DONE\\n" once the child has every chunk

The parent sends chunk ``i`` as soon as it has verified it itself, so a node
writes one chunk while receiving the next and passing the previous one on:
reaching N nodes takes about as long as reaching one.

:func:`fetch_from_upstreams` is the child side.  ``upstreams`` is the parent
first, then the grandparent ... up to the head of the chain: when the
current upstream dies (connection refused or reset) or stalls for
``stall_timeout`` seconds, the child re-attaches to the next one, asking for
the first chunk it still lacks; when none is left, it reads the remaining
chunks from the fallback source itself.  Every chunk's sha256 is checked on
arrival; a bad one is asked for again (:data:`CORRUPT_RETRIES` times per
upstream).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import fetch

HEADER = struct.Struct(">IQ")
#: Times a chunk may arrive corrupt from one upstream before moving to the next.
CORRUPT_RETRIES = 3
#: Seconds a child waits for the next byte before it declares its upstream stalled.
STALL_TIMEOUT_S = 15.0
CONNECT_TIMEOUT_S = 5.0
#: Seconds after start during which a refused connection is retried: the
#: chain's nodes start at about the same time and a parent may not listen yet.
START_GRACE_S = 10.0
#: How far past the lowest unsent chunk a relay may send a chunk that is ready.
SEND_WINDOW = 64


class RelayServer:
    """Serve ``store``'s verified chunks to children on ``(bind, port)``.

    ``children_done`` counts children that said DONE; ``active`` the
    connections being served.  Runs until :meth:`stop`.
    """

    def __init__(
        self, store: "fetch.ChunkStore", digest: str, bind: str, port: int, stall_timeout: float = STALL_TIMEOUT_S
    ):
        self.store = store
        self.digest = digest
        self.stall_timeout = stall_timeout
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind, port))
        self.sock.listen(16)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.active = 0
        self.children_done = 0
        self.served_bytes = 0
        self.dropped = 0  # connections that ended without DONE
        #: ``time.monotonic()`` of the first and last chunk sent to any child (None before any).
        self.first_sent: Optional[float] = None
        self.last_sent: Optional[float] = None
        #: Seconds connections spent waiting for chunks this node had not verified yet (summed).
        self.wait_seconds = 0.0
        self.last_activity = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="relay-accept", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self.active += 1
                self.last_activity = time.monotonic()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        said_done = False
        try:
            conn.settimeout(self.stall_timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            line = _readline(conn)
            parts = line.split()
            if len(parts) != 3 or parts[0] != b"STAGE" or parts[1].decode() != self.digest:
                conn.sendall(b"ERR wrong manifest\n")
                return
            start = int(parts[2])
            conn.sendall(b"OK\n")
            total = len(self.store.chunks)
            sent = bytearray(total)
            lo = start
            while lo < total:
                waited = time.monotonic()
                # A chunk not ready yet: wait as long as the whole transfer may take;
                # the store failing (our own fetch gave up) ends the wait at once.
                i = self.store.next_ready(lo, lo + SEND_WINDOW, sent, 1.0)
                while i is None:
                    if self.store.failed or self._stop.is_set():
                        return
                    i = self.store.next_ready(lo, lo + SEND_WINDOW, sent, 1.0)
                data = self.store.read(i)
                now = time.monotonic()
                conn.sendall(HEADER.pack(i, len(data)) + data)
                sent[i] = 1
                while lo < total and sent[lo]:
                    lo += 1
                with self.lock:
                    self.wait_seconds += now - waited
                    self.served_bytes += len(data)
                    if self.first_sent is None:
                        self.first_sent = now
                    self.last_sent = self.last_activity = time.monotonic()
            said_done = _readline(conn).strip() == b"DONE"
        except (OSError, ValueError):
            pass
        finally:
            conn.close()
            with self.lock:
                self.active -= 1
                self.last_activity = time.monotonic()
                if said_done:
                    self.children_done += 1
                else:
                    self.dropped += 1

    def wait_children(self, expected: int, linger: float, limit: float) -> None:
        """Return when ``expected`` children said DONE and none is connected, or after
        ``linger`` seconds with no connection (a re-attaching grandchild has time
        to arrive), or after ``limit`` seconds in all."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            with self.lock:
                if self.active == 0 and self.children_done >= expected:
                    return
                if self.active == 0 and time.monotonic() - self.last_activity > linger:
                    return
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self.sock.close()


def _readline(conn: socket.socket, limit: int = 256) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        b = conn.recv(1)
        if not b:
            break
        buf += b
        if len(buf) > limit:
            raise ValueError("request line too long")
    return buf


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = conn.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError("upstream closed the connection")
        got += k
    return bytes(buf)


def say_done(digest: str, total: int, upstream: Tuple[str, int], grace: float = START_GRACE_S) -> bool:
    """Tell the parent that this node already has every chunk (``STAGE digest total``, then
    ``DONE``), so the parent does not wait for it (its server lingers until each child said
    DONE or stall + 5 s passed).  A refused connection is retried for ``grace`` seconds: the
    parent may not listen yet.  Best effort: False when the parent could not be told."""
    end = time.monotonic() + grace
    while True:
        try:
            with socket.create_connection(upstream, timeout=CONNECT_TIMEOUT_S) as conn:
                conn.settimeout(CONNECT_TIMEOUT_S)
                conn.sendall(f"STAGE {digest} {total}\n".encode())
                if _readline(conn) != b"OK\n":
                    return False
                conn.sendall(b"DONE\n")
                return True
        except ConnectionRefusedError:
            if time.monotonic() > end:
                return False
            time.sleep(0.1)
        except (OSError, ValueError):
            return False


def _first_missing(store: "fetch.ChunkStore") -> Optional[int]:
    for i, d in enumerate(store.done):
        if not d:
            return i
    return None


def fetch_from_upstreams(
    store: "fetch.ChunkStore",
    digest: str,
    upstreams: Sequence[Tuple[str, int]],
    fallback: Any = None,
    workers: int = 8,
    stall_timeout: float = STALL_TIMEOUT_S,
    stats: Optional[Dict[str, Any]] = None,
    start_grace: float = START_GRACE_S,
) -> Dict[str, Any]:
    """Fill ``store`` from the chain (see the module docstring); returns ``stats``.

    ``stats`` gets ``bytes``, ``chunks``, ``corrupt``, ``events`` (one line
    per re-attachment, e.g. ``"10.77.0.102:7707: connection refused -> next"``)
    and ``upstream`` (where the last chunk came from).  Raises FetchError when
    neither an upstream nor the fallback could complete the version.
    """
    stats = stats if stats is not None else {}
    for k in ("bytes", "chunks", "corrupt", "retries"):
        stats.setdefault(k, 0)
    events: List[str] = stats.setdefault("events", [])
    started = time.monotonic()
    attached = False  # once any upstream answered, a refused connection means a dead node
    alive: List[Tuple[str, int]] = [(str(u[0]), int(u[1])) for u in upstreams]
    parent = alive[0] if alive else None
    passed_over = False  # the parent refused while the chain started and we went further up
    pos = 0
    refused: Dict[int, int] = {}

    def done() -> Dict[str, Any]:
        # A parent that was only late (it refused while the chain started) still expects this
        # child: its relay server would wait out its linger (stall + 5 s) for it.  Tell it.
        if passed_over and parent is not None and stats.get("upstream") != "%s:%d" % parent:
            told = say_done(digest, len(store.chunks), parent, start_grace)
            events.append("%s:%d: told the parent we are done%s" % (parent + ("" if told else " (it did not answer)",)))
        return stats

    corrupt_here: Dict[Tuple[str, int], int] = {}
    while pos < len(alive) and _first_missing(store) is not None:
        host, port = alive[pos]
        where = f"{host}:{port}"
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as conn:
                conn.settimeout(stall_timeout)
                conn.sendall(f"STAGE {digest} {_first_missing(store)}\n".encode())
                answer = _readline(conn)
                if answer != b"OK\n":
                    raise ConnectionError(f"refused: {answer.decode(errors='replace').strip() or 'closed'}")
                stats["upstream"] = where
                attached = True
                left = len(store.missing())
                while left:
                    index, length = HEADER.unpack(_recv_exact(conn, HEADER.size))
                    if index >= len(store.chunks):
                        raise ConnectionError(f"bad chunk index {index}")
                    data = _recv_exact(conn, length)
                    if store.done[index]:
                        continue
                    if not store.put(index, data):
                        stats["corrupt"] += 1
                        n = corrupt_here[(host, port)] = corrupt_here.get((host, port), 0) + 1
                        if n > CORRUPT_RETRIES:
                            raise ConnectionError(f"{n} corrupt chunks")
                        events.append(f"{where}: chunk {index} failed its sha256, asking again")
                        break  # reconnect to the same upstream from the first missing chunk
                    left -= 1
                    stats["bytes"] += length
                    stats["chunks"] += 1
                else:
                    conn.sendall(b"DONE\n")
                    return done()
        except fetch.DiskSpaceError:
            raise
        except (OSError, ValueError, struct.error) as e:
            if isinstance(e, ConnectionRefusedError) and not attached and time.monotonic() - started < start_grace:
                # The chain is starting: give the parent a moment to listen, then try
                # further up (a parent killed before it listened must not hold us).
                refused[pos] = refused.get(pos, 0) + 1
                if refused[pos] >= 5:
                    refused[pos] = 0
                    passed_over = passed_over or (host, port) == parent
                    events.append(f"{where}: connection refused while the chain starts -> trying further up")
                    pos = (pos + 1) % len(alive)
                time.sleep(0.2)
                continue
            msg = "stalled" if isinstance(e, socket.timeout) else (str(e) or type(e).__name__)
            events.append(f"{where}: {msg} -> next upstream")
            if alive[pos] == parent:
                passed_over = False  # dead or broken: nobody to tell
            alive.pop(pos)  # dead or broken: the next nearest ancestor takes its place
            refused.clear()
            if not attached:
                pos = 0
    if _first_missing(store) is None:
        return done()
    if fallback is None:
        raise fetch.FetchError(
            f"every upstream failed ({'; '.join(events[-3:])}) and there is no source to fall back to"
        )
    events.append(f"source {fallback.label}: fetching the remaining {len(store.missing())} chunks")
    stats["upstream"] = "source"
    fetch.fetch_parallel(store, fallback, workers=workers, stats=stats)
    return done()
