"""Greedy completions with top-k logprobs from an OpenAI-compatible ``/v1/completions``.

Requests are non-streaming, ``temperature`` 0 with a fixed ``seed``,
``logprobs=k`` and ``return_tokens_as_token_ids`` (vLLM then names every
token ``token_id:N``, so two tokens that decode to the same text are still
told apart, as vLLM's own ``check_logprobs_close`` compares ids).  Every
request is bounded as a whole by ``timeout`` seconds and its answer by
:data:`MAX_BODY` bytes; an answer that is not a completion (``text`` not a
string, a logprob that is not a finite number...) is an
:class:`EndpointError`, like an HTTP or network failure, with the URL.
"""

from __future__ import annotations

import http.client
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from clusterctl.errors import ClusterctlError
from clusterctl.vllmclient import Deadline, Endpoint, headers

#: Largest answer read (bytes): 2,000 tokens with top-20 logprobs are about 2 MB.
MAX_BODY = 16 << 20
_ID = re.compile(r"^token_id:(\d+)$")


class EndpointError(ClusterctlError):
    """The endpoint could not be reached, answered with an error, or its answer was not what vLLM sends
    (``status``: the HTTP status when it answered one, ``detail``: its error message)."""

    def __init__(self, message: str, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.status, self.detail = status, detail


#: vLLM's 400 for a prompt (plus max_tokens) longer than the context: "This model's maximum context
#: length is N tokens ..." (0.11, the simulator) or "... your prompt contains at least N input tokens" (0.32).
_TOO_LONG = re.compile(r"maximum context length|input tokens|max_model_len", re.I)


def too_long(e: EndpointError) -> bool:
    """The endpoint refused the request because it cannot fit its context (HTTP 400)."""
    return e.status == 400 and bool(_TOO_LONG.search(e.detail))


@dataclass
class Output:
    """One greedy completion: text, tokens and, per position, the top-k ``{token: logprob}``.

    With ``by_id`` the tokens (and top-k keys) are vLLM's ``token_id:N`` names and ``offsets`` the start of
    each token in ``text`` (to show a token's text); otherwise tokens are their decoded strings."""

    text: str
    tokens: list[str]
    top: list[dict[str, float]] = field(default_factory=list)
    by_id: bool = False
    offsets: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "tokens": self.tokens, "top": self.top, "by_id": self.by_id, "offsets": self.offsets}

    @classmethod
    def from_json(cls, d: Any) -> "Output":
        """Raises ValueError when ``d`` is not a recorded output (wrong types anywhere)."""
        if not isinstance(d, dict):
            raise ValueError("an item is not an object")
        return _output(
            d.get("text"), d.get("tokens"), d.get("top") or [], d.get("offsets") or [], bool(d.get("by_id", False))
        )

    def token_text(self, i: int) -> str:
        """What token ``i`` reads as: its string, or with ids its slice of ``text`` (the id when unknown)."""
        if not self.by_id:
            return self.tokens[i]
        if i < len(self.offsets):
            end = self.offsets[i + 1] if i + 1 < len(self.offsets) else len(self.text)
            return self.text[self.offsets[i] : end]
        return self.tokens[i]


def _output(text: Any, tokens: Any, top: Any, offsets: Any, by_id: bool) -> Output:
    if not isinstance(text, str):
        raise ValueError(f"'text' is not a string: {str(text)[:40]!r}")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ValueError("'tokens' is not a list of strings")
    if not isinstance(top, list):
        raise ValueError("'top_logprobs' is not a list")
    tops: list[dict[str, float]] = []
    for pos in top:
        if pos is None:
            tops.append({})
            continue
        if not isinstance(pos, dict):
            raise ValueError("a 'top_logprobs' entry is not an object")
        for k, v in pos.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"logprob of {k[:20]!r} is not a finite number: {str(v)[:20]!r}")
        tops.append({k: float(v) for k, v in pos.items()})
    if not isinstance(offsets, list) or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
        raise ValueError("'text_offset' is not a list of whole numbers")
    return Output(text, tokens, tops, by_id, offsets if by_id else [])


