"""Build remote shell command lines safely.

Every value that comes from the inventory or the user and ends up in a remote
shell goes through :func:`quote` (``shlex.quote``), so ``; touch /tmp/pwned``,
``$(...)``, backquotes, quotes and newlines arrive as literal text.  The
helpers here return a single string for the remote login shell (``sh -c``
semantics: OpenSSH runs ``$SHELL -c STRING``).
"""

from __future__ import annotations

import shlex
from typing import Iterable, Mapping

#: Printed on stderr (and exit 127) by :func:`require_python3` when the node
#: has no python3; the fleet maps it to ``no_python``.
NO_PYTHON_MARKER = "clusterctl: python3 not found"


def quote(value: object) -> str:
    """Quote one value for a POSIX shell (``str(value)`` first)."""
    return shlex.quote(str(value))


def join(argv: Iterable[object]) -> str:
    """Quote every word and join them: ``join(["ls", "a b"])`` -> ``ls 'a b'``."""
    return " ".join(quote(a) for a in argv)


def with_env(command: str, env: Mapping[str, str]) -> str:
    """Prefix ``command`` with ``env NAME=VALUE ...`` (names are checked, values quoted)."""
    if not env:
        return command
    for name in env:
        if not name or not (name[0].isalpha() or name[0] == "_") or not all(c.isalnum() or c == "_" for c in name):
            raise ValueError(f"not a valid environment variable name: {name!r}")
    return "env " + " ".join(quote(f"{k}={v}") for k, v in env.items()) + " " + command


def sh_c(command: str) -> str:
    """Run ``command`` in ``sh -c`` (so it works whatever the login shell is)."""
    return "sh -c " + quote(command)


def require_python3(command: str) -> str:
    """Run ``command`` only when ``python3`` is on PATH; else exit 127 with the marker."""
    return "command -v python3 >/dev/null 2>&1 || { echo " + quote(NO_PYTHON_MARKER) + " >&2; exit 127; }; " + command


def python_script(args: Iterable[object] = ()) -> str:
    """``python3 - ARGS``: run a script read from stdin with quoted arguments."""
    rest = join(args)
    return "python3 -" + (" " + rest if rest else "")


# Reads the password from the first stdin line with the shell's builtin read
# (byte by byte, so the rest of stdin stays for the command), gives it to
# ``sudo -v`` through the builtin printf (never argv, never a file), then
# runs the command under ``sudo -n`` with the cached credential.  The command
# itself is ``$1``; no secret is part of any command line.
_SUDO_PASSWORD_WRAPPER = (
    "IFS= read -r p; "
    "printf '%s\\n' \"$p\" | sudo -S -p '' -v 2>/dev/null "
    "|| { unset p; echo 'sudo: the become password was not accepted' >&2; exit 1; }; "
    "unset p; sudo -n -- sh -c \"$1\""
)


def sudo(command: str, *, with_password: bool) -> str:
    """Wrap ``command`` to run as root through sudo.

    Without a password: ``sudo -n`` (fails at once, rc 1, when sudo wants
    a password).  With a password: the caller must write the password and a
    newline as the first line of stdin (see :data:`_SUDO_PASSWORD_WRAPPER`).
    """
    if not with_password:
        return "sudo -n -- sh -c " + quote(command)
    return "sh -c " + quote(_SUDO_PASSWORD_WRAPPER) + " sh " + quote(command)
