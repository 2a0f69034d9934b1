"""Greedy completions with top-k logprobs from an OpenAI-compatible ``/v1/completions``.

Requests are non-streaming, ``temperature`` 0 with a fixed ``seed`` and
``logprobs=k``; an HTTP or network failure raises :class:`EndpointError` with
the URL and the server's message.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass, field
from typing import Any

from clusterctl.bench.loadgen import Endpoint, _headers
from clusterctl.errors import ClusterctlError


class EndpointError(ClusterctlError):
    """The endpoint could not be reached or answered with an error."""


@dataclass
class Output:
    """One greedy completion: text, tokens and, per position, the top-k ``{token: logprob}``."""

    text: str
    tokens: list[str]
    top: list[dict[str, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "tokens": self.tokens, "top": self.top}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Output":
        return cls(str(d["text"]), [str(t) for t in d["tokens"]],
                   [{str(k): float(v) for k, v in p.items()} for p in d.get("top", [])])


def _call(ep: Endpoint, method: str, path: str, body: dict[str, Any] | None, timeout: float) -> Any:
    conn = ep.connect(timeout)
    try:
        conn.request(method, ep.base_path + path, body=None if body is None else json.dumps(body).encode(),
                     headers=_headers(ep))
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            raise EndpointError(f"{ep.url}{path}: HTTP {resp.status}: {raw[:300].decode(errors='replace').strip()}")
        return json.loads(raw or b"null")
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise EndpointError(f"{ep.url}{path}: {type(e).__name__}: {e}") from None
    finally:
        conn.close()


def complete(ep: Endpoint, prompt: str, *, max_tokens: int, k: int, seed: int = 0, user: str | None = None,
             timeout: float = 60.0) -> Output:
    """One greedy completion with ``logprobs=k`` (``ignore_eos`` so lengths are comparable)."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": seed,
                            "logprobs": k, "ignore_eos": True}
    if user:
        body["user"] = user
    doc = _call(ep, "POST", "/v1/completions", body, timeout)
    try:
        choice = doc["choices"][0]
        lp = choice.get("logprobs") or {}
        return Output(choice.get("text") or "", list(lp.get("tokens") or []),
                      [dict(t or {}) for t in lp.get("top_logprobs") or []])
    except (KeyError, IndexError, TypeError) as e:
        raise EndpointError(f"{ep.url}/v1/completions: unexpected answer ({e})") from None


def environment(ep: Endpoint, timeout: float = 10.0) -> dict[str, Any]:
    """What the endpoint says of itself: served model, max_model_len, vLLM version (missing parts are None)."""
    env: dict[str, Any] = {"url": ep.url, "model": None, "max_model_len": None, "vllm_version": None}
    models = _call(ep, "GET", "/v1/models", None, timeout)
    data = (models or {}).get("data") or []
    if data:
        env["model"] = data[0].get("id")
        env["max_model_len"] = data[0].get("max_model_len")
    try:
        env["vllm_version"] = (_call(ep, "GET", "/version", None, timeout) or {}).get("version")
    except EndpointError:
        pass
    return env
