"""Page-cache residency of files, measured with mincore(2) through ctypes.

A hole in a sparse file is not resident until something reads it (reading
a hole puts zero-filled pages in the cache, like any other read), so a
freshly written sparse model counts as cold.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
PAGE = mmap.PAGESIZE
_CHUNK = 1 << 30  # map at most 1 GiB at a time


def resident_bytes(path: str) -> tuple[int, int]:
    """``(resident, size)`` in bytes for ``path`` (resident rounded to pages, capped at size).

    Raises ``OSError`` when the file cannot be opened or mapped.
    """
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    resident = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        off = 0
        while off < size:
            length = min(_CHUNK, size - off)
            addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, off)
            if addr in (None, ctypes.c_void_p(-1).value):
                err = ctypes.get_errno()
                raise OSError(err, f"mmap {path}: {os.strerror(err)}")
            try:
                pages = (length + PAGE - 1) // PAGE
                vec = ctypes.create_string_buffer(pages)
                if _libc.mincore(addr, length, vec) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"mincore {path}: {os.strerror(err)}")
                resident += (pages - vec.raw.count(0)) * PAGE  # other bits are reserved (0)
            finally:
                _libc.munmap(addr, length)
            off += length
    finally:
        os.close(fd)
    return min(resident, size), size
