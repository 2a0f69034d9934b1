"""The asyncio HTTP/SSE client against a scripted server: framing, keep-alive, errors, stalls."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable

from clusterctl.bench.http_sse import Client, _Chunked
from clusterctl.vllmclient import Endpoint, RequestResult


def _sse(obj: object) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def _tokens(n: int) -> list[bytes]:
    out = [_sse({"choices": [{"index": 0, "text": f" t{i}"}]}) for i in range(n)]
    out.append(_sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}))
    return out + [_sse(b"[DONE]")]


def _chunked(parts: list[bytes]) -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> dict[str, object] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
    return json.loads(await reader.readexactly(length))  # type: ignore[no-any-return]


def _serve(
    script: Script, bodies: list[Callable[[Client], Awaitable[RequestResult]]], timeout: float = 5.0
) -> tuple[list[RequestResult], int]:
    """Run ``script`` per connection and the client calls in order; (results, connections accepted)."""
    conns = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns[0] += 1
        try:
            await script(reader, writer)
        finally:
            writer.close()

    async def main() -> list[RequestResult]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = Client(Endpoint("127.0.0.1", port), timeout=timeout)
        try:
            return [await call(client) for call in bodies]
        finally:
            client.close()
            server.close()

    return asyncio.run(main()), conns[0]


def _ask(n: int = 4) -> Callable[[Client], Awaitable[RequestResult]]:
    return lambda c: c.stream({"prompt": "x", "max_tokens": n})


async def _stream_split(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Each response written in pieces cut at random bytes (chunk sizes, CRLFs and SSE lines split)."""
    rng = random.Random(3)
    while (req := await _read_request(reader)) is not None:
        data = OK_HEAD + _chunked(_tokens(int(req["max_tokens"])))  # type: ignore[call-overload]
        while data:
            cut = rng.randint(1, 9)
            writer.write(data[:cut])
            await writer.drain()
            data = data[cut:]
            await asyncio.sleep(0.001)


def test_chunked_sse_split_anywhere_is_timed_and_the_connection_kept() -> None:
    results, conns = _serve(_stream_split, [_ask(4), _ask(6), _ask(1)])
    assert [r.ok for r in results] == [True, True, True], [r.error for r in results]
    assert [r.output_tokens for r in results] == [4, 6, 1]
    assert [len(r.itl) for r in results] == [3, 5, 0]
    assert all(0 < r.ttft <= r.e2e for r in results)
    assert conns == 1  # keep-alive: one connection served all three


def test_chunked_decoder_any_split() -> None:
    body = _chunked([b"hello ", b"world", b"x" * 300])
    for seed in range(20):
        rng = random.Random(seed)
        dec, out, rest = _Chunked(), b"", body
        while rest:
            cut = rng.randint(1, 7)
            out += dec.feed(rest[:cut])
            rest = rest[cut:]
        assert out == b"hello world" + b"x" * 300 and dec.finished


async def _error_500(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    body = b'{"object":"error","message":"max_tokens is too large"}'
    writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    await _read_request(reader)


def test_http_error_is_a_failed_result_with_the_message() -> None:
    (r,), _ = _serve(_error_500, [_ask()])
    assert not r.ok and r.error.startswith("HTTP 400:") and "max_tokens is too large" in r.error


async def _cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    writer.write(OK_HEAD + _chunked(_tokens(3)[:2])[:-5])  # two tokens, then the connection drops
    await writer.drain()


def test_stream_without_done_fails() -> None:
    (r,), _ = _serve(_cut_short, [_ask()])
    assert not r.ok and r.error == "stream ended without [DONE]"
    assert r.ttft > 0  # the partial timings are kept


async def _stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    writer.write(OK_HEAD)
    await writer.drain()
    await asyncio.sleep(3)


def test_a_stalled_stream_times_out() -> None:
    (r,), _ = _serve(_stall, [_ask()], timeout=0.3)
    assert not r.ok and r.error.startswith("TimeoutError") and 0.25 < r.e2e < 2.0


async def _close_after_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers one request with a Content-Length body (no chunking) and closes without saying so."""
    req = await _read_request(reader)
    body = b"".join(_tokens(int(req["max_tokens"])))  # type: ignore[index, call-overload]
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()


def test_a_kept_connection_the_server_closed_is_replaced() -> None:
    results, conns = _serve(_close_after_each, [_ask(2), _ask(3)])
    assert [r.ok for r in results] == [True, True], [r.error for r in results]
    assert [r.output_tokens for r in results] == [2, 3] and conns == 2


def test_refused_connection_is_a_failed_result() -> None:
    from clusterctl.lab.vllm_sim.serve import free_port

    async def main() -> RequestResult:
        return await Client(Endpoint("127.0.0.1", free_port()), timeout=2).stream({"prompt": "x"})

    r = asyncio.run(main())
    assert not r.ok and "ConnectionRefused" in r.error
