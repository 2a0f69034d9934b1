"""A TCP proxy on loopback that delays each direction by a fixed time.

Loopback hides round trips; this adds them back (the kernel here has no
netem).  Each chunk read from one side is written to the other side
``delay_s`` later, in order, so the added latency is per direction and
throughput is not capped.
"""

from __future__ import annotations

import asyncio
import threading


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def sender() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        try:
            writer.write_eof()
        except OSError:
            pass

    task = asyncio.create_task(sender())
    try:
        while True:
            data = await reader.read(65536)
            await queue.put((loop.time() + delay_s, data))
            if not data:
                break
        await task
    except (ConnectionError, OSError):
        task.cancel()
    finally:
        writer.close()


class DelayProxy:
    """Forward ``listen[i] -> target[i]`` (address pairs, port 22) with ``delay_ms`` each way."""

    def __init__(self, pairs: list[tuple[str, str]], delay_ms: float, port: int = 22):
        self.pairs = pairs
        self.delay_s = delay_ms / 1000.0
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._servers: list[asyncio.base_events.Server] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        for listen, target in self.pairs:

            async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter, target: str = target) -> None:
                try:
                    tr, tw = await asyncio.open_connection(target, self.port)
                except OSError:
                    w.close()
                    return
                try:
                    await asyncio.gather(_pipe(r, tw, self.delay_s), _pipe(tr, w, self.delay_s))
                except asyncio.CancelledError:  # the proxy is shutting down
                    pass

            self._servers.append(await asyncio.start_server(handle, listen, self.port, backlog=512))

    def __enter__(self) -> "DelayProxy":
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            for s in self._servers:
                s.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
