"""Quoting for systemd unit files and EnvironmentFiles.

Three syntaxes, each with its own escaping:

* **Command lines** (``ExecStart=``, ``ExecStartPre=``; systemd.service(5)
  "COMMAND LINES", systemd.syntax(7)): words are split at whitespace; single
  or double quotes group a word; C-style escapes (``\\n``, ``\\\\``, ``\\"``,
  ``\\xNN``) are decoded inside and outside quotes; ``%`` starts a specifier
  (``%%`` is a literal ``%``); ``$FOO``/``${FOO}`` are environment
  substitutions (``$$`` is a literal ``$``); a lone unquoted ``;`` separated
  commands in old versions.  :func:`systemd_quote` handles all of these.
* **Assignments** (``Environment="K=V"``): the same word syntax and
  specifiers, but ``$`` has no special meaning (systemd.exec(5)), so
  :func:`systemd_quote` with ``dollar=False``.
* **EnvironmentFile** lines (``K="V"``; systemd.exec(5)): no specifiers;
  inside double quotes a backslash escapes ``"``, ``\\``, ``$`` and a
  backquote; newlines would end the assignment, so they are refused.
  :func:`env_file_line`.
"""

from __future__ import annotations

import re

from clusterctl.errors import ClusterctlError

_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
_C_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\n": "\\n",
    "\t": "\\t",
    "\r": "\\r",
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\v": "\\v",
}


def systemd_quote(word: str, *, dollar: bool = True) -> str:
    """``word`` as exactly one argument of a systemd command line (or assignment).

    ``%`` is doubled (no specifier expansion); with ``dollar`` (command lines)
    ``$`` is doubled (no environment substitution).  Words of plain
    characters are left bare; anything else is double-quoted with C escapes
    for backslash, double quote and control characters.  Raises
    :class:`ClusterctlError` for a NUL byte, which no unit file can carry.
    """
    if "\0" in word:
        raise ClusterctlError("a systemd command-line argument cannot contain a NUL byte")
    text = word.replace("%", "%%")
    if dollar:
        text = text.replace("$", "$$")
    if text and _SAFE_WORD.match(text.replace("%", "").replace("$", "")):
        return text
    out = []
    for ch in text:
        if ch in _C_ESCAPES:
            out.append(_C_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def command_line(argv: list[str], *, indent: str = "    ") -> str:
    """``argv`` quoted, one ``--flag [value ...]`` group per continuation line.

    The first line holds everything before the first ``-``-prefixed word
    (the program and its sub-command and positional arguments).
    """
    groups: list[list[str]] = [[]]
    for i, word in enumerate(argv):
        if i and word.startswith("-") and len(word) > 1:
            groups.append([])
        groups[-1].append(systemd_quote(word))
    return f" \\\n{indent}".join(" ".join(g) for g in groups)


def environment_line(key: str, value: str) -> str:
    """``Environment=`` assignment of one variable (value taken literally)."""
    return "Environment=" + systemd_quote(f"{key}={value}", dollar=False)


def env_file_line(key: str, value: str) -> str:
    """One EnvironmentFile line ``KEY="value"`` that systemd reads back as ``value``.

    Raises :class:`ClusterctlError` (naming the variable, never the value)
    when the value has a newline, carriage return or NUL.
    """
    if any(c in value for c in "\n\r\0"):
        raise ClusterctlError(f"{key}: an EnvironmentFile value must be one line (no newline or NUL)")
    escaped = "".join("\\" + c if c in '"\\$`' else c for c in value)
    return f'{key}="{escaped}"'
