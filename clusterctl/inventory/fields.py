"""Typed reads from located YAML, collecting problems instead of raising.

Each reader takes a :class:`~clusterctl.inventory.yamlnodes.Y` and returns
the converted value, or ``None`` after recording a ``file:line`` problem, so
the loader can keep going and report everything at once.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Iterable
from typing import Any

from clusterctl.errors import Problem
from clusterctl.inventory.yamlnodes import Y

_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
    r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$"
)
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class Ctx:
    """Where problems go while one file is read."""

    def __init__(self, filename: str):
        self.filename = filename
        self.problems: list[Problem] = []

    def error(self, line: int, message: str) -> None:
        self.problems.append(Problem(self.filename, line, message))

    def warning(self, line: int, message: str) -> None:
        self.problems.append(Problem(self.filename, line, message, "warning"))

    # ------------------------------------------------------------ structure

    def mapping(self, y: Y | None, what: str) -> dict[str, Y] | None:
        """The mapping's items, or ``None`` (with a problem) for anything else.

        An empty value (``key:`` with nothing after it) counts as ``{}``.
        """
        if y is None:
            return None
        if y.kind == "map":
            return y.value
        if y.kind == "scalar" and y.value is None:
            return {}
        self.error(y.line, f"{what}: expected a mapping, got {describe(y)}")
        return None

    def keys(self, y: Y, allowed: Iterable[str], what: str) -> dict[str, Y]:
        """Report unknown keys (suggesting a close match); return the known ones."""
        allowed = list(allowed)
        out: dict[str, Y] = {}
        if y.kind != "map":
            return out
        for key, value in y.value.items():
            if key in allowed:
                out[key] = value
                continue
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(allowed)})"
            self.error(y.key_lines.get(key, y.line), f"{what}: unknown key {key!r}{hint}")
        return out

    # --------------------------------------------------------------- scalars

    def string(self, y: Y, what: str, choices: Iterable[str] | None = None) -> str | None:
        v = y.value
        if y.kind != "scalar" or not isinstance(v, str):
            hint = "; quote it" if y.kind == "scalar" and v is not None else ""
            self.error(y.line, f"{what}: expected a string, got {describe(y)}{hint}")
            return None
        if choices is not None:
            choices = list(choices)
            if v not in choices:
                self.error(y.line, f"{what}: {v!r} is not one of {', '.join(choices)}")
                return None
        return v

    def integer(self, y: Y, what: str, lo: int | None = None, hi: int | None = None) -> int | None:
        v = y.value
        if y.kind != "scalar" or isinstance(v, bool) or not isinstance(v, int):
            self.error(y.line, f"{what}: expected an integer{_bounds(lo, hi)}, got {describe(y)}")
            return None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            self.error(y.line, f"{what}: {v} is out of range{_bounds(lo, hi)}")
            return None
        return v

    def number(self, y: Y, what: str, positive: bool = False) -> float | None:
        """An int or float; a string such as ``8.19e9`` is accepted too.

        (YAML 1.1 reads ``8.19e9`` without an exponent sign as a string.)
        """
        v = y.value
        if isinstance(v, str) and y.kind == "scalar":
            try:
                v = float(v.replace("_", ""))
            except ValueError:
                pass
        if y.kind != "scalar" or isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            self.error(y.line, f"{what}: expected a number, got {describe(y)}")
            return None
        if positive and v <= 0:
            self.error(y.line, f"{what}: must be greater than 0, got {v}")
            return None
        return v

    def boolean(self, y: Y, what: str) -> bool | None:
        if y.kind != "scalar" or not isinstance(y.value, bool):
            self.error(y.line, f"{what}: expected true or false, got {describe(y)}")
            return None
        return y.value

    def string_list(self, y: Y, what: str) -> list[tuple[str, int]] | None:
        """A string or a list of strings, each with its line."""
        if y.kind == "scalar" and isinstance(y.value, str):
            return [(y.value, y.line)]
        if y.kind != "seq":
            self.error(y.line, f"{what}: expected a string or a list of strings, got {describe(y)}")
            return None
        out = []
        for item in y.value:
            s = self.string(item, what)
            if s is not None:
                out.append((s, item.line))
        return out

    def address(self, value: str, line: int, what: str) -> bool:
        """True if ``value`` is an IP address or a host name; else a problem."""
        try:
            ipaddress.ip_address(value)
            return True
        except ValueError:
            pass
        if re.fullmatch(r"[\d.]+", value) or ":" in value:
            self.error(line, f"{what}: {value!r} is not a valid IP address")
            return False
        if not _HOSTNAME.match(value):
            self.error(line, f"{what}: {value!r} is neither an IP address nor a host name")
            return False
        return True


def suggest(word: str, choices: list[str]) -> str:
    """``; did you mean 'x'?`` for the closest choice, or nothing."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def describe(y: Y) -> str:
    """A short description of a value for messages: ``integer 3``, ``a list``."""
    if y.kind == "map":
        return "a mapping"
    if y.kind == "seq":
        return "a list"
    v: Any = y.value
    if v is None:
        return "nothing (null)"
    if isinstance(v, bool):
        return f"boolean {str(v).lower()}"
    if isinstance(v, int):
        return f"integer {v}"
    if isinstance(v, float):
        return f"number {v}"
    if isinstance(v, str):
        return f"string {v!r}"
    return f"{type(v).__name__} {v}"


def _bounds(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f" {lo}-{hi}"
    if lo is not None:
        return f" >= {lo}"
    return ""
