"""Run a Python program on many hosts, shipping it only where it is not cached yet.

The probe (collector + carried pynvml, ~97 KB) and doctor's node script used to
travel on every run's stdin: 97 MB per run at 1,000 hosts.  :func:`run_cached`
sends instead a short loader on the command line (``python3 -I -B -c LOADER
DIGEST run ARGS``).  On the node the loader reads
``~/.cache/clusterctl/programs/<sha256>.py`` (the home of the user the program
runs as; ``$CLUSTERCTL_NODE_CACHE_DIR`` on the node instead, for tests), checks that its sha256 is the one asked for, and runs those very
bytes (they are hashed in memory, then compiled: no window between check and
use).  A missing or damaged copy makes the loader exit :data:`RC_NOT_CACHED`
before anything runs; only those hosts get a second round trip with the program
on stdin (``... DIGEST store ARGS``), which verifies it, stores it and runs it.
Each such host starts its second round trip as soon as its first one returns,
while the hosts that had the program still run: the hosts of one run work at
the same time whether or not their cache had it (staging's relay needs that:
a host serves the next one of its chain while it runs).

Storing: the directory is created 0700 and used only when it is owned by the
user and writable by nobody else; the file is written 0600 to a temporary
name, fsync'ed, then renamed into place, so a reader sees a whole program or
none.  A file that cannot be stored (read-only home, full disk) is not fatal:
the program runs from memory and the next run ships it again.  The newest
:data:`KEEP` programs are kept (two clusterctl versions in use at once do not
evict each other), older ones are removed.

A program that reads a job on stdin (``stdin``: deploy's, the gateway's, staging's) gets it
after the program in the second round trip: the loader reads exactly the program's length
(``store=N``), and the program reads the rest.

``CLUSTERCTL_NODE_CACHE=off`` ships the program every time, as before
(``python3 -I -B -`` with the program on stdin; with a job: ``pipe=N``, verified, not stored).

:mod:`clusterctl.fleet.ship` builds the programs and is the one way they are run.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import queue
import shlex
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from clusterctl.fleet.results import HostResult, RunResults

if TYPE_CHECKING:
    from clusterctl.fleet.fleet import Fleet

#: Loader exit status: the program is not cached (or its copy is damaged).
RC_NOT_CACHED = 98
#: Loader exit status: the program on stdin does not have the sha256 asked for.
RC_DAMAGED = 99
#: How many programs one user's cache keeps: six programs travel through it (the probe, the collect
#: bundle, deploy's, pre-flight's, the gateway's, staging's), two clusterctl versions at once.
KEEP = 12

# Python 3 syntax that every Python 3 parses; an interpreter older than 3.8
# exits 97 (the probe's too-old status) with a message.  Kept short: it is on
# every command line.
_LOADER = r'''import sys,os
if sys.version_info<(3,8):
    sys.stderr.write("clusterctl probe: python %s is too old, 3.8 or newer is needed\n"%sys.version.split()[0]);sys.exit(97)
try:from _sha256 import sha256
except ImportError:
    try:from _sha2 import sha256
    except ImportError:from hashlib import sha256
import pwd,stat
d,m=sys.argv[1],sys.argv[2];del sys.argv[1:3];sys.argv[0]="-";m,n=(m+"=").split("=")[:2]
u=os.geteuid();c=os.environ.get("CLUSTERCTL_NODE_CACHE_DIR") or os.path.join(pwd.getpwuid(u).pw_dir,".cache","clusterctl","programs");f=os.path.join(c,d+".py")
def mine(p):
    try:s=os.lstat(p)
    except OSError:return False
    return stat.S_ISDIR(s.st_mode) and s.st_uid==u and not s.st_mode&0o022
if m=="run":
    try:
        with open(os.open(f,os.O_RDONLY|os.O_NOFOLLOW),"rb") as h:b=h.read()
    except OSError:b=b""
    if sha256(b).hexdigest()!=d:sys.exit(98)
    try:os.utime(f)
    except OSError:pass
else:
    b=sys.stdin.buffer.read(int(n)) if n else sys.stdin.buffer.read()
    if sha256(b).hexdigest()!=d:
        sys.stderr.write("clusterctl: the program arrived damaged (sha256 mismatch)\n");sys.exit(99)
    try:
        if m!="store":raise OSError
        os.makedirs(c,0o700,exist_ok=True)
        if mine(c):
            import tempfile
            t=tempfile.NamedTemporaryFile(dir=c,prefix=".tmp-",delete=False)
            try:
                t.write(b);t.flush();os.fsync(t.fileno());t.close();os.chmod(t.name,0o600);os.replace(t.name,f)
            except BaseException:
                t.close();os.unlink(t.name);raise
            o=sorted((os.stat(os.path.join(c,n)).st_mtime,n) for n in os.listdir(c) if n.endswith(".py") and len(n)==67)
            for _,n in o[:-KEEP]:
                os.unlink(os.path.join(c,n))
    except OSError:pass
del d,m,n,u,c,f,mine,sha256
exec(compile(b,"<clusterctl program>","exec"),{"__name__":"__main__","__builtins__":__builtins__})
'''.replace("KEEP", str(KEEP))


def enabled() -> bool:
    """False when ``CLUSTERCTL_NODE_CACHE`` is ``off`` (or 0/no/false)."""
    return os.environ.get("CLUSTERCTL_NODE_CACHE", "on").strip().lower() not in ("off", "0", "no", "false")


def digest(program: bytes) -> str:
    return hashlib.sha256(program).hexdigest()


def loader_command(program_digest: str, mode: str, args: Sequence[str] = (), *, python: str = "python3") -> str:
    """The command that runs the cached program ``program_digest`` (``mode`` ``run``)
    or stores and runs the one on stdin (``store``), every argument quoted."""
    if mode.partition("=")[0] not in ("run", "store", "pipe") or (mode == "run") != mode.startswith("run"):
        raise ValueError(f"mode must be run, store, store=N or pipe=N, not {mode!r}")
    argv = [python, "-I", "-B", "-c", _LOADER, program_digest, mode, *args]
    return " ".join(shlex.quote(a) for a in argv)


def stdin_command(args: Sequence[str] = (), *, python: str = "python3") -> str:
    """The uncached form: the program on stdin (``python3 -I -B - ARGS``)."""
    return " ".join(shlex.quote(a) for a in [python, "-I", "-B", "-", *args])


def run_cached(
    fleet: Fleet,
    program: bytes,
    args: Sequence[str] | Mapping[str, Sequence[str]] = (),
    *,
    stdin: bytes | None = None,
    cache: bool | None = None,
    on_result: Callable[[HostResult], None] | None = None,
    **run_kwargs: Any,
) -> RunResults:
    """Run ``program`` with ``args`` (one list for all hosts or one per host name)
    on every host of ``fleet``, as ``python3 -I -B - ARGS`` would with the program
    on stdin, but shipping it only to hosts that have no verified copy.

    ``stdin``: the job the program reads on its standard input (after the program,
    for hosts it is shipped to).  Returns the fleet's results in fleet order, one
    row per host; ``on_result`` sees each host's final row once, in the caller's thread
    (a host that needed the program is reported after its second round trip, which
    starts as soon as its first one returned, not after the other hosts ended).  ``cache``: ``None`` follows
    :func:`enabled`.  Other keyword arguments go to ``fleet.run`` (``sudo``,
    ``timeout``, ``require_python``, ``on_stderr``...).
    """
    names = [h.name for h in getattr(fleet, "hosts")]
    wanted = [n for n in names if not isinstance(args, Mapping) or n in args]

    def argv(name: str) -> Sequence[str]:
        if isinstance(args, Mapping):
            return args[name]
        return args

    d = digest(program)
    if not (enabled() if cache is None else cache):
        if stdin is None:
            command = {n: stdin_command(argv(n)) for n in wanted}
            uncached: RunResults = fleet.run(command, stdin=program, on_result=on_result, **run_kwargs)
            return uncached
        command = {n: loader_command(d, f"pipe={len(program)}", argv(n)) for n in wanted}
        uncached = fleet.run(command, stdin=program + stdin, on_result=on_result, **run_kwargs)
        return uncached
    t0 = time.monotonic()
    store = "store" if stdin is None else f"store={len(program)}"
    shipped = program + (stdin or b"")
    job = {} if stdin is None else {"stdin": stdin}  # the first round trip: the cached copy reads the job
    # Each host without the program gets its second round trip as soon as its first one returns,
    # beside the hosts still running from their cached copy: programs whose hosts work together
    # (staging's relay: a host serves the next) need every host of the run running at once.  The
    # round trips run in threads; this thread takes their rows from ``events`` and reports them,
    # so ``on_result`` runs in the caller's thread, as with fleet.run.
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    pool = cf.ThreadPoolExecutor(
        max_workers=max(1, min(len(wanted), int(getattr(fleet, "fanout", len(wanted)) or 1))),
        thread_name_prefix="cached-run",
    )

    def trip(kind: str, command: Mapping[str, str], **kw: Any) -> None:
        try:
            events.put((kind, fleet.run(command, **kw, **run_kwargs)))
        except BaseException as e:  # raised again in the caller's thread
            events.put(("error", e))

    rows: dict[str, HostResult] = {}
    running = 1

    def arrived(row: HostResult) -> None:
        nonlocal running
        rows[row.host] = row
        if row.rc == RC_NOT_CACHED:
            running += 1
            pool.submit(trip, "second", {row.host: loader_command(d, store, argv(row.host))}, stdin=shipped)
        elif on_result:
            on_result(row)

    first = threading.Thread(
        target=trip,
        args=("first", {n: loader_command(d, "run", argv(n)) for n in wanted}),
        kwargs=dict(job, on_result=lambda row: events.put(("row", row))),
        name="cached-run-first",
        daemon=True,
    )
    try:
        first.start()
        while running:
            kind, value = events.get()
            if kind == "error":
                raise value
            if kind == "row":
                arrived(value)
                continue
            running -= 1
            for row in value:
                if kind == "second":
                    rows[row.host] = row
                    if on_result:
                        on_result(row)
                elif row.host not in rows:  # a fleet that reports rows only in its results
                    arrived(row)
    except BaseException:
        close = getattr(fleet, "close", None)  # as fleet.run does: stop every round trip still running
        if callable(close):
            close()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return RunResults([rows[n] for n in wanted if n in rows], duration_s=time.monotonic() - t0)
