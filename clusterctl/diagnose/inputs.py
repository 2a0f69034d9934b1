"""Reading what an operator hands doctor: bounded in size, time and kind.

Everything ``doctor --from`` reads goes through here: a bundle directory, a
``.tar.gz``, a directory of loose files or one file (plain or gzip).  The
rules hold for any input, however hostile:

- only regular files are read: a FIFO, a device, a socket or a symbolic link
  is skipped with the reason (opened with ``O_NOFOLLOW | O_NONBLOCK``, then
  checked with ``fstat``, so nothing can block or point elsewhere);
- at most :data:`MAX_FILE_BYTES` of one file are kept (a log keeps its last
  part, starting at a line boundary) and at most :data:`MAX_TOTAL_BYTES` of
  all files together; a line longer than :data:`MAX_LINE_CHARS` is cut;
- an archive is read as a stream, member by member, never extracted whole:
  members are bounded like files, links and special members are skipped,
  and the gzip stream is read to its end, so a truncated or corrupted archive
  (CRC, length, a damaged tar header) is an error naming the file, never a
  silently shorter bundle;
- JSON is size-bounded and a nesting too deep for the parser is a clear error.

Errors are :class:`ConfigError` (exit 3) naming the file.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from clusterctl.errors import ConfigError, Problem

#: Bytes of one file kept (a larger file keeps its last part).
MAX_FILE_BYTES = 32 * 2**20
#: Bytes of all files of one input together.
MAX_TOTAL_BYTES = 256 * 2**20
#: Characters of one line (the rest of a longer line is dropped).
MAX_LINE_CHARS = 64 * 1024
#: Decompressed bytes an archive may expand to (bounds the time spent reading it).
MAX_ARCHIVE_BYTES = 4 * 2**30
#: Files read from one input.
MAX_FILES = 20_000
_CHUNK = 1 << 20


def _err(path: str | Path, message: str, line: int = 0) -> ConfigError:
    return ConfigError([Problem(str(path), line, message)])


@dataclass
class Skipped:
    """A file not read, and why."""

    path: str
    reason: str


@dataclass
class Budget:
    """What is left of :data:`MAX_TOTAL_BYTES` for one input, and what was skipped or cut."""

    left: int = MAX_TOTAL_BYTES
    files: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    truncated: dict[str, int] = field(default_factory=dict)

    def take(self, path: str, size: int) -> int:
        """Bytes of ``path`` that may be kept (0 once the total is spent)."""
        self.files += 1
        if self.files > MAX_FILES:
            self.skipped.append(Skipped(path, f"not read: more than {MAX_FILES} files in this input"))
            return 0
        keep = min(size, MAX_FILE_BYTES, self.left)
        if keep <= 0 and size > 0:
            self.skipped.append(Skipped(path, f"not read: the input's total of {mib(MAX_TOTAL_BYTES)} is spent"))
        return max(0, keep)


def mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def tail(f: IO[bytes], keep: int) -> tuple[bytes, int]:
    """The last ``keep`` bytes of a stream (starting after a newline when cut) and its whole length.

    Memory stays below ``2 * keep`` plus one chunk, whatever the stream's length."""
    buf = bytearray()
    total = 0
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            break
        total += len(chunk)
        if keep:
            buf += chunk
            if len(buf) > 2 * keep:
                del buf[: len(buf) - keep]
    if len(buf) > keep:
        del buf[: len(buf) - keep]
    if total > keep and buf:
        nl = buf.find(b"\n")
        del buf[: nl + 1 if 0 <= nl < len(buf) - 1 else 0]
    return bytes(buf), total


def bounded_text(data: bytes) -> str:
    """UTF-8 text (invalid bytes replaced) with every line cut at :data:`MAX_LINE_CHARS`."""
    text = data.decode("utf-8", "replace")
    w = MAX_LINE_CHARS // 2  # a line of MAX_LINE_CHARS or more covers a whole aligned window of w
    if not any(text.find("\n", j, j + w) == -1 for j in range(0, len(text) - w + 1, w)):
        return text
    return "\n".join(x[:MAX_LINE_CHARS] for x in text.split("\n"))


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: Path, budget: Budget) -> bytes | None:
    """The bytes of ``path`` within the budget; None (and a :class:`Skipped`) when not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            mode = 0
        why = _kind(mode) if mode and not stat.S_ISREG(mode) else (e.strerror or str(e))
        budget.skipped.append(Skipped(str(path), f"not read: {why} (only regular files are read)"))
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            budget.skipped.append(Skipped(str(path), f"not read: {_kind(st.st_mode)} (only regular files are read)"))
            return None
        keep = budget.take(str(path), st.st_size)
        if keep == 0 and st.st_size:
            return None
        data, total = tail(f, keep)
    budget.left -= len(data)
    if total > len(data):
        budget.truncated[str(path)] = total
    return data


def walk(root: Path, budget: Budget, max_depth: int = 8) -> list[tuple[str, Path]]:
    """``(relative path, path)`` of the entries under ``root`` to read (directories walked without
    following links; everything else is returned and :func:`read_regular` decides)."""
    out: list[tuple[str, Path]] = []

    def go(d: Path, rel: str, depth: int) -> None:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as e:
            budget.skipped.append(Skipped(str(d), f"not read: {e.strerror or e}"))
            return
        for ent in entries:
            r = f"{rel}{ent.name}"
            if ent.is_dir(follow_symlinks=False):
                if depth >= max_depth:
                    budget.skipped.append(Skipped(str(ent.path), f"not read: deeper than {max_depth} directories"))
                else:
                    go(Path(ent.path), r + "/", depth + 1)
            else:
                out.append((r, Path(ent.path)))
            if len(out) > MAX_FILES:
                return

    go(root, "", 0)
    return out


def load_json(path: str, data: bytes) -> Any:
    """Parse JSON from a file's bytes; a clear error for bad JSON, bad UTF-8 or a nesting too deep."""
    try:
        return json.loads(data.decode("utf-8"))
    except json.JSONDecodeError as e:
        raise _err(path, f"not valid JSON: {e.msg}", e.lineno) from None
    except UnicodeDecodeError as e:
        raise _err(path, f"not UTF-8 text: {e.reason}") from None
    except RecursionError:
        raise _err(path, "JSON nested too deeply to read") from None


