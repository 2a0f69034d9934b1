"""Serve the report's textfile over HTTP at ``/metrics`` for a Prometheus to scrape.

The file is read on every request (the timer's runs replace it atomically),
so what is served is always one whole run.  A missing file is a 503, any
other path a 404.  Binds loopback unless told otherwise.
"""

from __future__ import annotations

import http.server
from pathlib import Path
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def make_server(textfile: str | Path, host: str = "127.0.0.1", port: int = 9477) -> http.server.ThreadingHTTPServer:
    """A server (not yet serving: call ``serve_forever``) for ``textfile``; port 0 picks a free one."""
    path = Path(textfile)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/metrics":
                self._send(404, b"only /metrics is served\n", "text/plain")
                return
            try:
                body = path.read_bytes()
            except OSError as e:
                self._send(503, f"{path}: {e.strerror} (no report run yet?)\n".encode(), "text/plain")
                return
            self._send(200, body, CONTENT_TYPE)

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass  # a scrape every 15 s is not news

    return http.server.ThreadingHTTPServer((host, port), Handler)
