"""The node-side entry point of staging (stdlib only; run from the bundle).

Reads one JSON job from the first line of stdin and prints one JSON result
line on stdout; exit status 0 when the job succeeded, 1 when it failed (the
result carries ``error`` and ``kind``: ``disk_space``, ``fetch``,
``layout``, ``manifest``).  Jobs (``op``):

* ``stage``: fetch one version (from a range source, from the relay chain, or
  from frames that follow the job line on stdin), verify every chunk on disk,
  give the version its final name, switch the model path, prune, and
  optionally warm the page cache.  Keeps a relay server running for its
  children until they are done.
* ``status``: versions, markers, in-use version and page-cache residency of
  the given models.
* ``warm`` / ``evict``: the current version's files into / out of the page cache.
* ``install``: write a program the control side built (``program``, its ``sha256``
  checked first) as the executable file ``path`` (temp + rename), only when that file
  does not already have it (``stage`` does so for ``verify-model`` first, ``pin`` for
  ``pin-model``).
* ``pin`` / ``unpin``: (re)start or stop the transient unit
  ``clusterctl-pin-<name>.service`` running ``pin-model`` (keeps up to
  ``budget`` bytes of the current version resident; see pin_model.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import sys
import threading
import time
from typing import Any, BinaryIO, Dict, List, Optional

from . import fetch, layout, manifest as mf, relay

# s3, pagecache (ctypes) and subprocess are imported by the jobs that use them: the
# bundle compiles a module only when it is imported, and a staging node's start-up
# CPU is mostly imports (on a light lab every host starts on the same shared CPUs).


def _pagecache() -> Any:
    from . import pagecache

    return pagecache


def _source(spec: Optional[Dict[str, Any]]) -> Any:
    if not spec:
        return None
    kind = spec.get("kind")
    if kind == "http":
        return fetch.HttpSource(spec["url"], spec.get("headers"), float(spec.get("timeout", 30)))
    if kind == "s3":
        from . import s3

        return s3.S3Source(
            spec["endpoint"],
            spec["bucket"],
            spec.get("prefix", ""),
            region=spec["region"],
            access_key=spec["access_key"],
            secret_key=spec["secret_key"],
            session_token=spec.get("session_token"),
            timeout=float(spec.get("timeout", 30)),
        )
    if kind == "file":
        return fetch.FileSource(spec["root"])
    if kind == "stream":
        return None
    raise mf.ManifestError(f"unknown source kind {kind!r}")


class _LazySource:
    """A relay child's fallback source, built the first time it is read: a child the chain
    serves to the end never imports the HTTP client (nor builds the source)."""

    def __init__(self, spec: Dict[str, Any]):
        self.spec = spec
        self._src: Any = None

    def _get(self) -> Any:
        if self._src is None:
            self._src = _source(self.spec)
        return self._src

    @property
    def label(self) -> str:
        return str(self._get().label)

    def read(self, c: "mf.Chunk") -> bytes:
        return bytes(self._get().read(c))

    def close(self) -> None:
        if self._src is not None:
            self._src.close()


def fetch_stream(store: "fetch.ChunkStore", stream: BinaryIO, stats: Dict[str, Any]) -> None:
    """Read relay frames (header + bytes) from ``stream`` until EOF into ``store``."""
    while True:
        head = stream.read(relay.HEADER.size)
        if not head:
            break
        if len(head) != relay.HEADER.size:
            raise fetch.FetchError("the pushed stream was cut short inside a frame header; run stage again")
        index, length = relay.HEADER.unpack(head)
        data = stream.read(length)
        if index >= len(store.chunks) or len(data) != length:
            raise fetch.FetchError(
                f"the pushed stream was cut short or garbled at chunk {index}; run stage again "
                f"(verified chunks are kept)"
            )
        if store.done[index]:
            continue
        if store.put(index, data):
            stats["bytes"] = stats.get("bytes", 0) + length
            stats["chunks"] = stats.get("chunks", 0) + 1
        else:
            stats["corrupt"] = stats.get("corrupt", 0) + 1
    if not store.complete():
        raise fetch.FetchError(f"the pushed stream lacked {len(store.missing())} verified chunks; run stage again")


#: Standard-error lines starting with this carry live progress: ``{"done": bytes, "total": bytes}``.
PROGRESS_MARK = "clusterctl-progress "
#: The standard-error line a job with ``announce`` writes as soon as it has read its job.
STARTED_MARK = "clusterctl-started"


class ProgressReporter:
    """Writes the verified bytes of ``store`` to stderr every ``interval`` seconds until stopped."""

    def __init__(self, store: "fetch.ChunkStore", interval: float):
        self.store = store
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._thread.start()

    def _line(self) -> None:
        done = sum(c.length for c, ok in zip(self.store.chunks, self.store.done) if ok)
        sys.stderr.write(PROGRESS_MARK + json.dumps({"done": done, "total": self.store.manifest.total_bytes}) + "\n")
        sys.stderr.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._line()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._line()


def stage(job: Dict[str, Any], stdin: BinaryIO) -> Dict[str, Any]:
    t0 = time.monotonic()
    started = time.time()
    if job.get("install"):
        install(job["install"])
    man = mf.from_dict(job["manifest"], "job manifest")
    lay = layout.Layout(job["model_path"], man.name)
    version = man.version
    digest = man.digest()
    workers = int(job.get("workers", 8))
    out: Dict[str, Any] = {"version": version, "manifest_sha256": digest, "bytes_total": man.total_bytes}
    if os.path.lexists(lay.model_path) and not os.path.islink(lay.model_path):
        raise layout.LayoutError(
            f"{lay.model_path} is a real file or directory, not a clusterctl symlink; move it away before staging"
        )
    os.makedirs(lay.versions, exist_ok=True)
    marker = lay.read_marker(version)
    rl = job.get("relay") or {}
    stats: Dict[str, Any] = {"bytes": 0, "chunks": 0, "retries": 0, "corrupt": 0}
    timings: Dict[str, Any] = {}
    server = None
    if marker and marker.get("manifest_sha256") == digest:
        store = fetch.ChunkStore(lay.version_dir(version), man, complete=True)
        out["already_present"] = True
    else:
        if os.path.isdir(lay.version_dir(version)):
            raise layout.LayoutError(
                f"{lay.version_dir(version)} exists but is not a verified copy of this "
                f"manifest; remove it or stage under another version"
            )
        os.makedirs(lay.partial_dir(version), exist_ok=True)
        store = fetch.ChunkStore(lay.partial_dir(version), man)
        out["chunks_reused"] = store.scan(workers)
        out["space"] = store.check_space()
    reporter = ProgressReporter(store, float(job["progress"])) if job.get("progress") else None
    try:
        if rl.get("port") is not None:
            server = relay.RelayServer(
                store,
                digest,
                rl.get("bind", ""),
                int(rl["port"]),
                float(rl.get("stall_timeout", relay.STALL_TIMEOUT_S)),
            )
        if out.get("already_present") and rl.get("upstreams"):
            # Nothing to fetch (pre-staged): say so to the parent, which would otherwise keep
            # its relay server up for stall + 5 s waiting for this node to connect.
            out["told_parent"] = relay.say_done(
                digest, len(store.chunks), tuple(rl["upstreams"][0]), float(rl.get("start_grace", relay.START_GRACE_S))
            )
        if not store.complete():
            spec = job.get("source") or {}
            source = _LazySource(spec) if rl.get("upstreams") and spec.get("kind") in ("http", "s3") else _source(spec)
            for attempt in range(2):  # a second pass refetches chunks that failed verification on disk
                stop_reverify = threading.Event()
                reverifier = threading.Thread(
                    target=store.reverify_as_done, args=(stop_reverify,), name="reverify", daemon=True
                )
                reverifier.start()
                try:
                    _fetch_once(job, store, stdin, source, digest, workers, stats)
                finally:
                    stop_reverify.set()
                    reverifier.join()
                t_verify = time.monotonic()
                bad = store.verify_all(workers)
                timings["verify_tail_s"] = round(time.monotonic() - t_verify, 3)
                out["disk_corrupt"] = out.get("disk_corrupt", 0) + len(bad)
                if not bad:
                    break
            else:
                raise fetch.FetchError(
                    f"{len(bad)} chunks failed verification on disk twice (first: "
                    f"{bad[0].path} at {bad[0].offset}); the disk may be failing"
                )
            lay.finalize(version, man)
        out["fetch_seconds"] = round(time.monotonic() - t0, 3)
        if job.get("switch", True):
            previous = lay.current()
            lay.switch(version)
            out["switched_from"] = previous
        out["pruned"] = lay.prune(int(job.get("keep", 2)), protect=(version,))
        if job.get("warm"):
            files = [os.path.join(lay.version_dir(version), f.path) for f in man.files]
            budget = job.get("warm_budget")
            read = _pagecache().warm(files, workers, budget=None if budget is None else int(budget))
            # "bytes" below is the version's size (residency); what the warm-up read is "read_bytes".
            out["warm"] = dict(read, read_bytes=read["bytes"])
            out["warm"].update(_pagecache().residency(files))
        if server is not None:
            server.wait_children(int(rl.get("children", 1)), float(rl.get("linger", 20)), float(rl.get("limit", 3600)))
            out["served_bytes"] = server.served_bytes
    except BaseException as e:
        store.fail(str(e))
        raise
    finally:
        if reporter is not None:
            reporter.stop()
        if server is not None:
            server.stop()
        store.close()
    out.update({k: stats[k] for k in ("bytes", "chunks", "retries", "corrupt")})
    out["events"] = stats.get("events", [])
    if "upstream" in stats:
        out["upstream"] = stats["upstream"]
    out["seconds"] = round(time.monotonic() - t0, 3)
    out["timings"] = _timings(timings, store, server, t0)
    # wall-clock ends, so the controller can tell its SSH and start-up time from the node's own
    out["timings"].update(start_unix=round(started, 3), end_unix=round(time.time(), 3))
    # CPU seconds of the node program (every thread: receive, sha256, write, relay sends): on a
    # lab whose hosts share a few cores, their sum against cores x wall says if staging was CPU-bound.
    cpu = os.times()
    out["timings"]["cpu_s"] = round(cpu.user + cpu.system, 3)
    return out


def _timings(
    timings: Dict[str, Any], store: "fetch.ChunkStore", server: Optional["relay.RelayServer"], t0: float
) -> Dict[str, Any]:
    """Where the time went, in seconds from the start of the job: first and last chunk
    written here, first and last chunk sent to a relay child, seconds the relay
    server waited for a chunk it had not got yet, and the final verify's tail."""

    def rel(t: Optional[float]) -> Optional[float]:
        return None if t is None else round(t - t0, 3)

    timings.update(first_chunk_s=rel(store.first_put), last_chunk_s=rel(store.last_put))
    if server is not None:
        timings.update(
            first_sent_s=rel(server.first_sent),
            last_sent_s=rel(server.last_sent),
            relay_wait_s=round(server.wait_seconds, 3),
        )
    return timings


