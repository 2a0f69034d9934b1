"""Closed-loop streaming load generator for ``/v1/completions`` (threads + http.client).

Each of ``concurrency`` worker threads sends one request at a time over its own
connection with ``stream: true`` and ``stream_options.include_usage``, and
time-stamps every SSE ``data:`` line as it arrives (``time.perf_counter``):
the send time is taken before connecting, as ``vllm bench serve`` does.  A
request that fails (refused, HTTP error, timeout, stream without ``[DONE]``)
is a failed result with the reason, never an exception.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import threading
import time
import urllib.parse
from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass, field

from clusterctl.bench.stats import RequestResult
from clusterctl.errors import ClusterctlError

#: Words the simulator (and real BPE tokenizers) count as one token each.
_WORDS = ("the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "sun", "sea", "red", "blue", "tree",
          "house", "river", "stone", "light", "cloud", "green", "small", "big", "old", "new", "road", "hill")


@dataclass(frozen=True)
class Endpoint:
    """A parsed base URL (``http://host:port``); requests go to ``/v1/completions`` under it."""

    host: str
    port: int
    base_path: str = ""
    https: bool = False
    #: Bearer token for ``/v1`` routes (from the inventory's secrets or the environment); never printed.
    api_key: str | None = field(default=None, repr=False, compare=False)

    def with_key(self, api_key: str | None) -> "Endpoint":
        return dataclasses.replace(self, api_key=api_key)

    @classmethod
    def parse(cls, url: str) -> "Endpoint":
        u = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ClusterctlError(f"{url!r}: not an endpoint URL (expected http://HOST:PORT)")
        try:
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError as e:
            raise ClusterctlError(f"{url!r}: bad port ({e})") from None
        path = u.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[:-3]
        return cls(u.hostname, port, path, u.scheme == "https")

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout)

    @property
    def url(self) -> str:
        return f"{'https' if self.https else 'http'}://{self.host}:{self.port}{self.base_path}"


def synthetic_prompt(input_len: int, rng: random.Random) -> str:
    """``input_len`` space-separated common words (one token each for the simulator)."""
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, input_len)))


def _headers(ep: Endpoint) -> dict[str, str]:
    """Request headers; the API key is the endpoint's, else ``$VLLM_API_KEY`` / ``$OPENAI_API_KEY``."""
    h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    key = ep.api_key or os.environ.get("VLLM_API_KEY") or os.environ.get("OPENAI_API_KEY")
    if key:
        h["Authorization"] = f"Bearer {key}"
    return h


#: Longest SSE line (bytes) a response may send: a completion chunk is a few hundred bytes, top-20 logprobs a few KiB.
MAX_LINE = 1 << 20
#: Largest token count a server may report in ``usage`` (vLLM's context lengths are far below).
MAX_TOKENS = 1 << 31


def count_field(doc: dict[str, object], key: str) -> int:
    """``doc[key]`` as a token count: a whole number from 0 to :data:`MAX_TOKENS`, 0 when absent or null;
    raises ValueError naming the field otherwise (``1e308``, ``"12"``, ``true``, ``-1``)."""
    v = doc.get(key)
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKENS:
        raise ValueError(f"usage.{key} is not a token count: {str(v)[:40]!r}")
    return v


class SseTimer:
    """Turns the SSE ``data:`` payloads of one streamed completion, each with its arrival time (s since the
    send), into a :class:`RequestResult` with ``vllm bench serve``'s definitions: every chunk with a
    non-empty ``choices`` list is a content chunk (its text may be empty: special and byte-fallback tokens);
    TTFT is the first one's time, ITL the gaps between them, E2E the last one's time."""

    def __init__(self) -> None:
        self.res = RequestResult(ok=False)
        self.chunks = 0
        self.last = 0.0
        self.done = False

    def data(self, payload: bytes, now: float) -> bool:
        """One ``data:`` payload; True at ``[DONE]``.  Raises ValueError on a payload that is not a completion
        chunk (not JSON, ``choices`` not a list of objects, ``text`` not a string, a bad ``usage`` count)."""
        if payload == b"[DONE]":
            self.done = True
            return True
        doc = json.loads(payload)
        if not isinstance(doc, dict):
            raise ValueError(f"SSE data is not a JSON object: {payload[:80]!r}")
        usage = doc.get("usage")
        res = self.res
        choices = doc.get("choices")
        if choices is not None and not isinstance(choices, list):
            raise ValueError(f"'choices' is not a list: {str(choices)[:40]!r}")
        if choices:
            first = choices[0]
            text = first.get("text") if isinstance(first, dict) else None
            if not isinstance(first, dict) or not (text is None or isinstance(text, str)):
                raise ValueError(f"a choice's 'text' is not a string: {str(first)[:60]!r}")
            if self.chunks == 0:
                res.ttft = now
            else:
                res.itl.append(now - self.last)
            self.last = now
            self.chunks += 1
        if usage is not None:  # the usage chunk (no choices); some servers put it on the last content chunk
            if not isinstance(usage, dict):
                raise ValueError(f"'usage' is not an object: {str(usage)[:40]!r}")
            res.output_tokens = count_field(usage, "completion_tokens")
            res.input_tokens = count_field(usage, "prompt_tokens")
        return False

    def finish(self) -> RequestResult:
        """The result once the stream has ended: failed without ``[DONE]`` or without any content chunk
        (as vLLM's client); E2E is the last content chunk's time; output tokens from ``usage``, else the
        number of content chunks."""
        res = self.res
        res.e2e = self.last
        if not self.done:
            res.error = "stream ended without [DONE]"
            return res
        if not self.chunks:
            res.error = "no chunk with 'choices' before [DONE]"
            return res
        if not res.output_tokens:
            res.output_tokens = self.chunks
        res.ok = True
        return res


