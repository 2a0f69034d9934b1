"""Node sets in ClusterShell notation: ``gpu[001-004,007]``, ``r[1-2]n[01-03]``.

A pattern is a comma-separated list of terms; each term is text with zero or
more bracket groups.  A bracket group holds comma-separated items ``N``,
``N-M`` or ``N-M/STEP``.  An item whose first number has a leading zero keeps
that width (``[08-10]`` gives ``08 09 10``), so zero padding survives a round
trip.  Several bracket groups in one term form their cartesian product, the
last group varying fastest.

:func:`expand` turns a pattern into names, :func:`fold` is its inverse.
Both order names "naturally": text compared as text, digit runs compared as
numbers (``gpu2`` before ``gpu10``).
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Iterable

from clusterctl.errors import SelectionError

#: Most names one pattern may expand to; guards against ``n[1-999999999]``.
MAX_NAMES = 100_000

_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?:/(\d+))?)?$")
_DIGITS = re.compile(r"(\d+)")
_FORBIDDEN = set("[],")


class NodeSetError(SelectionError, ValueError):
    """A node-set pattern is malformed (the message says where)."""


def natural_key(name: str) -> tuple[tuple[int, str, int, int], ...]:
    """Sort key: digit runs compare by value, then by width (``1`` < ``01``)."""
    key = []
    for i, part in enumerate(_DIGITS.split(name)):
        if i % 2:
            key.append((1, "", int(part), len(part)))
        elif part:
            key.append((0, part, 0, 0))
    return tuple(key)


def split_top(pattern: str) -> list[str]:
    """Split on commas outside brackets; reject unbalanced brackets."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(pattern):
        if ch == "[":
            if depth:
                raise NodeSetError(f"{pattern!r}: nested '[' at position {i + 1}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise NodeSetError(f"{pattern!r}: ']' without '[' at position {i + 1}")
            depth = 0
        elif ch == "," and not depth:
            terms.append(pattern[start:i])
            start = i + 1
    if depth:
        raise NodeSetError(f"{pattern!r}: '[' is never closed")
    terms.append(pattern[start:])
    return terms


def _expand_bracket(body: str, pattern: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        m = _ITEM.match(item.strip())
        if not m:
            raise NodeSetError(f"{pattern!r}: bad range item {item!r} (expected N, N-M or N-M/STEP)")
        first, last, step = m.group(1), m.group(2), m.group(3)
        width = len(first) if first.startswith("0") and len(first) > 1 else 0
        lo = int(first)
        hi = int(last) if last is not None else lo
        stride = int(step) if step is not None else 1
        if hi < lo:
            raise NodeSetError(f"{pattern!r}: range {item!r} goes backwards")
        if stride < 1:
            raise NodeSetError(f"{pattern!r}: step must be at least 1 in {item!r}")
        if (hi - lo) // stride + 1 + len(out) > MAX_NAMES:
            raise NodeSetError(f"{pattern!r}: more than {MAX_NAMES} names")
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1, stride))
    return out


def _expand_term(term: str, pattern: str) -> list[str]:
    parts: list[list[str]] = []
    pos = 0
    for m in re.finditer(r"\[([^\]]*)\]", term):
        parts.append([term[pos : m.start()]])
        parts.append(_expand_bracket(m.group(1), pattern))
        pos = m.end()
    parts.append([term[pos:]])
    total = 1
    for p in parts:
        total *= len(p)
    if total > MAX_NAMES:
        raise NodeSetError(f"{pattern!r}: more than {MAX_NAMES} names")
    return ["".join(combo) for combo in itertools.product(*parts)]