def _fetch_once(
    job: Dict[str, Any],
    store: "fetch.ChunkStore",
    stdin: BinaryIO,
    source: Any,
    digest: str,
    workers: int,
    stats: Dict[str, Any],
) -> None:
    """One pass over the missing chunks: from the relay upstreams, the pushed stream or the source."""
    rl = job.get("relay") or {}
    if rl.get("upstreams"):
        relay.fetch_from_upstreams(
            store,
            digest,
            [tuple(u) for u in rl["upstreams"]],
            source,
            workers,
            float(rl.get("stall_timeout", relay.STALL_TIMEOUT_S)),
            stats,
            float(rl.get("start_grace", relay.START_GRACE_S)),
        )
    elif (job.get("source") or {}).get("kind") == "stream":
        fetch_stream(store, stdin, stats)
    else:
        if source is None:
            raise fetch.FetchError("no source for this node")
        fetch.fetch_parallel(store, source, workers, int(job.get("attempts", fetch.DEFAULT_ATTEMPTS)), stats)


def status(job: Dict[str, Any]) -> Dict[str, Any]:
    models = []
    for m in job.get("models", []):
        lay = layout.Layout(m["path"], m["name"])
        cur = lay.current()
        entry: Dict[str, Any] = {
            "name": m["name"],
            "path": m["path"],
            "current": cur,
            "path_kind": (
                "symlink"
                if os.path.islink(lay.model_path)
                else "directory"
                if os.path.isdir(lay.model_path)
                else "missing"
                if not os.path.lexists(lay.model_path)
                else "other"
            ),
            "versions": [],
            "partial": [],
        }
        for v in lay.list_versions():
            mk = lay.read_marker(v)
            entry["versions"].append(
                {"version": v, "verified": bool(mk), "in_use": v == cur, "bytes": (mk or {}).get("bytes")}
            )
        try:
            entry["partial"] = sorted(
                n[len(layout.PARTIAL_PREFIX) :] for n in os.listdir(lay.versions) if n.startswith(layout.PARTIAL_PREFIX)
            )
        except FileNotFoundError:
            pass
        if cur:
            entry["residency"] = _pagecache().residency(_files(lay, cur))
        pinned = _pin_state(m["name"])
        if pinned:
            entry["pin"] = {k: pinned.get(k) for k in ("mode", "bytes", "budget", "version_dir")}
        models.append(entry)
    checker = job.get("verify_model")
    return {"models": models, "verify_model_installed": bool(checker) and os.access(str(checker), os.X_OK)}


