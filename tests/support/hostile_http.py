"""A hostile HTTP server on 127.0.0.1 for ``bench`` and ``drift``: each mode misbehaves one way.

``HostileServer(mode)`` serves every connection in a thread of its own
(daemon) with the same behaviour; ``/v1/models`` and ``/version`` are
answered normally except in the transport-level modes, so ``drift`` gets
as far as the completion.  Modes:

- ``headers_trickle``: the status line, then one header byte every 50 ms, for ever;
- ``header_flood``: one endless header line as fast as the socket takes it;
- ``sse_trickle``: good headers, then an SSE comment (keep-alive ping) every 50 ms, never a token;
- ``token_trickle``: good headers, then a token every 50 ms, for ever, never ``[DONE]``;
- ``endless_line``: good headers, then one ``data:`` line that never ends (64 KiB writes);
- ``chunk_size_flood``: a chunked body whose chunk-size line never ends;
- ``body_trickle``: a JSON answer whose ``Content-Length`` body comes a byte every 50 ms;
- ``body_flood``: a JSON answer of 10 GB announced, sent as fast as it is read;
- ``huge_usage``: a well-formed stream whose usage says ``completion_tokens: 1e308``;
- ``text_number``: completions whose ``text`` is a number (streamed and not);
- ``logprob_junk``: a non-streamed completion whose top logprobs hold a string and ``Infinity``.
"""

from __future__ import annotations

import json
import socket
import threading
import time

MODES = (
    "headers_trickle",
    "header_flood",
    "sse_trickle",
    "token_trickle",
    "endless_line",
    "chunk_size_flood",
    "body_trickle",
    "body_flood",
    "huge_usage",
    "text_number",
    "logprob_junk",
)
_SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _json(doc: object) -> bytes:
    body = json.dumps(doc).encode()
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class HostileServer:
    def __init__(self, mode: str) -> None:
        assert mode in MODES, mode
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()

    def __enter__(self) -> "HostileServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                while not self.stopped.is_set():
                    req = self._request(conn)
                    if req is None:
                        return
                    self._answer(conn, *req)
        except OSError:
            return  # the client gave up: what it should do

    def _request(self, conn: socket.socket) -> tuple[str, dict[str, object]] | None:
        data = b""
        while b"\r\n\r\n" not in data:
            part = conn.recv(65536)
            if not part:
                return None
            data += part
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(
            (int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.strip().lower() == "content-length"), 0
        )
        while len(body) < length:
            body += conn.recv(65536)
        return lines[0].split(" ")[1], json.loads(body) if body else {}

    def _trickle(self, conn: socket.socket, piece: bytes) -> None:
        while not self.stopped.is_set():
            conn.sendall(piece)
            time.sleep(0.05)

    def _flood(self, conn: socket.socket, piece: bytes) -> None:
        while not self.stopped.is_set():
            conn.sendall(piece)

    def _answer(self, conn: socket.socket, path: str, req: dict[str, object]) -> None:
        m = self.mode
        if m == "headers_trickle":
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            self._trickle(conn, b"a")
        elif m == "header_flood":
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Flood: ")
            self._flood(conn, b"a" * 65536)
        elif path == "/v1/models":
            conn.sendall(_json({"object": "list", "data": [{"id": "hostile", "max_model_len": 4096}]}))
        elif path == "/version":
            conn.sendall(_json({"version": "0.11.0"}))
        elif m == "body_trickle":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n")
            self._trickle(conn, b" ")
        elif m == "body_flood":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10000000000\r\n\r\n[")
            self._flood(conn, b"1," * 32768)
        elif not req.get("stream"):
            text: object = 12345 if m == "text_number" else " a b"
            top: list[dict[str, object]] = [{" a": -0.1}, {" b": -0.2}]
            if m == "logprob_junk":
                top = [{" a": "-0.1"}, {" b": float("inf")}]
            conn.sendall(
                _json(
                    {
                        "choices": [
                            {
                                "index": 0,
                                "text": text,
                                "logprobs": {"tokens": [" a", " b"], "top_logprobs": top, "text_offset": [0, 2]},
                            }
                        ],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
                    }
                )
            )
        elif m == "sse_trickle":
            conn.sendall(_SSE_HEAD)
            self._trickle(conn, _chunk(b": ping\n\n"))
        elif m == "token_trickle":
            conn.sendall(_SSE_HEAD)
            self._trickle(conn, _chunk(b'data: {"choices": [{"index": 0, "text": " a"}]}\n\n'))
        elif m == "endless_line":
            conn.sendall(_SSE_HEAD + _chunk(b"data: "))
            self._flood(conn, _chunk(b"a" * 65536))
        elif m == "chunk_size_flood":
            conn.sendall(_SSE_HEAD)
            self._flood(conn, b"0" * 65536)
        else:  # huge_usage, text_number, logprob_junk: a well-framed stream with bad contents
            text = 12345 if m == "text_number" else " a"
            chunks = [{"choices": [{"index": 0, "text": text}]}] * 3
            usage = {"prompt_tokens": 3, "completion_tokens": 1e308 if m == "huge_usage" else 3}
            body = b"".join(_chunk(b"data: " + json.dumps(c).encode() + b"\n\n") for c in chunks)
            body += _chunk(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
            conn.sendall(_SSE_HEAD + body + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