def _call(ep: Endpoint, method: str, path: str, body: dict[str, Any] | None, timeout: float) -> Any:
    """The JSON answer of one request, within ``timeout`` s as a whole and :data:`MAX_BODY` bytes."""
    conn = ep.connect(timeout)
    with Deadline(conn, timeout) as dl:
        try:
            conn.request(
                method,
                ep.base_path + path,
                body=None if body is None else json.dumps(body).encode(),
                headers=headers(ep),
            )
            resp = conn.getresponse()
            raw = resp.read(MAX_BODY + 1)
            if dl.expired:
                raise TimeoutError
            if len(raw) > MAX_BODY:
                raise EndpointError(f"{ep.url}{path}: answer over {MAX_BODY >> 20} MiB")
            if resp.status != 200:
                detail = raw[:300].decode(errors="replace").strip()
                try:
                    detail = str(json.loads(raw)["error"]["message"])[:300]
                except (ValueError, KeyError, TypeError, RecursionError):
                    pass
                raise EndpointError(f"{ep.url}{path}: HTTP {resp.status}: {detail}", resp.status, detail)
            return json.loads(raw or b"null")
        except (OSError, http.client.HTTPException, ValueError, RecursionError) as e:
            raise EndpointError(f"{ep.url}{path}: {dl.error(e)}") from None
        finally:
            conn.close()


def complete(
    ep: Endpoint,
    prompt: str,
    *,
    max_tokens: int,
    k: int,
    seed: int = 0,
    user: str | None = None,
    timeout: float = 60.0,
    token_ids: bool = True,
    model: str | None = None,
) -> Output:
    """One greedy completion with ``logprobs=k`` (``ignore_eos`` so lengths are comparable); with
    ``token_ids`` the tokens are ids when the server honours ``return_tokens_as_token_ids``.
    ``model``: the request's ``model`` (a gateway routes by it; vLLM alone defaults to its own)."""
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
        "logprobs": k,
        "ignore_eos": True,
    }
    if model:
        body["model"] = model
    if token_ids:
        body["return_tokens_as_token_ids"] = True
    if user:
        body["user"] = user
    doc = _call(ep, "POST", "/v1/completions", body, timeout)
    try:
        choices = doc["choices"] if isinstance(doc, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ValueError("no 'choices' list")
        choice = choices[0]
        lp = choice.get("logprobs") or {}
        if not isinstance(lp, dict):
            raise ValueError("'logprobs' is not an object")
        tokens = lp.get("tokens") or []
        by_id = token_ids and bool(tokens) and all(isinstance(t, str) and _ID.match(t) for t in tokens)
        text = choice.get("text")
        return _output(
            "" if text is None else text, tokens, lp.get("top_logprobs") or [], lp.get("text_offset") or [], by_id
        )
    except ValueError as e:
        raise EndpointError(f"{ep.url}/v1/completions: not a completion ({e})") from None


def served_models(ep: Endpoint, timeout: float = 10.0) -> list[str]:
    """The model ids ``/v1/models`` lists (a gateway lists every model it routes)."""
    doc = _call(ep, "GET", "/v1/models", None, timeout)
    data = doc.get("data") if isinstance(doc, dict) else None
    return [str(m["id"]) for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]


def environment(ep: Endpoint, timeout: float = 10.0) -> dict[str, Any]:
    """What the endpoint says of itself: served model, max_model_len, vLLM version (missing parts are None)."""
    env: dict[str, Any] = {"url": ep.url, "model": None, "max_model_len": None, "vllm_version": None}
    models = _call(ep, "GET", "/v1/models", None, timeout)
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        model, mml = data[0].get("id"), data[0].get("max_model_len")
        env["model"] = model if isinstance(model, str) else None
        env["max_model_len"] = mml if isinstance(mml, int) and not isinstance(mml, bool) else None
    try:
        version = _call(ep, "GET", "/version", None, timeout)
        v = version.get("version") if isinstance(version, dict) else None
        env["vllm_version"] = v if isinstance(v, str) else None
    except EndpointError:
        pass
    return env
