"""A strict parser of the Prometheus text exposition format (0.0.4), for tests.

Rejects what Prometheus would reject: samples before their TYPE, unknown types,
malformed label sets, duplicate series, non-float values, histogram buckets
that decrease or lack ``+Inf``, ``_count`` differing from the ``+Inf`` bucket.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(\{{(.*)\}})? (\S+)( -?\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class ParseError(ValueError):
    pass


def _labels(text: str, lineno: int) -> tuple[tuple[str, str], ...]:
    out, pos = [], 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise ParseError(f"line {lineno}: bad label set {{{text}}}")
        out.append((m[1], m[2]))
        pos = m.end()
    names = [k for k, _v in out]
    if len(set(names)) != len(names):
        raise ParseError(f"line {lineno}: duplicate label")
    return tuple(sorted(out))


def _family(name: str, types: dict[str, str]) -> str | None:
    if name in types:
        return name
    for suffix in ("_bucket", "_count", "_sum", "_total", "_created"):
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            return name[: -len(suffix)]
    return None


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``{sample name: {sorted label tuple: value}}``; raises :class:`ParseError`."""
    types: dict[str, str] = {}
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    if not text.endswith("\n"):
        raise ParseError("exposition must end with a newline")
    for n, line in enumerate(text.split("\n")[:-1], 1):
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] == "TYPE":
                if len(parts) != 4 or parts[3] not in TYPES or not re.fullmatch(_NAME, parts[2]):
                    raise ParseError(f"line {n}: bad TYPE line: {line}")
                if parts[2] in types:
                    raise ParseError(f"line {n}: second TYPE for {parts[2]}")
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ParseError(f"line {n}: not a sample: {line}")
        name, labels = m[1], _labels(m[3] or "", n)
        if _family(name, types) is None:
            raise ParseError(f"line {n}: sample {name} before its TYPE")
        try:
            value = float(m[4])
        except ValueError:
            raise ParseError(f"line {n}: value {m[4]!r} is not a float") from None
        if labels in samples[name]:
            raise ParseError(f"line {n}: duplicate series {name}{labels}")
        samples[name][labels] = value
    for fam, typ in types.items():
        if typ != "histogram":
            continue
        series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
        for labels, v in samples.get(f"{fam}_bucket", {}).items():
            le = dict(labels).get("le")
            if le is None:
                raise ParseError(f"{fam}_bucket without le")
            rest = tuple(kv for kv in labels if kv[0] != "le")
            series[rest].append((float(le), v))
        for rest, buckets in series.items():
            buckets.sort()
            counts = [c for _le, c in buckets]
            if counts != sorted(counts) or not math.isinf(buckets[-1][0]):
                raise ParseError(f"{fam}{rest}: buckets not cumulative or no +Inf")
            if samples.get(f"{fam}_count", {}).get(rest) != counts[-1]:
                raise ParseError(f"{fam}{rest}: _count differs from the +Inf bucket")
    return dict(samples)
