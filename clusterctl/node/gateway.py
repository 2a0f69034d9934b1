"""The gateway's node program: run on a gateway host as ``python3 -I -B -c SOURCE``.

Stdlib only (Python 3.8+).  One JSON job on stdin (it may hold the upstream
API key, so never a command line), one JSON line on stdout.

``{"op": "apply", "files": [{"path", "text", "mode", "group"}], "digest"}``
(``text`` null: the file must not exist): compare every file with what the host has; when nothing differs answer
``changed: false`` and touch nothing.  Otherwise keep a copy of each old
file, write the new ones (temporary name in the same directory, chmod, chown
root:GROUP, rename), run ``nginx -t`` and, when it fails, put every old file
back (removing files that did not exist) and answer ``ok: false`` with
nginx's message.  When it passes: ``systemctl reload nginx`` if nginx is
running (a graceful reload: old workers finish their requests, bounded by
``worker_shutdown_timeout``), else enable and start it; then wait until a fresh connection
can only reach the new configuration: every worker the master had before the reload has
left or closed its listening sockets (its title says ``is shutting down``: nginx sets it just
before it closes them and accepts nothing after), and one ``/gateway/health`` request reports
the new digest (polled every POLL_S, within HEALTH_WAIT_S).  When the master's workers cannot
be read (no pid file ``job["pid_file"]``, default /run/nginx.pid, or not nginx's), it waits as
it did before: the new digest on HEALTH_AGREE fresh connections in a row, 50 ms apart.

``"vrrp": {HOST: [files]}`` in an apply job: keepalived's files per gateway host (``gateway.vip``);
this host takes its own (its inventory name is the program's one argument), writes the changed
ones, checks them with ``keepalived -t`` (the old files back when it refuses) and reloads
keepalived (enable and start the first time).  ``"vrrp": {}``: no floating address: a keepalived
configuration clusterctl wrote (it carries the mark) is stopped and removed.  Run after nginx's
part, whose result it joins (``vrrp``: ``unchanged``, ``reloaded``, ``started``, ``removed``).

``{"op": "status", "port", "vip"}``: nginx's unit state and ``/gateway/health``; with ``vip``
keepalived's unit state and whether this host holds the address now.

``{"op": "scores", "port", "token", "scores"}``: POST the instance scores to the
loopback admin endpoint (``/gateway/scores``) with the admin token, which only
root and the nginx workers can read; the njs router reads them per request.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from typing import Any

HEALTH_WAIT_S = 15.0
HEALTH_AGREE = 8
POLL_S = 0.01
PROC = "/proc"
PID_FILE = "/run/nginx.pid"


def _out(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _read(path: str) -> bytes | None:
    """The file's bytes; None when it does not exist, or is a ``/proc/PID`` file of a process
    that is exiting (reading it then fails with ESRCH, not ENOENT)."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _write(path: str, data: bytes, mode: int, group: str) -> None:
    d = os.path.dirname(path)
    os.makedirs(d, mode=0o755, exist_ok=True)
    tmp = os.path.join(d, ".%s.clusterctl-tmp" % os.path.basename(path))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    gid = grp.getgrnam(group).gr_gid if group != "root" else 0
    os.chown(tmp, 0, gid)
    os.chmod(tmp, mode)
    os.rename(tmp, path)


def _run(argv: list[str], timeout: float = 60, session: bool = False) -> tuple[int, str]:
    try:
        p = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, start_new_session=session
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)
    return p.returncode, (p.stdout + p.stderr).decode("utf-8", "replace").strip()


def _health(port: int, timeout: float = 2.0) -> dict[str, Any]:
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/gateway/health" % port, timeout=timeout) as r:
            body: dict[str, Any] = json.loads(r.read().decode())
            return body
    except Exception as e:  # noqa: BLE001 - any failure is "not healthy"
        return {"error": str(e)}