def stream_payload(body: dict[str, object]) -> bytes:
    """The JSON body of a streamed completion with usage in the last chunk."""
    return json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()


class Deadline:
    """A whole-request deadline for a blocking ``http.client`` connection: at ``seconds`` after entering,
    the socket is shut down from a timer thread, so a read blocked on a trickling server returns at once
    (each socket operation also times out on its own).  ``expired`` says whether it fired."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.conn, self.seconds = conn, seconds
        self.fired = threading.Event()
        self.left = threading.Event()
        self.timer = self._arm(seconds)

    def _arm(self, seconds: float) -> threading.Timer:
        t = threading.Timer(max(0.0, seconds), self._fire)
        t.daemon = True
        return t

    def _fire(self) -> None:
        self.fired.set()
        sock = self.conn.sock
        if sock is None:  # still connecting (its own timeout bounds that): shut it down once it exists
            if not self.left.is_set():
                self.timer = self._arm(0.05)
                self.timer.start()
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    @property
    def expired(self) -> bool:
        return self.fired.is_set()

    def __enter__(self) -> "Deadline":
        self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.left.set()
        self.timer.cancel()

    def error(self, e: BaseException) -> str:
        """The reason to report for ``e`` raised inside the deadline."""
        if self.expired:
            return f"TimeoutError: no complete answer within {self.seconds:g} s"
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def stream_completion(ep: Endpoint, body: dict[str, object], timeout: float = 60.0) -> RequestResult:
    """Send one streaming completion and time it; ``timeout`` (s) bounds the whole request (connect, headers,
    body), and no SSE line may be longer than :data:`MAX_LINE`."""
    payload = stream_payload(body)
    t0 = time.perf_counter()
    conn = ep.connect(timeout)
    timer = SseTimer()
    with Deadline(conn, timeout) as dl:
        try:
            conn.request("POST", ep.base_path + "/v1/completions", body=payload, headers=_headers(ep))
            resp = conn.getresponse()
            if resp.status != 200:
                timer.res.error = f"HTTP {resp.status}: {resp.read(300).decode(errors='replace').strip()}"
                return timer.res
            while True:
                line = resp.readline(MAX_LINE + 1)
                if not line or dl.expired:
                    break
                if len(line) > MAX_LINE:
                    raise ValueError(f"SSE line over {MAX_LINE} bytes")
                if line.startswith(b"data:") and timer.data(line[5:].strip(), time.perf_counter() - t0):
                    break
            if dl.expired:
                raise TimeoutError
            return timer.finish()
        except (OSError, http.client.HTTPException, ValueError) as e:
            timer.res.error = dl.error(e)
            timer.res.e2e = time.perf_counter() - t0
            return timer.res
        finally:
            conn.close()


@dataclass
class RunResult:
    """One concurrency level: per-request results, wall duration (s), the generator's CPU seconds and, for the
    asyncio generator, how late each of its event loop's periodic timers fired (s)."""

    concurrency: int
    results: list[RequestResult]
    duration: float
    cpu_s: float
    loop_lag: list[float] = field(default_factory=list)


def arrival_times(n: int, rate: float | None, seed: int = 0) -> list[float]:
    """Send offsets (s) of ``n`` requests: all at 0 when ``rate`` is None, else a Poisson process of
    ``rate`` requests/s (exponential gaps), as ``vllm bench serve --request-rate``."""
    if rate is None:
        return [0.0] * n
    if rate <= 0:
        raise ClusterctlError(f"request rate must be above 0, not {rate}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def run(ep: Endpoint, prompts: Sequence[str], concurrency: int, output_len: int, *,
        model: str | None = None, timeout: float = 60.0, ignore_eos: bool = True,
        request_rate: float | None = None, seed: int = 0) -> RunResult:
    """Send every prompt with at most ``concurrency`` in flight, each not before its Poisson arrival time
    when ``request_rate`` (req/s) is given; returns when all have finished or failed."""
    if concurrency < 1:
        raise ClusterctlError(f"concurrency must be at least 1, not {concurrency}")
    results: list[RequestResult] = []
    lock = threading.Lock()
    todo = iter(zip(arrival_times(len(prompts), request_rate, seed), prompts))
    start = [0.0]

    def worker() -> None:
        while True:
            with lock:
                item = next(todo, None)
            if item is None:
                return
            at, prompt = item
            delay = start[0] + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            body: dict[str, object] = {"prompt": prompt, "max_tokens": output_len, "temperature": 0,
                                       "ignore_eos": ignore_eos}
            if model:
                body["model"] = model
            r = stream_completion(ep, body, timeout)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, max(1, len(prompts))))]
    cpu0, t0 = time.process_time(), time.perf_counter()
    start[0] = t0
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return RunResult(concurrency, results, time.perf_counter() - t0, time.process_time() - cpu0)