def _files(lay: "layout.Layout", version: str) -> List[str]:
    root = lay.version_dir(version)
    with open(os.path.join(root, mf.MANIFEST_NAME)) as fh:
        man = mf.loads(fh.read(), os.path.join(root, mf.MANIFEST_NAME))
    return [os.path.join(root, f.path) for f in man.files]


def cache_op(job: Dict[str, Any]) -> Dict[str, Any]:
    out = []
    for m in job.get("models", []):
        lay = layout.Layout(m["path"], m["name"])
        cur = lay.current()
        if cur is None:
            out.append({"name": m["name"], "error": f"{m['path']} is not staged"})
            continue
        files = _files(lay, cur)
        row: Dict[str, Any] = {"name": m["name"], "version": cur}
        if job["op"] == "warm":
            row.update(_pagecache().warm(files, int(job.get("workers", 8))))
        else:
            _pagecache().evict(files)
        row["residency"] = _pagecache().residency(files)
        out.append(row)
    return {"models": out}


def install(job: Dict[str, Any]) -> Dict[str, Any]:
    """Write the ``program`` (its sha256 ``sha256``, from the control side's builder) as the
    executable file ``path`` (0755, temp + rename), unless that file already has it.  Raises
    OSError (nothing written) when ``program`` does not have that sha256.  ``changed``: written."""
    path, data, want = job["path"], job["program"].encode("utf-8"), job["sha256"]
    if hashlib.sha256(data).hexdigest() != want:
        raise OSError(errno.EIO, "the program arrived damaged (sha256 mismatch)", path)
    try:
        with open(path, "rb") as fh:
            same = hashlib.sha256(fh.read()).hexdigest() == want and os.access(path, os.X_OK)
    except OSError:
        same = False
    if same:
        return {"installed": path, "changed": False}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Not the PID alone: hosts in PID namespaces sharing /usr/local (containers) may write at once.
    tmp = f"{path}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    return {"installed": path, "changed": True}


