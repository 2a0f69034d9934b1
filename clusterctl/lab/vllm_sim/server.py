"""The OpenAI-compatible HTTP front end (stdlib ``http.server``), per emulated version.

Endpoints: ``/health`` (200, 503 once the engine is dead), ``/ping``, ``/version``,
``/load`` (with ``--enable-server-load-tracking``), ``/metrics``, ``/v1/models``,
``/v1/completions`` and ``/v1/chat/completions`` (JSON or SSE).  ``/v1``
paths need ``Authorization: Bearer <key>`` when API keys are set (401
``{"error":"Unauthorized"}``).  Generation goes through :class:`engine.Engine`.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

from . import bpe
from .engine import Engine, EngineDead, GenRequest, TokenEvent, token_id, tokenize
from .faults import FaultError, Faults, is_loopback
from .kvtransfer import SIM_RATE_KEY, KvConfig, Link, produced_params
from .logs import Log
from .metrics import Metrics
from .startup import EngineInfo

#: The paths whose requests reach the engine (an idle step engine waits for the ones being parsed).
GENERATE = ("/v1/completions", "/v1/chat/completions")
AUTH_PREFIXES = {"0.11": ("/v1", "/v2", "/inference"), "0.33": ("/v1", "/v2", "/inference", "/cohere")}
ROUTES = [
    ("/openapi.json", "HEAD, GET"),
    ("/docs", "HEAD, GET"),
    ("/health", "GET"),
    ("/load", "GET"),
    ("/ping", "POST"),
    ("/ping", "GET"),
    ("/tokenize", "POST"),
    ("/detokenize", "POST"),
    ("/v1/models", "GET"),
    ("/version", "GET"),
    ("/v1/responses", "POST"),
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/metrics", "GET"),
]


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


class App:
    """Everything a request handler needs; shared by the handler threads."""

    def __init__(
        self,
        info: EngineInfo,
        engine: Engine,
        metrics: Metrics,
        log: Log,
        *,
        api_keys: list[str],
        load_tracking: bool,
        access_log: bool,
        force_usage: bool,
    ) -> None:
        self.info, self.engine, self.metrics, self.log = info, engine, metrics, log
        self.api_keys = api_keys
        self.load_tracking = load_tracking
        self.access_log = access_log
        self.force_usage = force_usage
        self.full = {"0.11": "0.11.0", "0.33": "0.33.0"}[info.version]
        self.created = int(time.time())
        self.faults: Faults | None = None  # the fault control endpoint (/sim/fault), when set
        #: Prompts in the model's own tokens when its directory has a byte-level BPE tokenizer (bpe.py),
        #: else the simulator's word-ish tokens.
        self.tokenize = bpe.load(info.model) or tokenize
        # Disaggregation (kvtransfer.py): set by serve() when --kv-transfer-config is given.
        self.kv: KvConfig | None = None
        self.link: Link | None = None
        self.kv_host, self.kv_side_port, self.kv_bytes_per_token, self.scale = "localhost", 5600, 0.0, 0.0

    # ---- prefill/decode disaggregation
    def kv_pull(self, body: dict[str, Any], req: GenRequest) -> None:
        """A decode instance asked to take over a remote prefill: pull its KV first (waiting the
        transfer out), or fail as vLLM's default ``kv_load_failure_policy`` does."""
        kvp = body.get("kv_transfer_params")
        kv, link = self.kv, self.link
        if (
            kv is None
            or link is None
            or not isinstance(kvp, dict)
            or not kvp.get("do_remote_prefill")
            or not kv.consumes
        ):
            return
        nbytes = len(req.prompt_tokens) * self.kv_bytes_per_token
        local = link.state()
        remote = kvp.get(SIM_RATE_KEY)
        rate = min(local.bytes_per_s, float(remote)) if isinstance(remote, (int, float)) else local.bytes_per_s
        if rate <= 0 or not kvp.get("remote_engine_id"):
            self.metrics.add("vllm:nixl_num_failed_transfers")
            self.log.error(
                "EngineCore",
                "nixl_connector.py:1520",
                f"KV transfer from {kvp.get('remote_host')}:{kvp.get('remote_port')} failed: "
                f"{local.why or 'remote link down'}",
            )
            if kv.failure_policy == "fail":
                raise ApiError(500, "KV cache load failed (kv_load_failure_policy=fail)", "InternalServerError")
            return  # recompute: the prompt is prefilled here
        if self.scale > 0:
            secs = link.reserve(nbytes, rate, time.monotonic() / self.scale)
            time.sleep(secs * self.scale)
        else:
            secs = nbytes / rate
        self.metrics.observe("vllm:nixl_xfer_time_seconds", secs)
        self.metrics.observe("vllm:nixl_bytes_transferred", nbytes)
        req.remote_kv, req.kv_wait_s = True, secs

    def kv_params(self, body: dict[str, Any], req: GenRequest) -> dict[str, Any] | None:
        """What a prefill instance returns for the decode instance to pull (None otherwise)."""
        kvp = body.get("kv_transfer_params")
        kv, link = self.kv, self.link
        if (
            kv is None
            or link is None
            or not isinstance(kvp, dict)
            or not kvp.get("do_remote_decode")
            or not kv.produces
        ):
            return None
        blocks = -(-len(req.prompt_tokens) // max(1, self.info.block_size))
        return produced_params(
            kv, blocks=blocks, host=self.kv_host, port=self.kv_side_port, tp=self.info.tp, rate=link.state().bytes_per_s
        )

    # ---- request building
    def _check_model(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        if model is not None and model not in self.info.served_names:
            # 0.33 as the real 0.32 answers (entrypoints/serve/engine/serving.py): the names are listed.
            extra = "" if self.info.version == "0.11" else f" Valid aliases: {', '.join(self.info.served_names)}."
            raise ApiError(404, f"The model `{model}` does not exist.{extra}", "NotFoundError", "model")
        return self.info.served_names[0]

    def _context_check(self, n_prompt: int, max_tokens: int | None) -> int:
        mml = self.info.max_model_len
        v = self.info.version
        if n_prompt >= mml if max_tokens is None else n_prompt > mml:
            if v == "0.11":
                msg = (
                    f"This model's maximum context length is {mml} tokens. However, your request has "
                    f"{n_prompt} input tokens. Please reduce the length of the input messages."
                )
            else:  # the real 0.32 text (measured)
                # It tokenizes with truncation at max_model_len + 1, hence "at least".
                msg = (
                    f"This model's maximum context length is {mml} tokens. However, your prompt contains "
                    f"at least {mml + 1} input tokens, which exceeds this limit even without any output "
                    "tokens. Please reduce the length of the input prompt. "
                    f"(parameter=input_tokens, value={mml + 1})"
                )
                raise ApiError(400, msg, param="input_tokens")
            raise ApiError(400, msg)
        if max_tokens is None:
            return mml - n_prompt
        if v != "0.11" and max_tokens > mml:
            raise ApiError(
                400,
                f"max_tokens={max_tokens} cannot be greater than max_model_len={mml}. Please "
                f"request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
                param="max_tokens",
            )
        if max_tokens + n_prompt > mml:
            raise ApiError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                f"model's maximum context length is {mml} tokens and your request has "
                f"{n_prompt} input tokens ({max_tokens} > {mml} - {n_prompt}).",
            )
        return max_tokens

    def _common(self, body: dict[str, Any], prompt: str, max_tokens: int | None, logprobs: int | None) -> GenRequest:
        toks = self.tokenize(prompt)
        mt = self._context_check(len(toks), max_tokens)
        if logprobs is not None and (logprobs < 0 or logprobs > self.info.max_logprobs):
            raise ApiError(
                400,
                f"Requested sample logprobs of {logprobs}, which is greater than max allowed: {self.info.max_logprobs}"
                if logprobs > 0
                else "`logprobs` must be a positive value.",
            )
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        temp = body.get("temperature")
        temp = self.info.default_temperature if temp is None else float(temp)
        seed = body.get("seed")
        return GenRequest(
            prompt=prompt,
            prompt_tokens=toks,
            max_tokens=mt,
            temperature=temp,
            seed=None if seed is None else int(seed),
            stop=list(stop),
            logprobs=logprobs,
            ignore_eos=bool(body.get("ignore_eos", False)),
            session=str(body.get("user") or ""),
        )

    # ---- metrics around a request
    def _run(self, req: GenRequest) -> Iterator[TokenEvent]:
        if getattr(self.engine, "records_metrics", False):
            yield from self.engine.generate(req)
            return
        m = self.metrics
        t0 = time.monotonic()
        first = last = None
        n = 0
        reason = "abort"
        m.add("vllm:prompt_tokens", len(req.prompt_tokens))
        m.add("vllm:prefix_cache_queries", len(req.prompt_tokens))
        m.add("vllm:gpu_prefix_cache_queries", len(req.prompt_tokens))
        m.observe("vllm:iteration_tokens_total", len(req.prompt_tokens))
        try:
            for ev in self.engine.generate(req):
                now = time.monotonic()
                if first is None:
                    first = now
                    m.observe("vllm:time_to_first_token_seconds", now - t0)
                else:
                    m.observe("vllm:inter_token_latency_seconds", now - (last or now))
                    m.observe("vllm:time_per_output_token_seconds", now - (last or now))
                    m.observe("vllm:iteration_tokens_total", 1)
                last = now
                n += 1
                m.add("vllm:generation_tokens", 1)
                if ev.finish_reason:
                    reason = ev.finish_reason
                yield ev
        finally:
            end = time.monotonic()
            m.finished(reason)
            m.observe("vllm:request_prompt_tokens", len(req.prompt_tokens))
            m.observe("vllm:request_generation_tokens", n)
            m.observe("vllm:request_params_n", 1)
            m.observe("vllm:request_params_max_tokens", req.max_tokens)
            m.observe("vllm:request_max_num_generation_tokens", req.max_tokens)
            m.observe("vllm:e2e_request_latency_seconds", end - t0)
            m.observe("vllm:request_queue_time_seconds", 0.0)
            m.observe("vllm:request_inference_time_seconds", end - t0)
            m.observe("vllm:request_prefill_time_seconds", (first or end) - t0)
            m.observe("vllm:request_decode_time_seconds", end - (first or end))
            m.observe("vllm:request_num_preemptions", 0)
            if n > 1 and first is not None:
                m.observe("vllm:request_time_per_output_token_seconds", (end - first) / (n - 1))


def _completion_logprobs(evs: list[TokenEvent], offset: int, vocab: int = 0) -> dict[str, Any]:
    """vLLM's completion logprobs; with ``vocab`` (``return_tokens_as_token_ids``) tokens are ``token_id:N``."""

    def name(t: str) -> str:
        return f"token_id:{token_id(t, vocab)}" if vocab else t

    text_offset, out_lp, toks, tops = [], [], [], []
    for ev in evs:
        text_offset.append(offset)
        offset += len(ev.text)
        out_lp.append(max(ev.logprob, -9999.0))
        toks.append(name(ev.text))
        tops.append({name(t): max(lp, -9999.0) for t, lp in ev.top})
    return {"text_offset": text_offset, "token_logprobs": out_lp, "tokens": toks, "top_logprobs": tops}


def _chat_logprobs(evs: list[TokenEvent]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": ev.text,
                "logprob": max(ev.logprob, -9999.0),
                "bytes": list(ev.text.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": max(lp, -9999.0), "bytes": list(t.encode())} for t, lp in ev.top
                ],
            }
            for ev in evs
        ]
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # uvicorn's asyncio transports set TCP_NODELAY; without it Nagle holds each SSE chunk on a kept-alive
    # connection until the client's delayed ACK (20-40 ms added to TTFT and every ITL).
    disable_nagle_algorithm = True
    server_version = "uvicorn"
    sys_version = ""
    app: App  # set on the subclass

    def version_string(self) -> str:
        return "uvicorn"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass

    def _access(self, status: int) -> None:
        if self.app.access_log:
            phrase = self.responses.get(status, ("",))[0]
            self.app.log.uvicorn(
                f'{self.client_address[0]}:{self.client_address[1]} - "{self.command} '
                f'{self.path} {self.request_version}" {status} {phrase}'
            )
        handler = self.path.split("?")[0]
        if handler not in ("/metrics", "/health", "/load", "/ping", "/version"):
            self.app.metrics.http_request(handler, self.command, status)

    def _send(
        self, status: int, body: bytes, ctype: str = "application/json", extra: dict[str, str] | None = None
    ) -> None:
        self.send_response_only(status)
        self.send_header("date", self.date_time_string())
        self.send_header("server", "uvicorn")
        self.send_header("content-length", str(len(body)))
        self.send_header("content-type", ctype)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._access(status)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, separators=(",", ":")).encode())

    def _authorized(self) -> bool:
        keys = self.app.api_keys
        if not keys or self.command == "OPTIONS":
            return True
        path = self.path.split("?")[0]
        if not path.startswith(AUTH_PREFIXES[self.app.info.version]):
            return True
        return self.headers.get("Authorization", "") in {f"Bearer {k}" for k in keys}

    def _body(self) -> dict[str, Any]:
        raw = self._raw
        try:
            body = json.loads(raw or b"null")
        except ValueError as e:
            raise ApiError(400, f"JSON decode error: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "Input should be a valid dictionary or object to extract fields from")
        return body

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?")[0]
        app = self.app
        # Read the whole body first, so an early answer (401, 404) leaves the connection usable.
        self._streaming = False
        n = int(self.headers.get("Content-Length") or 0)
        self._raw = self.rfile.read(n) if n > 0 else b""
        arrive = getattr(app.engine, "arrive", None) if method == "POST" and path in GENERATE else None
        if arrive is not None:
            arrive()
        try:
            if not self._authorized():
                self._json(401, {"error": "Unauthorized"})
                return
            if path in ("/health", "/ping") and (method in ("GET", "HEAD") or path == "/ping"):
                self._send(503 if app.engine.is_dead() else 200, b"")
            elif path == "/version" and method == "GET":
                self._json(200, {"version": app.full})
            elif path == "/load" and method == "GET" and app.load_tracking:
                self._json(200, {"server_load": app.engine.stats().running})
            elif path == "/metrics" and method == "GET":
                st = app.engine.stats()
                app.metrics.set_gauge("vllm:num_requests_running", st.running)
                app.metrics.set_gauge("vllm:num_requests_waiting", st.waiting)
                app.metrics.set_gauge("vllm:kv_cache_usage_perc", st.kv_usage)
                # The step engine observes request metrics on its simulated clock (as at 1x): say by how much
                # that clock is scaled, so a client comparing them with wall times can (bench's trust check).
                scale = getattr(app.engine, "scale", None) if getattr(app.engine, "records_metrics", False) else None
                self._send(
                    200,
                    app.metrics.render().encode(),
                    "text/plain; version=0.0.4; charset=utf-8",
                    None if scale is None else {"x-sim-time-scale": f"{scale:g}"},
                )
            elif path == "/sim/fault" and app.faults is not None:
                self._fault(method)
            elif path == "/v1/models" and method == "GET":
                self._json(200, self._models())
            elif path == "/v1/completions" and method == "POST":
                self._completions(self._body())
            elif path == "/v1/chat/completions" and method == "POST":
                self._chat(self._body())
            elif path == "/tokenize" and method == "POST":
                self._tokenize(self._body())
            elif path in {r for r, _m in ROUTES}:
                self._json(405, {"detail": "Method Not Allowed"})
            else:
                self._json(404, {"detail": "Not Found"})
        except ApiError as e:
            self._json(e.status, e.body())
        except EngineDead:
            if getattr(self, "_streaming", False):
                self.close_connection = True  # the stream just ends, without [DONE]
            else:
                self._json(
                    500,
                    ApiError(
                        500, "The server had an error while processing your request.", "InternalServerError"
                    ).body(),
                )
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            if arrive is not None:
                app.engine.arrived()  # type: ignore[attr-defined]

    def _fault(self, method: str) -> None:
        """The simulator's fault control (faults.py); loopback clients only."""
        faults = self.app.faults
        assert faults is not None
        if not is_loopback(self.client_address[0]):
            self._json(403, {"error": "fault control is only accepted from loopback"})
            return
        if method == "POST":
            try:
                body = json.loads(self._raw or b"null")
                msg = faults.apply(body, max(1, self.app.info.tp))
            except (ValueError, FaultError) as e:
                self._json(400, {"error": str(e)})
                return
            if msg:
                self.app.log.error("APIServer", "multiproc_executor.py:153", msg)
        elif method != "GET":
            self._json(405, {"detail": "Method Not Allowed"})
            return
        self._json(200, faults.state())

    def _models(self) -> dict[str, Any]:
        app = self.app
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": app.created,
                    "owned_by": "vllm",
                    "root": app.info.model,
                    "parent": None,
                    "max_model_len": app.info.max_model_len,
                    "permission": [
                        {
                            "id": f"modelperm-{uuid.uuid4().hex}",
                            "object": "model_permission",
                            "created": app.created,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
                for name in app.info.served_names
            ],
        }

    def _dead_check(self) -> None:
        if self.app.engine.is_dead():
            raise ApiError(500, "The server had an error while processing your request.", "InternalServerError")

    # ---- SSE
    def _sse_start(self) -> None:
        self._streaming = True
        self.send_response_only(200)
        self.send_header("date", self.date_time_string())
        self.send_header("server", "uvicorn")
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _sse(self, obj: Any) -> None:
        data = (
            b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()) + b"\n\n"
        )
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _sse_end(self) -> None:
        self._sse(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self._access(200)

    def _include_usage(self, body: dict[str, Any]) -> bool:
        so = body.get("stream_options") or {}
        return bool(so.get("include_usage")) or self.app.force_usage

    # ---- /tokenize (vLLM's answer: count, max_model_len, token ids; token_strs only when asked)
    def _tokenize(self, body: dict[str, Any]) -> None:
        self.app._check_model(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ApiError(400, "prompt: Input should be a valid string")
        toks = self.app.tokenize(prompt)
        vocab = self.app.info.vocab
        self._json(
            200,
            {
                "count": len(toks),
                "max_model_len": self.app.info.max_model_len,
                "tokens": [token_id(t, vocab) for t in toks],
                "token_strs": toks if body.get("return_token_strs") else None,
            },
        )

    # ---- /v1/completions
    def _completions(self, body: dict[str, Any]) -> None:
        app = self.app
        model = app._check_model(body)
        self._dead_check()
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            prompt = "".join(f" t{x}" for x in prompt)
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError(400, "Either prompt or prompt_embeds must be provided and non-empty.")
        lp = body.get("logprobs")
        req = app._common(
            body,
            prompt,
            int(body.get("max_tokens", 16)) if body.get("max_tokens") is not None else 16,
            None if lp is None else int(lp),
        )
        app.kv_pull(body, req)
        rid = f"cmpl-{self.headers.get('X-Request-Id') or uuid.uuid4().hex}"
        created = int(time.time())
        v011 = app.info.version == "0.11"
        as_ids = app.info.vocab if body.get("return_tokens_as_token_ids") else 0
        if body.get("stream"):
            self._sse_start()
            offset, n = 0, 0
            for ev in app._run(req):
                choice: dict[str, Any] = {
                    "index": 0,
                    "text": ev.text,
                    "logprobs": _completion_logprobs([ev], offset, as_ids) if req.logprobs is not None else None,
                    "finish_reason": ev.finish_reason,
                    "stop_reason": ev.stop_reason,
                }
                if v011:
                    choice["prompt_token_ids"] = (
                        [token_id(t, app.info.vocab) for t in req.prompt_tokens] if n == 0 else None
                    )
                else:  # 0.32 (measured): both present, null unless return_token_ids is asked for
                    choice["prompt_token_ids"] = None
                choice["token_ids"] = None
                chunk: dict[str, Any] = {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [choice],
                }
                if v011:
                    chunk["usage"] = None
                self._sse(chunk)
                offset += len(ev.text)
                n += 1
            if self._include_usage(body):
                p = len(req.prompt_tokens)
                self._sse(
                    {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": {"prompt_tokens": p, "total_tokens": p + n, "completion_tokens": n},
                    }
                )
            self._sse_end()
            return
        evs = list(app._run(req))
        text = "".join(e.text for e in evs)
        last = evs[-1] if evs else None
        p = len(req.prompt_tokens)
        self._json(
            200,
            {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": _completion_logprobs(evs, 0, as_ids) if req.logprobs is not None else None,
                        "finish_reason": last.finish_reason if last else "length",
                        "stop_reason": last.stop_reason if last else None,
                        "prompt_logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": p,
                    "total_tokens": p + len(evs),
                    "completion_tokens": len(evs),
                    "prompt_tokens_details": None,
                },
                "kv_transfer_params": app.kv_params(body, req),
            },
        )

    # ---- /v1/chat/completions
    def _chat(self, body: dict[str, Any]) -> None:
        app = self.app
        model = app._check_model(body)
        self._dead_check()
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "messages: Field required" if msgs is None else "messages must be a non-empty list")
        prompt = ""
        for m in msgs:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            prompt += (
                f"<|im_start|>{m.get('role', 'user') if isinstance(m, dict) else 'user'}\n{content or ''}<|im_end|>\n"
            )
        prompt += "<|im_start|>assistant\n"
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        lp = int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
        req = app._common(body, prompt, None if mt is None else int(mt), lp)
        app.kv_pull(body, req)
        rid = f"chatcmpl-{self.headers.get('X-Request-Id') or uuid.uuid4().hex}"
        created = int(time.time())
        if body.get("stream"):
            self._sse_start()
            base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
            first: dict[str, Any] = {
                **base,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                ],
            }
            if app.info.version != "0.11":  # 0.32 (measured): prompt fields on the first chunk
                first.update(prompt_token_ids=None, prompt_text=None)
            self._sse(first)
            n = 0
            for ev in app._run(req):
                choice: dict[str, Any] = {
                    "index": 0,
                    "delta": {"content": ev.text},
                    "logprobs": _chat_logprobs([ev]) if lp is not None else None,
                    "finish_reason": ev.finish_reason,
                }
                if ev.finish_reason:
                    choice["stop_reason"] = ev.stop_reason
                if app.info.version != "0.11":
                    choice["token_ids"] = None
                self._sse({**base, "choices": [choice]})
                n += 1
            if self._include_usage(body):
                p = len(req.prompt_tokens)
                self._sse(
                    {
                        **base,
                        "choices": [],
                        "usage": {"prompt_tokens": p, "total_tokens": p + n, "completion_tokens": n},
                    }
                )
            self._sse_end()
            return
        evs = list(app._run(req))
        last = evs[-1] if evs else None
        p = len(req.prompt_tokens)
        self._json(
            200,
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "reasoning_content": None,
                            "content": "".join(e.text for e in evs),
                            "tool_calls": [],
                        },
                        "logprobs": _chat_logprobs(evs) if lp is not None else None,
                        "finish_reason": last.finish_reason if last else "length",
                        "stop_reason": last.stop_reason if last else None,
                    }
                ],
                "usage": {
                    "prompt_tokens": p,
                    "total_tokens": p + len(evs),
                    "completion_tokens": len(evs),
                    "prompt_tokens_details": None,
                },
                "prompt_logprobs": None,
                "kv_transfer_params": app.kv_params(body, req),
            },
        )


class Server(ThreadingHTTPServer):
    """An HTTP server on a socket bound early (SO_REUSEADDR + SO_REUSEPORT) and listened on late."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # uvicorn's backlog 2048; socketserver's 5 drops bursts of connections

    def __init__(self, host: str, port: int) -> None:
        super().__init__((host, port), Handler, bind_and_activate=False)

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()


def make_handler(app: App) -> type[Handler]:
    return type("BoundHandler", (Handler,), {"app": app})
