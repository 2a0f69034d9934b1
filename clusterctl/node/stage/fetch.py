"""Node-side fetcher: chunk store, sources, parallel ranged reads (stdlib only).

:class:`ChunkStore` owns the files of one version being staged (in the
layout's partial directory): it knows which chunks are verified, writes a
chunk only when its sha256 matches the manifest, and lets the relay server
wait for a chunk.  :func:`fetch_parallel` reads the missing chunks from a
range source (HTTP(S) with ``Range:``, or a path on a shared filesystem) with
``workers`` reads in flight, several files and several chunks per file at
once, retrying each chunk with exponential back-off.

Resume: :meth:`ChunkStore.scan` re-hashes what a previous, interrupted run
left on disk; chunks that match are kept and never fetched again.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional

from . import manifest as mf
from .threads import pmap

if TYPE_CHECKING:
    import http.client

# http.client, urllib.parse and random are imported where they are used: a relay child
# that never reads the source does not pay their import (most of the node program's
# start-up CPU, which on a light lab every host spends on the same shared CPUs).

#: Attempts per chunk (first try included) before a fetch gives up.
DEFAULT_ATTEMPTS = 5
#: First back-off in seconds; doubles per attempt, capped at :data:`MAX_BACKOFF_S`, with jitter.
BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0
#: Bytes kept free beyond the model when checking disk space.
SPACE_MARGIN = 16 * 1024 * 1024


class FetchError(RuntimeError):
    """A chunk could not be had from any source (message names file, chunk and cause)."""


class DiskSpaceError(FetchError):
    """Not enough free space for the version (checked before writing, or ENOSPC while writing)."""


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based)."""
    import random

    return min(MAX_BACKOFF_S, BACKOFF_S * (2 ** (attempt - 1))) * (0.5 + random.random() / 2)


