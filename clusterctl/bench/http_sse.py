"""A minimal asyncio HTTP/1.1 client for one streamed (SSE) completion.

A :class:`Client` keeps one HTTP/1.1 connection alive across its requests
(as ``vllm bench serve``'s aiohttp session does), so a load generator can
open its streams' connections before the clock starts.
The response is parsed inside :meth:`asyncio.Protocol.data_received`, so each
SSE ``data:`` line is time-stamped (``time.perf_counter``) when the bytes that
complete it come off the socket, not when a coroutine gets round to it.
Bodies framed by ``Transfer-Encoding: chunked`` (uvicorn, the simulator),
``Content-Length`` or the connection's close are all understood.
"""

from __future__ import annotations

import asyncio
import ssl
import time

from clusterctl.vllmclient import (
    MAX_LINE,
    Endpoint,
    RequestResult,
    SseTimer,
    headers,
    stream_payload,
)


class _Chunked:
    """Incremental decoder of ``Transfer-Encoding: chunked`` (no trailers); ``finished`` once the last (0)
    chunk and its closing CRLF are in, so the connection is clean for the next response."""

    def __init__(self) -> None:
        self.buf = b""
        self.data_left = 0  # bytes of the current chunk's data still to come
        self.crlf_left = 0  # bytes of the CRLF after it
        self.last = False  # the 0-size chunk was seen
        self.finished = False

    def feed(self, data: bytes) -> bytes:
        self.buf += data
        out = []
        while self.buf and not self.finished:
            if self.data_left:
                take = self.buf[: self.data_left]
                out.append(take)
                self.data_left -= len(take)
                self.buf = self.buf[len(take) :]
            elif self.crlf_left:
                skip = min(self.crlf_left, len(self.buf))
                self.crlf_left -= skip
                self.buf = self.buf[skip:]
                self.finished = self.last and not self.crlf_left
            else:
                end = self.buf.find(b"\r\n", 0, 1024)
                if end < 0:
                    if len(self.buf) >= 1024:
                        raise ValueError("chunk-size line over 1 KiB")
                    break
                size = int(self.buf[:end].split(b";", 1)[0].strip() or b"0", 16)  # ValueError on garbage
                if size < 0:
                    raise ValueError("negative chunk size")
                self.buf = self.buf[end + 2 :]
                self.last = size == 0
                self.data_left, self.crlf_left = size, 2
        return b"".join(out)