def expand(pattern: str, *, sort: bool = True) -> list[str]:
    """Return the names a pattern denotes.

    With ``sort=True`` (the default) the result is a set: unique names in
    natural order.  With ``sort=False`` names come in pattern order and
    duplicates are kept, so a caller zipping two patterns (names with
    addresses) or looking for duplicates sees exactly what was written.
    Raises :class:`NodeSetError` for a malformed pattern or an empty term.
    """
    if not isinstance(pattern, str):
        raise NodeSetError(f"a node set must be a string, not {type(pattern).__name__}")
    names: list[str] = []
    for term in split_top(pattern.strip()):
        term = term.strip()
        if not term:
            raise NodeSetError(f"{pattern!r}: empty name")
        if any(c.isspace() for c in term):
            raise NodeSetError(f"{pattern!r}: whitespace inside a name")
        names.extend(_expand_term(term, pattern))
        if len(names) > MAX_NAMES:
            raise NodeSetError(f"{pattern!r}: more than {MAX_NAMES} names")
    if not sort:
        return names
    return sorted(set(names), key=natural_key)


# ---------------------------------------------------------------- folding


def _fold_numbers(values: Iterable[str]) -> str:
    """Fold digit strings into bracket items: ``01 02 03 07`` -> ``01-03,07``.

    A string with a leading zero fixes the width of its item; one without may
    join an item of a smaller or equal width (``08 09 10`` -> ``08-10``).
    """
    fixed = {len(v) for v in values if v.startswith("0") and len(v) > 1}
    by_width: dict[int, set[int]] = defaultdict(set)
    for v in values:
        if v.startswith("0") and len(v) > 1:
            width = len(v)
        else:
            width = max((w for w in fixed if w <= len(v)), default=0)
        by_width[width].add(int(v))
    items: list[tuple[int, int, int]] = []  # (start, end, width)
    for width, nums in by_width.items():
        ordered = sorted(nums)
        start = prev = ordered[0]
        for n in ordered[1:]:
            if n != prev + 1:
                items.append((start, prev, width))
                start = n
            prev = n
        items.append((start, prev, width))
    items.sort(key=lambda t: (t[0], t[2]))
    return ",".join(str(a).zfill(w) if a == b else f"{str(a).zfill(w)}-{str(b).zfill(w)}" for a, b, w in items)


def _fold_vectors(vectors: list[tuple[str, ...]]) -> list[list[str]]:
    """Fold same-shaped digit vectors into products of bracket bodies.

    The last dimension is folded first; vectors whose last dimension folds to
    the same body are then folded recursively on the remaining dimensions.
    """
    if not vectors[0]:
        return [[]]
    by_rest: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for v in vectors:
        by_rest[v[:-1]].append(v[-1])
    by_body: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for rest, lasts in by_rest.items():
        by_body[_fold_numbers(lasts)].append(rest)
    out = []
    for body, rests in by_body.items():
        for prefix in _fold_vectors(rests):
            out.append(prefix + [body])
    return out


def _render(texts: tuple[str, ...], bodies: list[str]) -> str:
    out = [texts[0]]
    for body, text in zip(bodies, texts[1:]):
        out.append(body if re.fullmatch(r"\d+", body) else f"[{body}]")
        out.append(text)
    return "".join(out)


def fold(names: Iterable[str]) -> str:
    """Return the shortest-ish pattern for a set of names (the inverse of expand).

    Names are grouped by their text between digit runs; within a group, runs
    of consecutive numbers become ranges and rectangular blocks become
    products (``r1n1 r1n2 r2n1 r2n2`` -> ``r[1-2]n[1-2]``).  Duplicates are
    ignored.  Raises :class:`NodeSetError` for a name containing ``[``, ``]``,
    ``,`` or whitespace, or an empty name.
    """
    groups: dict[tuple[str, ...], list[tuple[str, ...]]] = defaultdict(list)
    for name in set(names):
        if not isinstance(name, str) or not name:
            raise NodeSetError(f"cannot fold an empty or non-string name: {name!r}")
        if _FORBIDDEN & set(name) or any(c.isspace() for c in name):
            raise NodeSetError(f"cannot fold {name!r}: it contains '[', ']', ',' or whitespace")
        parts = _DIGITS.split(name)
        groups[tuple(parts[0::2])].append(tuple(parts[1::2]))
    terms = []
    for texts, vectors in groups.items():
        for bodies in _fold_vectors(vectors):
            first = [b.split(",")[0].split("-")[0] for b in bodies]
            terms.append((natural_key(_render(texts, first)), _render(texts, bodies)))
    terms.sort()
    return ",".join(t for _, t in terms)
