#!/usr/bin/env python3
"""pin-model: keep a staged model resident in the page cache within a memory budget.

Installed on each node as ``/usr/local/lib/clusterctl/pin-model`` and run by
``clusterctl stage pin`` as a transient systemd unit
(``clusterctl-pin-<name>.service``, ``LimitMEMLOCK=infinity``)::

    pin-model /models/qwen3-8b --budget 17179869184 [--state /run/clusterctl/pin-qwen3-8b.json]

It maps the files of the version MODEL_PATH points at, in manifest order, up to
BUDGET bytes, and ``mlock``s them, so the kernel cannot evict those pages
while the process lives (``stop`` the unit to release them).  When ``mlock``
is refused (no CAP_IPC_LOCK and a low RLIMIT_MEMLOCK), it falls back to
re-reading the same range every ``--interval`` seconds ("refresh" mode: best
effort, pages can be evicted in between).  The state file says which mode,
how many bytes and which version.  Exit 0 on SIGTERM, 1 with one line on
stderr when the model is not a staged version.  Standalone: Python 3
standard library only, no clusterctl import.
"""

import ctypes
import ctypes.util
import json
import os
import signal
import sys
import time

MANIFEST = ".clusterctl-manifest.json"
PROT_READ, MAP_SHARED = 0x1, 0x01

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munlockall.argtypes = []
_MAP_FAILED = ctypes.c_void_p(-1).value


def plan(model_path, budget):
    """[(path, bytes)] of the current version's files to keep, in manifest order, within ``budget``."""
    target = os.path.realpath(model_path)
    with open(os.path.join(target, MANIFEST)) as fh:
        files = json.load(fh)["files"]
    out, left = [], budget
    for f in files:
        if left <= 0:
            break
        take = min(int(f["size"]), left)
        if take > 0:
            out.append((os.path.join(target, f["path"]), take))
            left -= take
    return target, out


def lock(ranges):
    """mmap + mlock each range; returns bytes locked, or raises OSError (nothing kept locked)."""
    try:
        return _lock_all(ranges)
    except OSError:
        _libc.munlockall()
        raise


def _lock_all(ranges):
    locked = 0
    for path, length in ranges:
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, length, PROT_READ, MAP_SHARED, fd, 0)
            if addr in (None, _MAP_FAILED):
                e = ctypes.get_errno()
                raise OSError(e, "mmap %s: %s" % (path, os.strerror(e)))
            if _libc.mlock(ctypes.c_void_p(addr), length) != 0:
                e = ctypes.get_errno()
                raise OSError(e, "mlock %s: %s" % (path, os.strerror(e)))
            locked += length  # the mapping stays for the life of the process
        finally:
            os.close(fd)
    return locked


def refresh(ranges):
    """Read every range once (pages come back into the cache if they were evicted)."""
    total = 0
    for path, length in ranges:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, length, os.POSIX_FADV_WILLNEED)
            done = 0
            while done < length:
                got = os.pread(fd, min(4 << 20, length - done), done)
                if not got:
                    break
                done += len(got)
            total += done
        finally:
            os.close(fd)
    return total


def _write_state(path, state):
    if not path:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, path)


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    opts = {"--budget": None, "--state": None, "--interval": "60"}
    pos = []
    while args:
        a = args.pop(0)
        if a in opts and args:
            opts[a] = args.pop(0)
        else:
            pos.append(a)
    if len(pos) != 1 or opts["--budget"] is None:
        sys.stderr.write("usage: pin-model MODEL_PATH --budget BYTES [--state FILE] [--interval S]\n")
        return 2
    try:
        target, ranges = plan(pos[0], int(opts["--budget"]))
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write("pin-model: %s is not a staged model: %s\n" % (pos[0], e))
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    state = {
        "model_path": pos[0],
        "version_dir": target,
        "budget": int(opts["--budget"]),
        "bytes": sum(n for _, n in ranges),
        "pid": os.getpid(),
    }
    try:
        state.update(mode="mlock", locked=lock(ranges))
    except OSError as e:
        state.update(mode="refresh", locked=0, why=str(e))
    sys.stdout.write("pin-model: %s: %s, %d bytes of %s\n" % (pos[0], state["mode"], state["bytes"], target))
    sys.stdout.flush()
    while True:
        if state["mode"] == "refresh":
            refresh(ranges)
        state["checked"] = time.time()
        _write_state(opts["--state"], state)
        time.sleep(float(opts["--interval"]))


if __name__ == "__main__":
    sys.exit(main())
