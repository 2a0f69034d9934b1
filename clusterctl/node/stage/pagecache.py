"""Page cache: warm, measure residency (mincore), evict per file (node-side, stdlib).

* :func:`warm` reads files with ``workers`` parallel readers (``posix_fadvise
  WILLNEED`` first, then real reads, so residency does not depend on the
  kernel honouring the hint).
* :func:`residency` maps each file and asks ``mincore(2)`` (through ctypes)
  which pages are resident; nothing is read, so measuring does not warm.
* :func:`evict` drops one file's clean pages with ``posix_fadvise DONTNEED``
  (after ``fdatasync``), leaving the rest of the machine's cache alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from .threads import pmap

READ_BLOCK = 4 * 1024 * 1024
_PROT_READ = 0x1
_MAP_SHARED = 0x01

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def file_residency(path: str) -> Tuple[int, int]:
    """(resident bytes, size in bytes) of ``path``, from mincore(2); OSError on failure."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            e = ctypes.get_errno()
            raise OSError(e, f"mmap {path}: {os.strerror(e)}")
        try:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"mincore {path}: {os.strerror(e)}")
            resident = sum(1 for b in vec if b & 1)
        finally:
            _libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)
    return min(size, resident * page), size


def residency(paths: List[str]) -> Dict[str, int]:
    """Totals over ``paths``: ``resident`` and ``bytes`` (both in bytes)."""
    res = tot = 0
    for p in paths:
        r, s = file_residency(p)
        res += r
        tot += s
    return {"resident": res, "bytes": tot}


def _read_range(args: Tuple[str, int, int]) -> int:
    path, off, length = args
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < length:
            got = os.pread(fd, min(READ_BLOCK, length - done), off + done)
            if not got:
                break
            done += len(got)
        return done
    finally:
        os.close(fd)


def warm(
    paths: List[str], workers: int = 8, slice_bytes: int = 64 * 1024 * 1024, budget: Optional[int] = None
) -> Dict[str, Any]:
    """Read ``paths`` into the page cache with ``workers`` parallel readers.

    Files are cut into ``slice_bytes`` slices so one large shard is read by
    several threads at once.  ``budget``: read at most this many bytes, the
    files' first bytes in the order given (a page-cache budget per host: the
    rest stays on disk).  Returns ``bytes`` read, ``seconds``, and with a
    budget ``budget`` and ``left_cold`` (bytes of ``paths`` not read).
    """
    t0 = time.monotonic()
    jobs: List[Tuple[str, int, int]] = []
    total_size = 0
    left = budget
    for p in paths:
        size = os.path.getsize(p)
        total_size += size
        want = size if left is None else max(0, min(size, left))
        if left is not None:
            left -= want
        if want == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, want, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
        jobs.extend((p, off, min(slice_bytes, want - off)) for off in range(0, want, slice_bytes))
    total = sum(pmap(_read_range, jobs, workers))
    out: Dict[str, Any] = {"bytes": total, "seconds": time.monotonic() - t0}
    if budget is not None:
        out.update(budget=budget, left_cold=total_size - total)
    return out


def evict(paths: List[str]) -> None:
    """Drop each file's pages from the page cache (dirty pages are written first)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
