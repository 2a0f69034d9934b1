"""The shared client of a vLLM (OpenAI-compatible) server: endpoint, headers, one streamed completion.

Bench, drift, report and the deploy release gates all talk to vLLM through this
module (``http.client``, standard library only).  :func:`stream_completion`
sends one ``/v1/completions`` request with ``stream: true`` and
``stream_options.include_usage`` and time-stamps every SSE ``data:`` line as it
arrives (``time.perf_counter``; the send time is taken before connecting, as
``vllm bench serve`` does).  A request that fails (refused, HTTP error,
timeout, stream without ``[DONE]``) is a failed :class:`RequestResult` with the
reason, never an exception.  The API key goes into a header only, never into
a URL or a log.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import random
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from clusterctl.errors import ClusterctlError

#: Words the simulator (and real BPE tokenizers) count as one token each.
WORDS = (
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "dog",
    "ran",
    "far",
    "sun",
    "sea",
    "red",
    "blue",
    "tree",
    "house",
    "river",
    "stone",
    "light",
    "cloud",
    "green",
    "small",
    "big",
    "old",
    "new",
    "road",
    "hill",
)


@dataclass
class RequestResult:
    """One request's outcome; times in seconds relative to its send time."""

    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    input_tokens: int = 0
    error: str = ""
    #: Socket reads (event-loop wake-ups) that delivered content chunks; 0 when not counted (threads).
    reads: int = 0

    @property
    def chunks(self) -> int:
        """Content chunks received (ITL gaps + 1 once the first came)."""
        return len(self.itl) + (1 if self.ok or self.ttft else 0)

    @property
    def tpot(self) -> float | None:
        """Time per output token excluding the first, or None for <= 1 token."""
        if self.output_tokens <= 1:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


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
    return " ".join(rng.choice(WORDS) for _ in range(max(1, input_len)))


def headers(ep: Endpoint) -> dict[str, str]:
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
            conn.request("POST", ep.base_path + "/v1/completions", body=payload, headers=headers(ep))
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
