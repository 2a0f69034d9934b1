"""Prompts of a given length in tokens, counted by the model's own tokenizer.

Where the count comes from, best first:

- a local tokenizer (``--tokenizer PATH``: a model directory or its
  ``tokenizer.json``), read with the ``tokenizers`` package;
- the endpoint's ``POST /tokenize`` (vLLM's: ``{"prompt": ...}`` in,
  ``{"count": N, "tokens": [...]}`` out; counted with the special tokens a
  completion request adds, as vLLM's default);
- none: prompts of that many words, with a warning (a word is one token for
  the simulator, often two or more for a real BPE vocabulary).

A prompt is built from the synthetic words until the tokenizer's count is the
target: a first guess from the vocabulary's tokens per word, then a few
corrections, then word by word; the last word may leave it one or two tokens
short where no word fits (the count recorded is the real one).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clusterctl.errors import ClusterctlError
from clusterctl.vllmclient import WORDS, Deadline, Endpoint, headers

Counter = Callable[[str], int]


@dataclass
class Tokenizer:
    """``count(text)`` in the model's tokens; ``source`` says whose (for the report)."""

    count: Counter
    source: str


def local(path: str | Path) -> Tokenizer:
    """The tokenizer of a model directory (its ``tokenizer.json``) or of that file; ClusterctlError when it cannot
    be read or the ``tokenizers`` package is missing."""
    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    try:
        from tokenizers import (
            Tokenizer as HfTokenizer,  # optional: pip install tokenizers
        )
    except ImportError:
        raise ClusterctlError(
            f"--tokenizer {path}: reading a local tokenizer needs the 'tokenizers' package "
            "(pip install tokenizers); without --tokenizer the endpoint's /tokenize is used"
        ) from None
    if not f.is_file():
        raise ClusterctlError(f"--tokenizer {path}: no tokenizer.json there")
    try:
        tok = HfTokenizer.from_file(str(f))
    except Exception as e:  # noqa: BLE001 - the Rust library raises its own exception type
        raise ClusterctlError(f"--tokenizer {f}: not a tokenizer ({e})") from None
    return Tokenizer(lambda text: len(tok.encode(text, add_special_tokens=True).ids), f"local {f}")


def endpoint(ep: Endpoint, model: str | None, timeout: float = 10.0) -> Tokenizer | None:
    """The endpoint's ``/tokenize`` when it answers a probe with a token count, else None."""

    def count(text: str) -> int:
        body: dict[str, object] = {"prompt": text}
        if model:
            body["model"] = model
        conn = ep.connect(timeout)
        with Deadline(conn, timeout) as dl:
            try:
                conn.request("POST", ep.base_path + "/tokenize", body=json.dumps(body).encode(), headers=headers(ep))
                resp = conn.getresponse()
                raw = resp.read(1 << 20)
                if resp.status != 200:
                    raise ClusterctlError(f"{ep.url}/tokenize: HTTP {resp.status}")
                doc = json.loads(raw)
            except (OSError, ValueError) as e:
                raise ClusterctlError(f"{ep.url}/tokenize: {dl.error(e)}") from None
            except Exception as e:  # noqa: BLE001 - http.client's own errors
                raise ClusterctlError(f"{ep.url}/tokenize: {dl.error(e)}") from None
            finally:
                conn.close()
        n = doc.get("count") if isinstance(doc, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ClusterctlError(f"{ep.url}/tokenize: no token count in the answer")
        return n

    try:
        count("the cat sat")
    except ClusterctlError:
        return None
    return Tokenizer(count, f"endpoint {ep.url}/tokenize")


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: int | None  # by the tokenizer; None without one
    words: int


def build(target: int, rng: random.Random, tok: Tokenizer | None) -> Prompt:
    """A prompt of ``target`` tokens by ``tok`` (of ``target`` words without one)."""
    target = max(1, target)
    if tok is None:
        words = [rng.choice(WORDS) for _ in range(target)]
        return Prompt(" ".join(words), None, target)
    pool = [rng.choice(WORDS) for _ in range(4 * target + 8)]

    def n_of(w: int) -> int:
        return tok.count(" ".join(pool[:w]))

    w = target
    n = n_of(w)
    for _ in range(4):  # proportional corrections
        if n == target:
            break
        w2 = max(1, min(len(pool), round(w * target / max(n, 1))))
        if w2 == w:
            break
        w, n = w2, n_of(w2)
    while n > target and w > 1:  # then word by word, ending at or just under the target
        w, n = w - 1, n_of(w - 1)
    while w < len(pool):
        n2 = n_of(w + 1)
        if n2 > target:
            break
        w, n = w + 1, n2
    return Prompt(" ".join(pool[:w]), n, w)