class ChunkStore:
    """The files of one version under ``root``, opened for pread/pwrite.

    ``complete=True`` opens an already verified version read-only (a node that
    has the version serves it to its relay children without fetching).
    """

    def __init__(self, root: str, manifest: "mf.Manifest", complete: bool = False):
        self.root = root
        self.manifest = manifest
        self.chunks = manifest.chunks()
        self.done = [complete] * len(self.chunks)
        #: Chunks re-read from disk and found intact after they were written (see :meth:`reverify_as_done`).
        self.reverified = [complete] * len(self.chunks)
        #: ``time.monotonic()`` of the first and the last chunk written by :meth:`put` (None before any).
        self.first_put: Optional[float] = None
        self.last_put: Optional[float] = None
        self._written: Deque[int] = collections.deque()  # written, not yet re-read by reverify_as_done
        self.failed: Optional[str] = None
        self.cond = threading.Condition()
        self.fds: List[int] = []
        for f in manifest.files:
            path = os.path.join(root, f.path)
            if complete:
                self.fds.append(os.open(path, os.O_RDONLY))
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size != f.size:
                os.ftruncate(fd, f.size)
            self.fds.append(fd)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    # -- state -------------------------------------------------------------
    def missing(self) -> List["mf.Chunk"]:
        return [c for c in self.chunks if not self.done[c.index]]

    def missing_bytes(self) -> int:
        return sum(c.length for c in self.missing())

    def complete(self) -> bool:
        return all(self.done)

    def fail(self, reason: str) -> None:
        """Mark the store failed: relay servers waiting on a chunk give up."""
        with self.cond:
            self.failed = reason
            self.cond.notify_all()

    def wait_for(self, index: int, timeout: float) -> bool:
        """Block until chunk ``index`` is verified (True), the store failed or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.done[index]:
                left = deadline - time.monotonic()
                if self.failed or left <= 0:
                    return False
                self.cond.wait(min(left, 1.0))
            return True

    def next_ready(self, lo: int, hi: int, skip: bytearray, timeout: float) -> Optional[int]:
        """The lowest verified chunk in ``[lo, hi)`` with ``skip[i] == 0``, waiting up to
        ``timeout`` seconds for one; None on timeout or when the store failed."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i in range(lo, min(hi, len(self.chunks))):
                    if self.done[i] and not skip[i]:
                        return i
                left = deadline - time.monotonic()
                if self.failed or left <= 0:
                    return None
                self.cond.wait(min(left, 1.0))

    # -- data --------------------------------------------------------------
    def read(self, index: int) -> bytes:
        c = self.chunks[index]
        return os.pread(self.fds[c.file], c.length, c.offset)

    def put(self, index: int, data: bytes) -> bool:
        """Write chunk ``index`` if ``data`` matches its sha256; False (nothing written) if not."""
        c = self.chunks[index]
        if len(data) != c.length or hashlib.sha256(data).hexdigest() != c.sha256:
            return False
        if not self.done[index]:
            try:
                view = memoryview(data)
                pos = 0
                while pos < len(view):
                    pos += os.pwrite(self.fds[c.file], view[pos:], c.offset + pos)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise DiskSpaceError(f"disk full while writing {c.path} under {self.root}: {e.strerror}") from None
                raise
            now = time.monotonic()
            with self.cond:
                self.done[index] = True
                self.reverified[index] = False
                self._written.append(index)
                if self.first_put is None:
                    self.first_put = now
                self.last_put = now
                self.cond.notify_all()
        return True

    def _chunk_ok(self, c: "mf.Chunk") -> bool:
        return hashlib.sha256(os.pread(self.fds[c.file], c.length, c.offset)).hexdigest() == c.sha256

    def _in_hole(self, c: "mf.Chunk") -> bool:
        """True when no byte of ``c`` was ever written (a hole of the sparse partial file)."""
        try:
            return os.lseek(self.fds[c.file], c.offset, os.SEEK_DATA) >= c.offset + c.length
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data from here to the end of the file
                return True
            return False  # SEEK_DATA not supported here: read the chunk

    def scan(self, workers: int = 4) -> int:
        """Mark the chunks already on disk whose sha256 matches (resume); returns how many.

        Chunks in holes of the (sparse) partial files are never written, so
        they are counted missing without being read: a fresh start does not
        hash S bytes of zeros."""

        def intact(c: "mf.Chunk") -> bool:
            return not self._in_hole(c) and self._chunk_ok(c)

        oks = pmap(intact, self.chunks, workers)
        with self.cond:
            for c, ok in zip(self.chunks, oks):
                self.done[c.index] = ok
                self.reverified[c.index] = ok  # just re-read from disk and found intact
            self.cond.notify_all()
        return sum(oks)

    def verify_all(self, workers: int = 4) -> List["mf.Chunk"]:
        """Make sure every chunk on disk matches its sha256; return those that do not (and unmark them).

        Chunks that :meth:`reverify_as_done` already re-read after their last
        write are not read again; every other chunk is re-read here.
        """
        todo = [c for c in self.chunks if not self.reverified[c.index]]
        oks = pmap(self._chunk_ok, todo, workers)
        bad = [c for c, ok in zip(todo, oks) if not ok]
        with self.cond:
            for c, ok in zip(todo, oks):
                self.reverified[c.index] = ok
            for c in bad:
                self.done[c.index] = False
        return bad

    def reverify_as_done(self, stop: threading.Event) -> None:
        """Re-read from disk each chunk once it is written and mark it re-verified when intact.

        Runs (in a thread of its own) while the chunks arrive, so the re-read
        that :meth:`verify_all` needs after the transfer overlaps the network
        wait instead of following it.  A chunk found corrupt is left
        unmarked: :meth:`verify_all` reads it again and reports it.  Returns
        when ``stop`` is set or the store failed.
        """
        while not stop.is_set():
            with self.cond:
                if not self._written:
                    if self.failed:
                        return
                    self.cond.wait(0.2)
                    continue
                index = self._written.popleft()
            if self._chunk_ok(self.chunks[index]):
                with self.cond:
                    if self.done[index]:
                        self.reverified[index] = True

    def check_space(self) -> Dict[str, int]:
        """Raise DiskSpaceError unless the missing bytes (plus a margin) fit on the filesystem."""
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        need = self.missing_bytes()
        if need + SPACE_MARGIN > free:
            raise DiskSpaceError(
                f"not enough space for {self.manifest.name} {self.manifest.version} under {self.root}: "
                f"need {_mib(need)} MiB (+{_mib(SPACE_MARGIN)} MiB margin), {_mib(free)} MiB free"
            )
        return {"need": need, "free": free}