def _proc_stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time in clock ticks) of ``pid``; None when it has gone."""
    raw = _read("%s/%d/stat" % (PROC, pid))
    if raw is None:
        return None
    rest = raw.decode("utf-8", "replace").rsplit(")", 1)[-1].split()
    return int(rest[1]), rest[19]


def _title(pid: int) -> str:
    raw = _read("%s/%d/cmdline" % (PROC, pid)) or b""
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def _workers(pid_file: str) -> dict[int, str] | None:
    """The nginx master's worker processes now: pid -> start time (a pid reused later is not the
    same worker); None when the master cannot be found (no pid file, or not nginx's)."""
    try:
        master = int((_read(pid_file) or b"").decode().strip())
    except ValueError:
        return None
    if not _title(master).startswith("nginx: master process"):
        return None
    out: dict[int, str] = {}
    try:
        names = os.listdir(PROC)
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        st = _proc_stat(int(name))
        if st is not None and st[0] == master and _title(int(name)).startswith("nginx: worker process"):
            out[int(name)] = st[1]
    return out


def _still_accepting(old: dict[int, str]) -> list[int]:
    """The workers of ``old`` that may still accept a connection: alive (same start time), titled
    as a worker and not shutting down (nginx retitles a worker just before it closes its listening
    sockets).  An exiting worker has released its memory, so its title reads empty (seen between
    the shutting-down title and its exit): it runs no more code and accepts nothing."""
    out = []
    for pid, started in sorted(old.items()):
        st = _proc_stat(pid)
        if st is None or st[1] != started:
            continue
        title = _title(pid)
        if title.startswith("nginx: worker process") and "shutting down" not in title:
            out.append(pid)
    return out


def confirm_config(port: int, want: str, old: dict[int, str] | None, wait_s: float = HEALTH_WAIT_S) -> dict[str, Any]:
    """Wait until a fresh connection to ``/gateway/health`` on ``port`` can only reach config ``want``.

    ``old``: the master's workers before the reload (:func:`_workers`; ``{}`` for a fresh start):
    none of them may still accept (gone or shutting down), then one health answer with ``want``.
    None (unknown): HEALTH_AGREE answers with ``want`` in a row instead.  Returns ``{"ok": True,
    "polls": N}`` or ``{"ok": False, "health": LAST, "accepting": OLD PIDS}`` after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    health: dict[str, Any] = {}
    agree = polls = 0
    need = 1 if old is not None else HEALTH_AGREE
    accepting: list[int] = []
    while time.monotonic() < deadline:
        accepting = _still_accepting(old) if old else []
        if not accepting:
            health = _health(port)
            polls += 1
            agree = agree + 1 if health.get("config") == want else 0
            if agree >= need:
                return {"ok": True, "polls": polls}
        time.sleep(POLL_S if old is not None else 0.05)
    return {"ok": False, "health": health, "accepting": accepting}


def _active() -> bool:
    return _run(["systemctl", "is-active", "nginx.service"])[1].splitlines()[-1:] == ["active"]


#: Debian/Ubuntu packages of nginx and its njs module (the gateway routes by model with njs).
PACKAGES = ("nginx-light", "libnginx-mod-http-js")


def ensure_nginx() -> str | None:
    """Install nginx and njs with apt-get when nginx is missing; the reason when it cannot be had."""
    if shutil.which("nginx"):
        return None
    if not shutil.which("apt-get"):
        return (
            "nginx is not installed and this host has no apt-get: install nginx with the njs module "
            "(e.g. nginx and nginx-module-njs), then run gateway deploy again"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    p = subprocess.run(
        ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    if p.returncode != 0 or not shutil.which("nginx"):
        tail = p.stdout.decode("utf-8", "replace").strip().splitlines()[-3:]
        return "installing %s failed: %s" % (" ".join(PACKAGES), " | ".join(tail))
    # Debian starts nginx on install with its default site; the gateway's config replaces it below.
    return None


def ensure_runtime(job: dict[str, Any]) -> None:
    """The workers' directory (scores, pick counters; owned by www-data) and the admin token
    (0640 root:www-data, made once) for least_score dispatch."""
    rt = job.get("runtime") or {}
    if not rt:
        return
    www = grp.getgrnam("www-data").gr_gid
    uid = __import__("pwd").getpwnam("www-data").pw_uid
    for d in (rt["state_dir"], rt["state_dir"] + "/picks"):
        os.makedirs(d, mode=0o750, exist_ok=True)
        os.chown(d, uid, www)
        os.chmod(d, 0o750)
    if _read(rt["token"]) is None:
        _write(rt["token"], (__import__("secrets").token_hex(32) + "\n").encode(), 0o640, "www-data")


def scores(job: dict[str, Any]) -> dict[str, Any]:
    """POST the instance scores to the local admin endpoint (njs writes them for the workers)."""
    token = (_read(job["token"]) or b"").decode().strip()
    req = urllib.request.Request(
        "http://127.0.0.1:%d/gateway/scores" % int(job["port"]),
        data=json.dumps(job["scores"]).encode(),
        headers={"Content-Type": "application/json", "X-Gateway-Admin": token},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return {"ok": True, "answer": json.loads(r.read().decode())}
    except Exception as e:  # noqa: BLE001 - the host's row says why
        return {"ok": False, "kind": "scores", "error": "posting the scores failed: %s" % e}


def apply(job: dict[str, Any]) -> dict[str, Any]:
    why = ensure_nginx()
    if why:
        return {"ok": False, "error": why}
    ensure_runtime(job)
    files = job["files"]
    # text None: a file this gateway no longer has (the auth file once api_key is gone)
    new = [
        (f["path"], None if f["text"] is None else f["text"].encode(), int(f["mode"]), f.get("group", "root"))
        for f in files
    ]
    live = {f["path"] for f in files if f.get("live")}
    old = {p: _read(p) for p, _, _, _ in new}
    changed = [p for p, data, _, _ in new if old[p] != data]
    running = _active()
    if not changed and running:
        return {"ok": True, "changed": False, "reloaded": False}
    for path, data, mode, group in new:
        if path in changed:
            if data is None:
                os.unlink(path)
            else:
                _write(path, data, mode, group)
    if running and all(p in live for p in changed):
        # njs reads these per request (the client keys): live once renamed into place, no reload
        return {"ok": True, "changed": True, "reloaded": False, "action": "updated", "files": changed}
    rc, text = _run(["nginx", "-t"])
    if rc != 0:
        for path, _, mode, group in new:
            if path not in changed:
                continue
            before = old[path]
            if before is None:
                if os.path.exists(path):
                    os.unlink(path)
            else:
                _write(path, before, mode, group)
        return {
            "ok": False,
            "kind": "nginx-t",
            "changed": False,
            "error": "nginx -t refused the new configuration (the old one is kept):\n" + text,
        }
    if running:
        # a graceful reload: until the master has told these to stop, they may accept a connection
        workers = _workers(str(job.get("pid_file") or PID_FILE))
        rc, text = _run(["systemctl", "reload", "nginx.service"])
        action = "reloaded"
    else:
        _run(["systemctl", "enable", "nginx.service"])
        workers = {}  # a fresh master: every worker it has runs the new configuration
        rc, text = _run(["systemctl", "start", "nginx.service"])
        action = "started"
    if rc != 0:
        return {
            "ok": False,
            "kind": "reload",
            "changed": True,
            "error": "systemctl %s nginx failed: %s" % ("reload" if running else "start", text),
        }
    want = job.get("digest", "")[:16]
    seen = confirm_config(int(job["port"]), want, workers)
    if seen["ok"]:
        return {"ok": True, "changed": True, "reloaded": action == "reloaded", "action": action, "files": changed}
    still = " (old workers still accepting: %s)" % seen["accepting"] if seen["accepting"] else ""
    return {
        "ok": False,
        "kind": "health",
        "changed": True,
        "error": "nginx was %s but /gateway/health does not report config %s: %s%s"
        % (action, want, seen["health"], still),
    }


def _unit_state(unit: str) -> str:
    return (_run(["systemctl", "is-active", unit])[1].splitlines() or ["unknown"])[-1]


def holds(address: str) -> bool:
    """Whether ``address`` is one of this host's IPv4 addresses now."""
    rc, text = _run(["ip", "-o", "-4", "addr", "show"])
    return rc == 0 and any(w.split("/")[0] == address for line in text.splitlines() for w in line.split())


VRRP_MARK = "# clusterctl gateway: floating address"
KEEPALIVED = "keepalived.service"


def _secret_free(text: str, files: list[dict[str, Any]]) -> str:
    """keepalived's messages with any auth_pass value of ``files`` replaced (they may quote lines)."""
    for f in files:
        for line in (f.get("text") or "").splitlines():
            w = line.split()
            if len(w) == 2 and w[0] == "auth_pass":
                text = text.replace(w[1], "***")
    return text


def apply_vrrp(job: dict[str, Any], host: str) -> dict[str, Any]:
    """keepalived's part of an apply (module doc); ``{}`` when the job says nothing about it."""
    if "vrrp" not in job:
        return {}
    files = (job["vrrp"] or {}).get(host)
    if files is None:
        marked = [
            p
            for p in ("/etc/keepalived/keepalived.conf", "/etc/keepalived/clusterctl-check-nginx")
            if (_read(p) or b"").decode("utf-8", "replace").find(VRRP_MARK) >= 0
        ]
        if not marked:
            return {}
        _run(["systemctl", "disable", "--now", KEEPALIVED])
        for p in marked:
            os.unlink(p)
        return {"vrrp": "removed"}
    if not shutil.which("keepalived"):
        if not shutil.which("apt-get"):
            return {
                "ok": False,
                "kind": "keepalived",
                "error": "keepalived is not installed and this host has "
                "no apt-get: install keepalived, then run gateway deploy again",
            }
        inst = subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "keepalived"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
        )
        if inst.returncode != 0 or not shutil.which("keepalived"):
            tail = inst.stdout.decode("utf-8", "replace").strip().splitlines()[-3:]
            return {"ok": False, "kind": "keepalived", "error": "installing keepalived failed: " + " | ".join(tail)}
    new = [(f["path"], f["text"].encode(), int(f["mode"])) for f in files]
    old = {p: _read(p) for p, _, _ in new}
    changed = [p for p, data, _ in new if old[p] != data]
    running = _unit_state(KEEPALIVED) == "active"
    if not changed and running:
        return {"vrrp": "unchanged"}
    for path, data, mode in new:
        if path in changed:
            _write(path, data, mode, "root")
    # its own session: keepalived 2.2.7's config test signals its whole process group when it ends
    rc, text = _run(["keepalived", "-t", "-l", "-f", "/etc/keepalived/keepalived.conf"], session=True)
    if rc != 0:
        for path, _, mode in new:
            if path in changed:
                if old[path] is None:
                    os.unlink(path)
                else:
                    _write(path, old[path] or b"", mode, "root")
        return {
            "ok": False,
            "kind": "keepalived-t",
            "vrrp": "refused",
            "error": "keepalived -t refused the new configuration (the old one is kept):\n" + _secret_free(text, files),
        }
    if running:
        rc, text = _run(["systemctl", "reload", KEEPALIVED])
        action = "reloaded"
    else:
        _run(["systemctl", "enable", KEEPALIVED])
        rc, text = _run(["systemctl", "restart", KEEPALIVED])
        action = "started"
    if rc != 0:
        return {
            "ok": False,
            "kind": "keepalived",
            "vrrp": "failed",
            "error": "systemctl %s keepalived failed: %s"
            % (action[:-2] if running else "start", _secret_free(text, files)),
        }
    return {"vrrp": action}


def status(job: dict[str, Any]) -> dict[str, Any]:
    out = {"ok": True, "active": _unit_state("nginx.service"), "health": _health(int(job["port"]))}
    if job.get("vip"):
        out["keepalived"] = _unit_state(KEEPALIVED)
        out["holds_vip"] = holds(job["vip"])
    return out


def apply_all(job: dict[str, Any]) -> dict[str, Any]:
    """nginx's files, then (when nginx's part went well) keepalived's."""
    out = apply(job)
    if out.get("ok"):
        v = apply_vrrp(job, sys.argv[1] if len(sys.argv) > 1 else "")
        if v.get("ok") is False:
            return {**out, **v, "changed": out.get("changed")}
        out.update(v)
    return out


def main() -> None:
    try:
        job = json.loads(sys.stdin.readline())
        op = {"apply": apply_all, "status": status, "scores": scores}[job["op"]]
        _out(op(job))
    except Exception as e:  # noqa: BLE001 - one JSON line, whatever happened
        _out({"ok": False, "kind": "node", "error": "%s: %s" % (type(e).__name__, e)})


if __name__ == "__main__":
    main()