# ------------------------------------------------------------------ archives


class _Counting:
    """A read-only stream that refuses to deliver more than ``limit`` bytes."""

    def __init__(self, f: IO[bytes], limit: int, name: str):
        self.f, self.limit, self.name, self.n = f, limit, name, 0

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size if size is not None and size >= 0 else _CHUNK)
        self.n += len(data)
        if self.n > self.limit:
            raise _err(self.name, f"the archive expands to more than {self.limit / 2**30:.0f} GiB; not read")
        return data


def is_archive(path: Path) -> bool:
    """A tar archive (plain or gzip), by content."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            if head == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=f) as g:
                    block = g.read(512)
            else:
                block = f.read(512)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
        return False
    return len(block) == 512 and block[257:262] == b"ustar"


def gunzip(path: Path, budget: Budget) -> bytes | None:
    """The content of a gzip file (bounded as a file); a clear error when it is damaged."""
    try:
        with open(path, "rb") as raw, gzip.GzipFile(fileobj=raw) as g:
            counted = _Counting(g, MAX_ARCHIVE_BYTES, str(path))  # type: ignore[arg-type]
            keep = budget.take(str(path), MAX_FILE_BYTES)
            data, total = tail(counted, keep)  # type: ignore[arg-type]
    except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as e:
        raise _err(path, f"damaged gzip file: {_why(e)}") from None
    budget.left -= len(data)
    if total > len(data):
        budget.truncated[str(path)] = total
    return data


def _why(e: BaseException) -> str:
    if isinstance(e, EOFError):
        return "the file is truncated (it ends in the middle of its data)"
    return str(e) or type(e).__name__


def _member_path(name: str) -> str | None:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts:
        return None
    parts = [x for x in p.parts if x not in ("", ".")]
    return "/".join(parts) or None


def read_archive(path: Path, dest: Path, budget: Budget) -> None:
    """Unpack the tar (or tar.gz) ``path`` into the empty directory ``dest``, member by member.

    Regular files are written within the budget (a bigger member keeps its
    tail); directories are made; links, devices and FIFOs are skipped, as are
    absolute names and names with ``..``.  The stream is read to its end.
    Raises :class:`ConfigError` when the archive is truncated or damaged."""
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            src: Any = gzip.GzipFile(fileobj=raw) if gz else raw
            stream = _Counting(src, MAX_ARCHIVE_BYTES, str(path))
            with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
                last = None
                for m in tar:
                    last = m.name
                    rel = _member_path(m.name)
                    if rel is None:
                        budget.skipped.append(Skipped(m.name, "not read: an absolute name or one with '..'"))
                        continue
                    target = dest / rel
                    if m.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    if not m.isreg():
                        kind = "a link" if (m.issym() or m.islnk()) else "not a regular file"
                        budget.skipped.append(Skipped(rel, f"not read: {kind} (only regular files are read)"))
                        continue
                    keep = budget.take(rel, m.size)
                    f = tar.extractfile(m)
                    data, total = tail(f, keep) if f is not None else (b"", 0)
                    if total < m.size:
                        raise EOFError
                    budget.left -= len(data)
                    if total > len(data):
                        budget.truncated[rel] = total
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if target.exists() and target.is_dir():
                        continue
                    target.write_bytes(data)
                # The tar reader stops at the first header it cannot read; what follows must be padding.
                while True:
                    rest = tar.fileobj.read(_CHUNK)
                    if not rest:
                        break
                    if rest.strip(b"\0"):
                        raise _err(
                            path,
                            "damaged archive: unreadable data after " + (f"member {last!r}" if last else "its start"),
                        )
    except ConfigError:
        raise
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError) as e:
        raise _err(path, f"not a readable bundle archive: {_why(e)}") from None