class _SseProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection carrying one streamed response at a time.

    :meth:`begin` arms it for a request; the response resolves that request's
    future with its :class:`RequestResult`.  After a complete response the
    connection stays open for the next request unless the server said
    ``Connection: close``; after an error or a stall it is closed.
    """

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.draining = False
        self.idle_since = self.loop.time()
        self.done: asyncio.Future[RequestResult] | None = None

    def begin(self, t0: float, timeout: float, left: float) -> "asyncio.Future[RequestResult]":
        """Arm for a request sent at ``t0`` (perf_counter) that must be answered in full within ``left`` s
        (``timeout`` is the whole budget, for the message)."""
        self.t0, self.timeout = t0, timeout
        self.timer = SseTimer()
        self.head = b""
        self.status = 0
        self.keep_alive = True
        self.body: _Chunked | None = None
        self.length: int | None = None  # Content-Length when not chunked
        self.error_body = b""
        self.lines = b""
        self.watch = self.loop.call_later(max(0.0, left), self._expire)
        self.done = self.loop.create_future()
        self.draining = False
        self.ready: asyncio.Future[None] = self.loop.create_future()
        return self.done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter() - self.t0 if self.done is not None else 0.0
        try:
            if self.done is None:
                raise ValueError("data before any request")
            if self.done.done():
                self._drain(data)
                return
            self._feed(data, now)
        except ValueError as e:  # JSON or framing garbage
            self._finish(f"{type(e).__name__}: {e}")
            self._close()

    def _drain(self, data: bytes) -> None:
        """Bytes after ``[DONE]``: the end of the chunked body, before the connection can carry another request."""
        if not self.draining or self.body is None:
            raise ValueError("bytes after the response")
        self.body.feed(data)
        if self.body.finished:
            self._drained()

    def _drained(self) -> None:
        self.draining = False
        self.idle_since = self.loop.time()
        if not self.ready.done():
            self.ready.set_result(None)

    def _feed(self, data: bytes, now: float) -> None:
        if not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > 65536:
                    raise ValueError("response header over 64 KiB")
                return
            data = self.head[end + 4 :]
            self._parse_head(self.head[:end].decode("latin-1"))
        if self.body is not None:
            data = self.body.feed(data)
        elif self.length is not None:
            data = data[: self.length]
            self.length -= len(data)
        if self.status != 200:
            self.error_body = (self.error_body + data)[:300]
            if len(self.error_body) >= 300 or self._body_complete():
                self._finish(
                    f"HTTP {self.status}: {self.error_body.decode(errors='replace').strip()}",
                    reusable=self._body_complete(),
                )
            return
        self.lines += data
        chunks = self.timer.chunks
        while not self.timer.done:
            nl = self.lines.find(b"\n", 0, MAX_LINE + 1)
            if nl < 0:
                if len(self.lines) > MAX_LINE:
                    raise ValueError(f"SSE line over {MAX_LINE} bytes")
                break
            line, self.lines = self.lines[:nl], self.lines[nl + 1 :]
            if line.startswith(b"data:"):
                self.timer.data(line[5:].strip(), now)
        if self.timer.chunks > chunks:
            self.timer.res.reads += 1  # one more read (wake-up) that delivered content chunks
        if self.timer.done or self._body_complete():
            self._finish(None, reusable=True)

    def _parse_head(self, head: str) -> None:
        status_line, *fields = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP response: {status_line[:80]!r}")
        self.status = int(parts[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
        self.keep_alive = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.body = _Chunked()
        elif "content-length" in headers:
            self.length = int(headers["content-length"])
            if self.length < 0:
                raise ValueError(f"negative Content-Length {self.length}")
        else:
            self.keep_alive = False  # the body ends with the connection

    def _body_complete(self) -> bool:
        return (self.body is not None and self.body.finished) or self.length == 0

    def _finish(self, error: str | None, reusable: bool = False) -> None:
        """Resolve the request: with ``error``, a failed result.  The connection stays for the next request
        when ``reusable`` and the server keeps it alive (draining the body's end first if it is still to come)."""
        done = self.done
        if done is None or done.done():
            return
        self.watch.cancel()
        if error is not None:
            res = self.timer.res
            res.error = error
            res.e2e = time.perf_counter() - self.t0
        else:
            res = self.timer.finish()
        done.set_result(res)
        if not (reusable and self.keep_alive):
            self._close()
        elif self._body_complete():
            self._drained()
        else:
            self.draining = True

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _expire(self) -> None:
        self._finish(f"TimeoutError: no complete answer within {self.timeout:g} s")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.draining = False
        if self.done is None or self.done.done():
            return
        if not self.status:
            self._finish(f"{type(exc).__name__}: {exc}" if exc else "connection closed before a response")
        elif self.status != 200:
            self._finish(f"HTTP {self.status}: {self.error_body.decode(errors='replace').strip()}")
        else:
            self._finish(None)  # SseTimer.finish says whether [DONE] came


class Client:
    """Streamed completions over one keep-alive connection, one request at a time (a load-generator stream).

    :meth:`connect` may open the connection ahead (before a measurement starts);
    otherwise, or when the server closed it, a request connects first and its
    times include the connect.  A connection idle for more than ``max_idle`` s
    is replaced rather than risk the server closing it under a new request.
    """

    def __init__(
        self, ep: Endpoint, timeout: float = 60.0, ssl_context: ssl.SSLContext | None = None, max_idle: float = 2.0
    ) -> None:
        self.ep, self.timeout, self.max_idle = ep, timeout, max_idle
        self.ssl = (ssl_context or ssl.create_default_context()) if ep.https else None
        self.proto: _SseProtocol | None = None
        head = [f"POST {ep.base_path}/v1/completions HTTP/1.1", f"Host: {ep.host}:{ep.port}"]
        head += [f"{k}: {v}" for k, v in headers(ep).items()]
        self.head = "\r\n".join(head).encode("latin-1")

    async def _usable(self) -> bool:
        p = self.proto
        if p is not None and p.done is not None and p.draining:
            try:  # the body's last bytes are normally on their way
                await asyncio.wait_for(asyncio.shield(p.ready), 0.1)
            except asyncio.TimeoutError:
                p._close()
        return p is not None and not p.closed and p.loop.time() - p.idle_since < self.max_idle

    async def connect(self) -> str | None:
        """Open the connection (``timeout`` s at most) unless one is usable; the reason on failure, else None."""
        if await self._usable():
            return None
        return await self._open()

    async def _open(self, seconds: float | None = None) -> str | None:
        self.close()
        loop = asyncio.get_running_loop()
        limit = self.timeout if seconds is None else seconds
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(_SseProtocol, self.ep.host, self.ep.port, ssl=self.ssl), max(0.0, limit)
            )
        except (OSError, asyncio.TimeoutError) as e:
            name = "TimeoutError" if isinstance(e, asyncio.TimeoutError) else type(e).__name__
            return f"{name}: {e}" if str(e) else name
        self.proto = proto
        return None

    async def stream(self, body: dict[str, object]) -> RequestResult:
        """Send one streamed completion and time it (s from the send, before connecting when a connection
        is needed); ``timeout`` (s) bounds the whole request, connect included, however the server trickles
        its bytes.  Failures are a failed result."""
        payload = stream_payload(body)
        request = self.head + f"\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload
        reuse = await self._usable()
        t0 = time.perf_counter()
        end = t0 + self.timeout
        if not reuse:
            error = await self._open(end - t0)
            if error is not None:
                return RequestResult(ok=False, e2e=time.perf_counter() - t0, error=error)
        res = await self._send(request, t0, end)
        if reuse and not res.ok and self.proto is not None and not self.proto.status and time.perf_counter() < end:
            # The server closed the idle connection as the request went out (keep-alive race): nothing was
            # answered, so send it once more on a new connection; the time lost counts.
            error = await self._open(end - time.perf_counter())
            res = (
                RequestResult(ok=False, e2e=time.perf_counter() - t0, error=error)
                if error
                else await self._send(request, t0, end)
            )
        return res

    async def _send(self, request: bytes, t0: float, end: float) -> RequestResult:
        proto = self.proto
        assert proto is not None and proto.transport is not None
        done = proto.begin(t0, self.timeout, end - time.perf_counter())
        proto.transport.write(request)
        return await done

    def close(self) -> None:
        if self.proto is not None and self.proto.transport is not None:
            self.proto.transport.close()
        self.proto = None


async def stream_completion(
    ep: Endpoint, body: dict[str, object], timeout: float = 60.0, ssl_context: ssl.SSLContext | None = None
) -> RequestResult:
    """One streamed completion on a connection of its own (closed afterwards); see :meth:`Client.stream`."""
    client = Client(ep, timeout, ssl_context)
    try:
        return await client.stream(body)
    finally:
        client.close()
