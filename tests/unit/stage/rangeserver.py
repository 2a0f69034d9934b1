"""A small static HTTP server with byte ranges and injectable faults, for staging tests.

Python's http.server ignores ``Range:``; this one answers ``206`` with the
requested bytes.  Faults: ``corrupt_once`` (a set of ``(path, offset)``: the
first answer covering that offset has one byte flipped), ``fail_first`` (that
many requests answer 503), ``stop_after`` (after that many range answers every
request is refused with 503, as a source that went away), ``delay`` (seconds
before each answer).  ``requests`` logs
``(path, start, end)`` of every range answered.
"""

from __future__ import annotations

import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

_RANGE = re.compile(r"bytes=(\d+)-(\d+)$")


class RangeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), _Handler)
        self.root = root
        self.lock = threading.Lock()
        self.requests: list[tuple[str, int, int]] = []
        self.corrupt_once: set[tuple[str, int]] = set()
        self.fail_first = 0
        self.stop_after: int | None = None
        self.auth: str | None = None
        self.delay = 0.0  # seconds slept before each range answer (a slow source)
        self.seen_auth: list[str | None] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_address[1]}/"

    def __enter__(self) -> "RangeServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RangeServer

    def log_message(self, *args: object) -> None:
        pass

    def _error(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        srv = self.server
        srv.seen_auth.append(self.headers.get("Authorization"))
        if srv.auth is not None and self.headers.get("Authorization") != srv.auth:
            return self._error(401)
        rel = unquote(self.path.split("?")[0]).lstrip("/")
        path = os.path.join(srv.root, rel)
        if ".." in rel.split("/") or not os.path.isfile(path):
            return self._error(404)
        with srv.lock:
            if srv.fail_first > 0:
                srv.fail_first -= 1
                return self._error(503)
            if srv.stop_after is not None and len(srv.requests) >= srv.stop_after:
                return self._error(503)
        if self.server.delay:
            time.sleep(self.server.delay)
        size = os.path.getsize(path)
        m = _RANGE.match(self.headers.get("Range", ""))
        start, end = (int(m.group(1)), min(int(m.group(2)), size - 1)) if m else (0, size - 1)
        with open(path, "rb") as fh:
            fh.seek(start)
            body = bytearray(fh.read(end - start + 1))
        with srv.lock:
            if m:
                srv.requests.append((rel, start, end))
            for key in list(srv.corrupt_once):
                if key[0] == rel and start <= key[1] <= end:
                    body[key[1] - start] ^= 0xFF
                    srv.corrupt_once.discard(key)
        self.send_response(206 if m else 200)
        if m:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(bytes(body))
