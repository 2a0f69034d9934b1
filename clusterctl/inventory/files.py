"""Reading a configuration file the user names, bounded whatever it turns out to be.

An inventory, an ssh_config (and what it includes) or an Ansible inventory can
be a FIFO (reading blocks forever), ``/dev/zero`` (reading never ends), a
directory or a file of gigabytes.  :func:`read_config_text` reads regular files
only (checked on the open descriptor, so a swap after a check does not help),
at most ``max_bytes``, and only UTF-8 text without NUL bytes.
"""

from __future__ import annotations

import os
import stat

#: Largest configuration file read (the 1,000-host inventory is well under 1 MiB).
MAX_CONFIG_BYTES = 16 << 20


class ReadRefused(Exception):
    """The file was not read; ``str()`` says why, for a message after its path."""


def read_config_text(path: str | os.PathLike[str], max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The text of ``path``; raises :class:`ReadRefused` (why) for anything but a small UTF-8 regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ReadRefused(e.strerror or str(e)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReadRefused("not a regular file (a FIFO, device or directory)")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise ReadRefused(e.strerror or str(e)) from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > max_bytes:
        raise ReadRefused(f"larger than {_size(max_bytes)}")
    if b"\0" in raw:
        raise ReadRefused("a binary file (NUL bytes)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ReadRefused("not UTF-8 text") from None


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