def _mib(n: int) -> int:
    return -(-n // (1024 * 1024))


# -- sources ----------------------------------------------------------------
class HttpSource:
    """Files under ``base_url`` read with HTTP range requests, one keep-alive connection per thread.

    ``headers`` (e.g. Authorization) are sent with every request and never
    appear in an error message.  ``timeout``: seconds per socket operation.
    """

    def __init__(self, base_url: str, headers: Optional[Dict[str, str]] = None, timeout: float = 30.0):
        import urllib.parse

        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise FetchError(f"unsupported source URL {redact_url(base_url)} (http:// or https://)")
        self.scheme, self.host, self.port = u.scheme, u.hostname, u.port
        self.prefix = urllib.parse.unquote(u.path.rstrip("/")) + "/"  # decoded; quoted per request
        self.headers = dict(headers or {})
        if u.username is not None:  # user:password@host: basic auth, kept out of messages
            import base64

            cred = urllib.parse.unquote(u.username) + ":" + urllib.parse.unquote(u.password or "")
            self.headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
        self.timeout = timeout
        self.label = redact_url(base_url)
        self._local = threading.local()

    def _conn(self) -> "http.client.HTTPConnection":
        import http.client

        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            conn = cls(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None

    def _sign(self, url: str, headers: Dict[str, str]) -> Dict[str, str]:
        """The headers to send for ``url`` (an authenticated source adds its signature here)."""
        return headers

    def get(self, path: str, headers: Optional[Dict[str, str]] = None) -> bytes:
        """GET a whole file (the manifest); FetchError on any status but 200."""
        return self._request(path, None, None, headers)

    def read(self, c: "mf.Chunk") -> bytes:
        return self._request(c.path, c.offset, c.length)

    def _request(
        self, path: str, offset: Optional[int], length: Optional[int], extra: Optional[Dict[str, str]] = None
    ) -> bytes:
        import http.client
        import urllib.parse

        url = urllib.parse.quote(self.prefix + path)
        headers = dict(self.headers, **(extra or {}))
        if offset is not None and length is not None:
            headers["Range"] = f"bytes={offset}-{offset + length - 1}"
        headers = self._sign(url, headers)
        try:
            conn = self._conn()
            conn.request("GET", url, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self._drop()
            raise FetchError(f"{self.label}{path}: {type(e).__name__}: {e}") from None
        if offset is None:
            if resp.status != 200:
                raise FetchError(f"{self.label}{path}: HTTP {resp.status} {resp.reason}")
            return body
        if resp.status == 206:
            if len(body) != length:
                raise FetchError(f"{self.label}{path}: short range answer ({len(body)} of {length} bytes)")
            return body
        if resp.status == 200:  # server ignores ranges: usable only for the whole file
            return body[offset : offset + (length or 0)] if len(body) >= offset + (length or 0) else b""
        raise FetchError(f"{self.label}{path}: HTTP {resp.status} {resp.reason}")

    def close(self) -> None:
        self._drop()


class FileSource:
    """Files under ``root`` on a filesystem every node mounts (NFS, Lustre, ...)."""

    def __init__(self, root: str):
        self.root = root
        self.label = root.rstrip("/") + "/"

    def get(self, path: str) -> bytes:
        try:
            with open(os.path.join(self.root, path), "rb") as fh:
                return fh.read()
        except OSError as e:
            raise FetchError(f"{self.label}{path}: {e.strerror or e}") from None

    def read(self, c: "mf.Chunk") -> bytes:
        try:
            with open(os.path.join(self.root, c.path), "rb") as fh:
                return os.pread(fh.fileno(), c.length, c.offset)
        except OSError as e:
            raise FetchError(f"{self.label}{c.path}: {e.strerror or e}") from None

    def close(self) -> None:
        pass


def redact_url(url: str) -> str:
    """``url`` without user:password and without the query string (may carry tokens)."""
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    netloc = u.hostname or ""
    if u.port:
        netloc += f":{u.port}"
    return urllib.parse.urlunsplit((u.scheme, netloc, u.path, "", ""))


def fetch_parallel(
    store: ChunkStore,
    source: Any,
    workers: int = 8,
    attempts: int = DEFAULT_ATTEMPTS,
    stats: Optional[Dict[str, int]] = None,
    on_chunk: Optional[Callable[[int], None]] = None,
) -> Dict[str, int]:
    """Fetch every missing chunk of ``store`` from ``source`` with ``workers`` reads in flight.

    Chunks are submitted in manifest order (a relay child downstream gets them
    roughly in the order it asks for them).  Each chunk is tried up to
    ``attempts`` times: a transport error or a sha256 mismatch (a bad byte on
    the wire) waits :func:`backoff` and reads it again.  Raises FetchError
    (naming file, offset and last cause) when a chunk runs out of attempts,
    DiskSpaceError on ENOSPC.  ``stats`` counts ``bytes``, ``chunks``,
    ``retries`` and ``corrupt``.
    """
    stats = stats if stats is not None else {}
    for k in ("bytes", "chunks", "retries", "corrupt"):
        stats.setdefault(k, 0)
    lock = threading.Lock()
    abort = threading.Event()

    def one(c: "mf.Chunk") -> None:
        last = ""
        for attempt in range(1, attempts + 1):
            if abort.is_set():
                return
            try:
                data = source.read(c)
                if store.put(c.index, data):
                    with lock:
                        stats["bytes"] += c.length
                        stats["chunks"] += 1
                    if on_chunk:
                        on_chunk(c.index)
                    return
                last = "sha256 mismatch"
                with lock:
                    stats["corrupt"] += 1
            except DiskSpaceError:
                abort.set()
                raise
            except FetchError as e:
                last = str(e)
            if attempt < attempts:
                with lock:
                    stats["retries"] += 1
                time.sleep(backoff(attempt))
        abort.set()
        raise FetchError(
            f"{c.path} bytes {c.offset}-{c.offset + c.length - 1} (chunk {c.index}): "
            f"gave up after {attempts} attempts: {last}"
        )

    todo = store.missing()
    if not todo:
        return stats

    def guarded(c: "mf.Chunk") -> None:
        try:
            one(c)
        except BaseException:
            abort.set()  # the other readers stop taking chunks
            raise

    pmap(guarded, todo, min(workers, len(todo)))  # re-raises the first chunk's error (in manifest order)
    return stats
