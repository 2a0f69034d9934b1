"""YAML with line numbers: every value remembers where it was written.

``yaml.safe_load`` forgets positions, so the inventory loader composes the
document (``yaml.compose``) and turns the node graph into :class:`Y` values:
plain Python scalars, lists of ``Y`` and dicts of ``str -> Y``, each with its
1-based line.  Anchors, aliases and merge keys (``<<: *base``) are resolved
here; duplicate keys, non-string keys, recursive aliases and tags that safe
YAML does not know become problems instead of exceptions.

With ``text_only`` (the inventory), a string holding a control character
(newline, carriage return, NUL, escape, ...; a tab is allowed), a Unicode
line or paragraph separator or a bidirectional override is a problem at its
line: inventory strings end up in nginx configs, systemd units, cron lines
and reports, where a newline starts a new directive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from clusterctl.errors import Problem

#: Most nodes one document may expand to (alias bombs stop here).
MAX_NODES = 200_000
#: Deepest flow nesting (``[[[...`` / ``{{{...``) read: PyYAML's pure-Python scanner is
#: quadratic in it (3,000 ``[`` took 10 s), and no inventory needs more than a few levels.
MAX_FLOW_DEPTH = 100
#: Larger texts that libyaml refuses are not parsed again by the slower pure-Python parser
#: (only for its more detailed message).
MAX_REPARSE_BYTES = 1 << 20

_MERGE_TAG = "tag:yaml.org,2002:merge"
#: Characters no inventory string may hold: C0 controls but tab, DEL, C1 controls, the Unicode
#: line and paragraph separators, bidirectional embeddings, overrides and isolates.
CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def control_char(text: str) -> str | None:
    """``"U+000A"`` for the first character of ``text`` that :data:`CONTROL` refuses, else ``None``."""
    m = CONTROL.search(text)
    return f"U+{ord(m.group()):04X}" if m else None


#: libyaml's parser when PyYAML was built with it (about 10x faster, same marks).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class Y:
    """A YAML value and its line.

    ``value`` is a scalar, a ``list[Y]`` (``kind == "seq"``) or a
    ``dict[str, Y]`` (``kind == "map"``); ``key_lines`` gives each mapping
    key's own line, which is where messages about that key point.
    """

    value: Any
    line: int
    kind: str = "scalar"
    key_lines: dict[str, int] = field(default_factory=dict)

    def plain(self) -> Any:
        """The value with every ``Y`` stripped (for free-form data such as vars)."""
        if self.kind == "map":
            return {k: v.plain() for k, v in self.value.items()}
        if self.kind == "seq":
            return [v.plain() for v in self.value]
        return self.value


class _Converter:
    def __init__(self, filename: str, problems: list[Problem], text_only: bool = False):
        self.filename = filename
        self.problems = problems
        self.text_only = text_only
        self.count = 0
        self.constructor = yaml.SafeLoader("")
        self.active: set[int] = set()

    def problem(self, line: int, message: str) -> None:
        self.problems.append(Problem(self.filename, line, message))

    def convert(self, node: yaml.Node) -> Y:
        line = node.start_mark.line + 1
        self.count += 1
        if self.count > MAX_NODES:
            raise _TooBig(line)
        if id(node) in self.active:
            self.problem(line, "recursive alias: a value contains itself")
            return Y(None, line)
        if isinstance(node, yaml.ScalarNode):
            try:
                value = self.constructor.construct_object(node, deep=True)
            except (yaml.YAMLError, ValueError, OverflowError) as e:
                problem = getattr(e, "problem", None) or str(e)
                self.problem(line, f"cannot read value {node.value!r}: {problem}")
                value = None
            if self.text_only and isinstance(value, str) and (bad := control_char(value)) is not None:
                self.problem(
                    line,
                    f"control character {bad} in {_preview(value)}: inventory strings "
                    "must be one line of printable text",
                )
            return Y(value, line)
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return Y([self.convert(n) for n in node.value], line, "seq")
            assert isinstance(node, yaml.MappingNode)
            return self._mapping(node, line)
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, line: int) -> Y:
        out: dict[str, Y] = {}
        key_lines: dict[str, int] = {}
        merged: dict[str, Y] = {}
        merged_lines: dict[str, int] = {}
        for knode, vnode in node.value:
            kline = knode.start_mark.line + 1
            if knode.tag == _MERGE_TAG:
                self._merge(vnode, merged, merged_lines)
                continue
            if not isinstance(knode, yaml.ScalarNode):
                self.problem(kline, "a key must be a plain string, not a list or mapping")
                continue
            key = self.convert(knode).value
            if isinstance(key, bool) or key is None:
                self.problem(kline, f"key {knode.value!r} reads as {key!r}; quote it to use it as a name")
                continue
            key = str(key)
            if key in out:
                self.problem(kline, f"duplicate key {key!r} (first at line {key_lines[key]})")
                continue
            key_lines[key] = kline
            out[key] = self.convert(vnode)
        for k, v in merged.items():
            if k not in out:
                out[k] = v
                key_lines[k] = merged_lines[k]
        return Y(out, line, "map", key_lines)

    def _merge(self, vnode: yaml.Node, into: dict[str, Y], lines: dict[str, int]) -> None:
        sources = vnode.value if isinstance(vnode, yaml.SequenceNode) else [vnode]
        for src in sources:
            conv = self.convert(src)
            if conv.kind != "map":
                self.problem(conv.line, "'<<' merges only mappings")
                continue
            for k, v in conv.value.items():
                if k not in into:  # earlier merge sources win, as in YAML
                    into[k] = v
                    lines[k] = conv.key_lines[k]


def _preview(value: str) -> str:
    """The start of ``value`` for a message, its control characters escaped."""
    text = value if len(value) <= 40 else value[:40] + "..."
    return repr(text)


class _TooBig(Exception):
    def __init__(self, line: int):
        self.line = line


def _too_deep(text: str) -> int:
    """The line where flow nesting passes :data:`MAX_FLOW_DEPTH`, else 0.

    Brackets inside quotes and comments do not count (an approximation of YAML's
    rules that never undercounts real nesting by much, and real inventories stay
    far below the limit).
    """
    if text.count("[") + text.count("{") <= MAX_FLOW_DEPTH:
        return 0
    depth, line, quote, comment, prev = 0, 1, "", False, " "
    for ch in text:
        if ch == "\n":
            line += 1
            comment = False
            if not depth:
                quote = ""
        elif comment:
            pass
        elif quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"" and prev in " \t[{,:":
            quote = ch
        elif ch == "#" and prev in " \t":
            comment = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_FLOW_DEPTH:
                return line
        elif ch in "]}" and depth:
            depth -= 1
        prev = ch
    return 0


def parse(text: str, filename: str, problems: list[Problem], *, text_only: bool = False) -> Y | None:
    """Parse one YAML document; append problems, return ``None`` if unusable.

    ``text_only``: refuse control characters in strings (see the module doc).

    A syntax error is reported at its line with YAML's own explanation.  An
    empty document returns ``None`` with a problem.
    """
    deep = _too_deep(text)
    if deep:
        problems.append(
            Problem(filename, deep, f"YAML nesting is too deep (more than {MAX_FLOW_DEPTH} levels of [ ] or {{ }})")
        )
        return None
    try:
        try:
            node = yaml.compose(text, Loader=_LOADER)
        except yaml.MarkedYAMLError:
            if _LOADER is yaml.SafeLoader or len(text) > MAX_REPARSE_BYTES:
                raise
            # libyaml's messages are terser; the pure-Python parser explains more.
            node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 0
        what = e.problem or e.context or "syntax error"
        problems.append(Problem(filename, line, f"YAML syntax error: {what}"))
        return None
    except yaml.reader.ReaderError as e:  # control characters, bad encoding
        line = text[: e.position].count("\n") + 1 if isinstance(e.position, int) else 0
        problems.append(Problem(filename, line, f"YAML error: {e.reason}"))
        return None
    except yaml.YAMLError as e:
        problems.append(Problem(filename, 0, f"YAML error: {e}"))
        return None
    except RecursionError:
        problems.append(Problem(filename, 0, "YAML nesting is too deep"))
        return None
    if node is None:
        problems.append(Problem(filename, 0, "the file is empty"))
        return None
    conv = _Converter(filename, problems, text_only)
    try:
        return conv.convert(node)
    except _TooBig as e:
        problems.append(Problem(filename, e.line, f"document expands to more than {MAX_NODES} values (alias bomb?)"))
        return None
    except RecursionError:
        problems.append(Problem(filename, 0, "YAML nesting is too deep"))
        return None