PIN_STATE_DIR = "/run/clusterctl"


def pin_unit(name: str) -> str:
    return f"clusterctl-pin-{name}.service"


def _pin_state(name: str) -> Optional[Dict[str, Any]]:
    try:
        with open(os.path.join(PIN_STATE_DIR, f"pin-{name}.json")) as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return None
    import subprocess

    active = subprocess.run(["systemctl", "is-active", "--quiet", pin_unit(name)]).returncode == 0
    return state if active else None


def pin_op(job: Dict[str, Any]) -> Dict[str, Any]:
    """``pin``: (re)start the model's pin unit with ``budget`` bytes; ``unpin``: stop it.

    Returns per model the pin state (``mode`` mlock/refresh, ``bytes``) once the
    unit has written it (up to ``wait`` seconds), and the residency.
    """
    import subprocess

    out = []
    if job["op"] == "pin":
        install(job["pin"])
    for m in job.get("models", []):
        name, unit = m["name"], pin_unit(m["name"])
        state_file = os.path.join(PIN_STATE_DIR, f"pin-{name}.json")
        subprocess.run(["systemctl", "stop", unit], capture_output=True)
        subprocess.run(["systemctl", "reset-failed", unit], capture_output=True)
        if os.path.exists(state_file):
            os.unlink(state_file)
        row: Dict[str, Any] = {"name": name, "unit": unit}
        lay = layout.Layout(m["path"], name)
        cur = lay.current()
        if job["op"] == "pin":
            if cur is None:
                out.append(dict(row, error=f"{m['path']} is not staged"))
                continue
            run = subprocess.run(
                [
                    "systemd-run",
                    f"--unit={unit}",
                    "--property=LimitMEMLOCK=infinity",
                    f"--description=clusterctl: keep {name} resident",
                    "python3",
                    job["pin"]["path"],
                    m["path"],
                    "--budget",
                    str(int(job["budget"])),
                    "--state",
                    state_file,
                ],
                capture_output=True,
                text=True,
            )
            if run.returncode != 0:
                out.append(dict(row, error=f"systemd-run: {run.stderr.strip() or run.returncode}"))
                continue
            deadline = time.monotonic() + float(job.get("wait", 60))
            while time.monotonic() < deadline and _pin_state(name) is None:
                time.sleep(0.2)
            row["pin"] = _pin_state(name)
            if row["pin"] is None:
                row["error"] = f"{unit} did not report within {job.get('wait', 60)} s (journalctl -u {unit})"
        if cur is not None:
            row["version"] = cur
            row["residency"] = _pagecache().residency(_files(lay, cur))
        out.append(row)
    return {"models": out}


