"""A minimal streaming ``/v1/completions`` server, to measure the load generator alone.

asyncio, one thread: each request is answered after TTFT_MS with the first
token, then one token every ITL_MS up to ``max_tokens``, as chunked SSE like
uvicorn's, then a usage chunk and ``[DONE]``.  Connections stay open
(keep-alive).  Its own TTFT for a request is taken from the arrival of the
request's first bytes to the moment the first token's bytes are handed to the socket, and served on ``/metrics`` as vLLM's
``vllm:time_to_first_token_seconds`` histogram (``_sum``/``_count``), so the
benchmark's client-minus-server TTFT is the generator's own share (connect,
send, and its scheduling until it reads the bytes) with no front end between.
Each token chunk carries ``"t"``, its write time on ``time.perf_counter``
(CLOCK_MONOTONIC, one clock for every process), so the benchmark can also
measure how late the generator reads each chunk.

Usage: python3 benchmarks/bench/sse_stub.py PORT [--ttft-ms 20] [--itl-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


class Stats:
    ttft_sum = 0.0
    ttft_count = 0


def _chunk(obj: object) -> bytes:
    data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()) + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Conn(asyncio.Protocol):
    def __init__(self, ttft: float, itl: float) -> None:
        self.ttft, self.itl, self.buf = ttft, itl, b""
        self.accepted = time.perf_counter()  # of the connection, then of each request's first bytes
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.buf:
            self.accepted = time.perf_counter()
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1")
        length = next(
            (int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.lower().startswith("content-length:")), 0
        )
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = b""
        if head.startswith("GET /metrics"):
            text = (
                f"vllm:time_to_first_token_seconds_sum {Stats.ttft_sum}\n"
                f"vllm:time_to_first_token_seconds_count {Stats.ttft_count}\n"
            ).encode()
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-length: "
                + str(len(text)).encode()
                + b"\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n"
                + text
            )
            self.transport.close()
            return
        asyncio.get_running_loop().create_task(self.stream(json.loads(body or b"{}")))

    async def stream(self, req: dict[str, object]) -> None:
        t = self.transport
        assert t is not None
        n = int(req.get("max_tokens") or 16)  # type: ignore[call-overload]
        t.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        start = time.perf_counter()
        for i in range(n):
            due = start + self.ttft + i * self.itl
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if t.is_closing():
                return
            # "t": when these bytes go to the socket (perf_counter, one clock for all processes)
            t.write(
                _chunk(
                    {"object": "text_completion", "choices": [{"index": 0, "text": " tok"}], "t": time.perf_counter()}
                )
            )
            if i == 0:
                Stats.ttft_sum += time.perf_counter() - self.accepted
                Stats.ttft_count += 1
        t.write(_chunk({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}))
        t.write(_chunk(b"[DONE]") + b"0\r\n\r\n")  # the connection stays open (keep-alive)


async def main(port: int, ttft: float, itl: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Conn(ttft, itl), "127.0.0.1", port, backlog=2048)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    a = ap.parse_args()
    asyncio.run(main(a.port, a.ttft_ms / 1000, a.itl_ms / 1000))
