"""Count a prompt in the served model's own tokens: a byte-level BPE ``tokenizer.json``, read with the stdlib.

The simulator runs on Debian's python3 without packages, so the ``tokenizers``
library is not there.  A model directory that carries a byte-level BPE
tokenizer (``model.type`` ``BPE`` with a ``ByteLevel`` pre-tokenizer, as GPT-2,
Llama 3, Qwen and the lab's tiny real model use) is encoded the way that
library does: the text split by the GPT-2 pattern, each piece's UTF-8 bytes
mapped to printable characters, then the merges applied lowest rank first.
The pattern's ``\\p{L}`` / ``\\p{N}`` classes are written with ``re``'s Unicode
classes (letters: ``[^\\W\\d_]``; numbers: ``\\d``), which is exact for ASCII text.
Special tokens and post-processors are not applied (a completion prompt of
the tiny model gets none: the real engine's ``usage.prompt_tokens`` is the
plain count).  Anything else (no file, another model type) gives ``None``: the
simulator keeps its word-ish tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

#: GPT-2's pre-tokenizer pattern with stdlib classes (letters [^\W\d_], numbers \d).
_PIECE = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+")


def _byte_chars() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable characters."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


_BYTES = _byte_chars()


class ByteLevelBPE:
    """``encode(text)``: the token strings of ``text``."""

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]]) -> None:
        self.vocab = vocab
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self._word = lru_cache(maxsize=65536)(self._bpe)

    def _bpe(self, word: str) -> tuple[str, ...]:
        parts = list(word)
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: self.ranks.get((parts[i], parts[i + 1]), 1 << 30))
            if (parts[best], parts[best + 1]) not in self.ranks:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        return tuple(parts)

    def encode(self, text: str) -> list[str]:
        out: list[str] = []
        for piece in _PIECE.findall(text):
            out.extend(self._word("".join(_BYTES[b] for b in piece.encode())))
        return out


def load(model_dir: str | Path) -> Callable[[str], list[str]] | None:
    """The encoder of ``model_dir/tokenizer.json`` when it is a byte-level BPE, else ``None``."""
    f = Path(model_dir) / "tokenizer.json"
    try:
        doc = json.loads(f.read_text())
        model, pre = doc.get("model") or {}, doc.get("pre_tokenizer") or {}
        if model.get("type") != "BPE" or pre.get("type") != "ByteLevel" or doc.get("normalizer"):
            return None
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]
        return ByteLevelBPE(dict(model["vocab"]), merges).encode  # type: ignore[arg-type]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