def _drain(stream: BinaryIO) -> None:
    while stream.read(1 << 20):
        pass


def main(argv: Optional[List[str]] = None) -> int:
    """Job from stdin's first line; ``argv[0]``, if given, is JSON merged over it (per-host parts)."""
    args = sys.argv[1:] if argv is None else argv
    stdin = sys.stdin.buffer
    line = stdin.readline()
    try:
        job = json.loads(line)
        if args:
            job.update(json.loads(args[0]))
        if job.get("announce"):
            # the controller starts a chain's other hosts once its head runs (see stage/run.py)
            sys.stderr.write(STARTED_MARK + "\n")
            sys.stderr.flush()
        if (job.get("source") or {}).get("kind") == "stream" and (job.get("relay") or {}).get("upstreams"):
            # Every host got the pushed frames; only the head of the chain reads them.
            threading.Thread(target=_drain, args=(stdin,), daemon=True).start()
        op = job.get("op")
        if op == "stage":
            result = stage(job, stdin)
        elif op == "status":
            result = status(job)
        elif op in ("warm", "evict"):
            result = cache_op(job)
        elif op == "install":
            result = install(job)
        elif op in ("pin", "unpin"):
            result = pin_op(job)
        else:
            raise mf.ManifestError(f"unknown op {op!r}")
        result["ok"] = True
        rc = 0
    except fetch.DiskSpaceError as e:
        result, rc = {"ok": False, "kind": "disk_space", "error": str(e)}, 1
    except fetch.FetchError as e:
        result, rc = {"ok": False, "kind": "fetch", "error": str(e)}, 1
    except layout.LayoutError as e:
        result, rc = {"ok": False, "kind": "layout", "error": str(e)}, 1
    except (mf.ManifestError, KeyError, ValueError) as e:
        result, rc = {"ok": False, "kind": "manifest", "error": f"{type(e).__name__}: {e}"}, 1
    except OSError as e:
        result, rc = {"ok": False, "kind": "os", "error": f"{e.filename or ''}: {e.strerror or e}"}, 1
    result["host"] = socket.gethostname()
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return rc
