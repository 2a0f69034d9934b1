"""Node side of deploy: one JSON job on stdin, one JSON result line on stdout.

Runs on the node's own ``python3`` (3.8+, standard library only), shipped by
:mod:`clusterctl.deploy.remote` as a ``python3 -I -B -c`` program.  The job
goes on stdin because it may carry environment files with secrets; nothing
secret is ever printed back: environment files are reported as a digest and
per-key salted hashes (the salt is a random value of the control run).

Ops (``job["op"]``):

* ``read``: every ``clusterctl-*.service`` unit (text, the node-computed
  digest of unit + env, the env's keys with salted value hashes, ``systemctl
  show`` state), the lock, the ``previous/`` copies and, per model path asked
  for, the staged version it points at.
* ``lock`` / ``unlock``: the deploy lock (``O_EXCL``; stale after ``ttl_s``
  or broken on request); ``unlock`` also appends an audit record.
* ``apply``: check the ``relink`` targets, run the set-up scripts (service user, verify-model), save
  previous copies, stop+remove what ``remove`` lists, switch the model links of ``relink``, stop
  what ``stop`` lists, write unit and env files (temp + rename, env 0600 root), ``daemon-reload``,
  enable/disable, restart or start only what is listed: one ``systemctl`` call per verb with
  every unit of the host, each failed unit named.
* ``rollback``: put back the previous unit, env and model symlink of each
  instance (swapping, so a second rollback goes forward again), restart.
"""

from __future__ import annotations

import glob
import hashlib
import hmac
import json
import os
import re
import subprocess
import sys
import time

UNIT_DIR = "/etc/systemd/system"
ENV_DIR = "/etc/clusterctl/instances"
STATE_DIR = "/var/lib/clusterctl/deploy"
PREVIOUS_DIR = STATE_DIR + "/previous"
LOCK_PATH = "/var/lib/clusterctl/deploy.lock"
AUDIT_PATH = STATE_DIR + "/audit.jsonl"
PREFIX = "clusterctl-"
SHOW_PROPS = (
    "Id,LoadState,ActiveState,SubState,NRestarts,MainPID,UnitFileState,ExecMainStartTimestampMonotonic,"
    "Result,ExecMainStatus"
)
#: Journal lines read for an instance that is not running (why it went down); of those only the
#: ones clusterctl.diagnose.unitlog can use and the last few travel back.
JOURNAL_LINES = 300
JOURNAL_KEEP = re.compile(
    r"Error|Exception|exited|Failed|failed|Stopped|Stopping|Deactivated|"
    r"repeated too quickly|Started|Starting|Scheduled restart"
)


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _write_atomic(path, text, mode=0o644):
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, ".%s.tmp-%d" % (os.path.basename(path), os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _unit_path(name):
    return "%s/%s%s.service" % (UNIT_DIR, PREFIX, name)


def _env_path(name):
    return "%s/%s.env" % (ENV_DIR, name)


def _unit(name):
    return "%s%s.service" % (PREFIX, name)


def digest_of(unit_text, env_text):
    h = hashlib.sha256()
    h.update(unit_text.encode())
    h.update(b"\0")
    h.update(env_text.encode())
    return h.hexdigest()


def env_hashes(env_text, salt):
    out = {}
    for line in env_text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.lstrip().startswith("#"):
            out[key.strip()] = hmac.new(salt.encode(), value.encode(), hashlib.sha256).hexdigest()[:16]
    return out


def _systemctl(*args, timeout=120):
    p = subprocess.run(
        ["systemctl"] + list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
        timeout=timeout,
    )
    return p.returncode, p.stdout, p.stderr.strip()


def _show(units):
    if not units:
        return {}
    _, out, _ = _systemctl("show", "-p", SHOW_PROPS, *units)
    states, cur = {}, {}
    for line in out.splitlines() + [""]:
        if not line.strip():
            if cur.get("Id"):
                states[cur["Id"]] = cur
            cur = {}
            continue
        k, _, v = line.partition("=")
        cur[k] = v
    return states


def _x_section(unit_text):
    out, inside = {}, False
    for line in unit_text.splitlines():
        s = line.strip()
        if s.startswith("["):
            inside = s == "[X-Clusterctl]"
            continue
        if inside and "=" in s:
            k, _, v = s.partition("=")
            out[k.strip()] = v.strip().replace("\\\\", "\\")  # units.x_value doubles backslashes
    return out


def _model_state(path):
    """What a model path points at: the version and whether it carries the verified marker."""
    real = os.path.realpath(path)
    marker = _read(os.path.join(real, ".clusterctl-verified"))
    info = {
        "path": path,
        "exists": os.path.exists(real),
        "target": os.readlink(path) if os.path.islink(path) else None,
        "verified": marker is not None,
        "version": None,
    }
    if marker:
        try:
            info["version"] = json.loads(marker).get("version")
        except ValueError:
            pass
    return info


def read_lock():
    text = _read(LOCK_PATH)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = {"holder": "unreadable lock file"}
    try:
        data["age_s"] = round(time.time() - os.stat(LOCK_PATH).st_mtime, 1)
    except FileNotFoundError:
        return None
    return data


def op_read(job):
    salt = job.get("salt", "")
    names = sorted(
        os.path.basename(p)[len(PREFIX) : -len(".service")] for p in glob.glob("%s/%s*.service" % (UNIT_DIR, PREFIX))
    )
    names = [n for n in names if n]
    states = _show([_unit(n) for n in names])
    instances = {}
    for n in names:
        unit_text = _read(_unit_path(n)) or ""
        env_text = _read(_env_path(n))
        st = states.get(_unit(n), {})
        instances[n] = {
            "unit_text": unit_text,
            "x": _x_section(unit_text),
            "env_present": env_text is not None,
            "digest": digest_of(unit_text, env_text or ""),
            "env_hashes": env_hashes(env_text or "", salt),
            "active": st.get("ActiveState", "unknown"),
            "sub": st.get("SubState", "unknown"),
            "restarts": int(st.get("NRestarts") or 0),
            "main_pid": int(st.get("MainPID") or 0),
            "enabled": st.get("UnitFileState", ""),
            "started_mono": int(st.get("ExecMainStartTimestampMonotonic") or 0),
            "result": st.get("Result", ""),
            "exit_status": st.get("ExecMainStatus", ""),
        }
        if instances[n]["active"] in ("inactive", "failed") or instances[n]["sub"] == "auto-restart":
            instances[n]["journal_tail"] = _journal_tail(_unit(n))
    previous = sorted(os.listdir(PREVIOUS_DIR)) if os.path.isdir(PREVIOUS_DIR) else []
    models = {p: _model_state(p) for p in job.get("model_paths", [])}
    users = {u: _user_exists(u) for u in job.get("users", [])}
    return {
        "ok": True,
        "instances": instances,
        "lock": read_lock(),
        "previous": previous,
        "models": models,
        "users": users,
        "systemd_version": _systemd_version(),
        "gpu_uuids": _gpu_uuids(job.get("gpu_lister")),
        "gids": {p: _gids(p) for p in job.get("rdma_ports", [])},
    }


def _gids(dev_port, root="/"):
    """The populated GID table of RDMA port ``DEV:PORT`` (``/sys/class/infiniband/DEV/ports/PORT``):
    ``[{index, gid, type}]`` as the probe's collector reads it; None when the port does not exist."""
    dev, _, port = dev_port.rpartition(":")
    base = os.path.join(root, "sys/class/infiniband/%s/ports/%s" % (dev, port))
    if "/" in dev_port or not dev or not port.isdigit() or not os.path.isdir(base):
        return None

    def text(path):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read().strip()
        except OSError:  # an unpopulated entry fails with EINVAL
            return ""

    try:
        names = sorted((n for n in os.listdir(base + "/gids") if n.isdigit()), key=int)
    except OSError:
        names = []
    out = []
    for name in names:
        gid = text(base + "/gids/" + name)
        if gid and set(gid.replace(":", "")) - {"0"}:  # unpopulated entries read as zeros
            out.append({"index": int(name), "gid": gid, "type": text(base + "/gid_attrs/types/" + name)})
    return out


def _gpu_uuids(lister):
    """``{index: uuid}`` from ``check-gpus --list`` (its source comes with the job), None when
    not asked or NVML cannot answer."""
    if not lister:
        return None
    try:
        p = subprocess.run(
            [sys.executable, "-I", "-c", lister, "--list"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            universal_newlines=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    out = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            out[parts[0]] = parts[1]
    return out


def _journal_tail(unit):
    """The unit's last journal lines (``-o cat``), "" when journalctl cannot answer."""
    try:
        p = subprocess.run(
            ["journalctl", "-u", unit, "--no-pager", "-o", "cat", "-n", str(JOURNAL_LINES)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            universal_newlines=True,
            timeout=15,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = p.stdout.splitlines()
    kept = [ln for i, ln in enumerate(lines) if JOURNAL_KEEP.search(ln) or i >= len(lines) - 5]
    return "\n".join(kept)[-16000:]


def _systemd_version():
    """systemd's version number (``systemctl --version``: "systemd 252 (252.30-1~deb12u2)"), else None."""
    try:
        rc, out, _ = _systemctl("--version", timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = out.split()
    if rc == 0 and len(words) >= 2 and words[0] == "systemd":
        digits = ""
        for ch in words[1]:
            if not ch.isdigit():
                break
            digits += ch
        return int(digits) if digits else None
    return None


def _user_exists(user):
    import pwd

    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def op_lock(job):
    me = job["lock"]
    held = read_lock()
    if held is not None and held.get("run_id") == me["run_id"]:
        return {"ok": True, "lock": held, "recovered": None}
    recovered = None
    text = json.dumps(me, sort_keys=True) + "\n"
    os.makedirs(os.path.dirname(LOCK_PATH), exist_ok=True)
    try:
        fd = os.open(LOCK_PATH, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        held = read_lock()
        if held is None:  # released between our two looks: try once more
            return op_lock(job)
        stale = held.get("age_s", 0) > job.get("ttl_s", 3600)
        if not (stale or job.get("break")):
            return {
                "ok": False,
                "kind": "locked",
                "lock": held,
                "error": "deploy lock held by %s (pid %s, run %s) since %s"
                % (held.get("holder"), held.get("pid"), held.get("run_id"), held.get("time")),
            }
        recovered = held
        _write_atomic(LOCK_PATH, text)
        return {"ok": True, "lock": me, "recovered": recovered}
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return {"ok": True, "lock": me, "recovered": None}


def _append_audit(record):
    os.makedirs(STATE_DIR, exist_ok=True)
    fd = os.open(AUDIT_PATH, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def op_unlock(job):
    if job.get("audit"):
        _append_audit(job["audit"])
    held = read_lock()
    if held is not None and held.get("run_id") == job["run_id"]:
        _remove(LOCK_PATH)
    return {"ok": True}


def _save_previous(name, model_path, model_before=None, run_id=""):
    """Copy what ``name`` has now into previous/ (an ``.absent`` marker when nothing).

    ``model_before``: the model symlink's target as read before this deploy
    staged (staging may already have switched it); else read now.
    """
    unit_text = _read(_unit_path(name))
    base = os.path.join(PREVIOUS_DIR, name)
    _write_atomic(base + ".run", run_id)
    if unit_text is None:
        _write_atomic(base + ".absent", "")
        for ext in (".service", ".env", ".model"):
            _remove(base + ext)
        return
    _write_atomic(base + ".service", unit_text)
    _write_atomic(base + ".env", _read(_env_path(name)) or "", 0o600)
    if model_path and (model_before or os.path.islink(model_path)):
        target = model_before or os.readlink(model_path)
        _write_atomic(base + ".model", json.dumps({"path": model_path, "target": target}))
    else:
        _remove(base + ".model")
    _remove(base + ".absent")


def _point(path, target):
    tmp = "%s.clusterctl-tmp-%d" % (path, os.getpid())
    _remove(tmp)
    os.symlink(target, tmp)
    os.rename(tmp, path)


#: systemctl verbs that may be run again on one unit without a second effect: a failed call with
#: every unit is redone unit by unit to name the failed ones (and still do the others).
_IDEMPOTENT = ("stop", "enable", "disable", "reset-failed")
#: The states a unit is in after a ``start``/``restart`` job that did not fail.
_STARTED = ("active", "activating", "reloading")


def _run_units(verb, units, errors):
    """One ``systemctl VERB`` call with every unit of ``units``; ``errors[unit]`` for each that failed.

    systemd runs the jobs of one call at once (a host's units restart together, not one after
    the other).  When the call fails, each failed unit is named: an idempotent verb is run again
    unit by unit; ``start``/``restart`` (not run twice) blame the units systemctl's message names,
    else those not active afterwards (``systemctl show``), else every unit of the call.
    """
    units = list(dict.fromkeys(units))
    if not units:
        return
    rc, _, err = _systemctl(verb, *units)
    if rc == 0:
        return
    if len(units) == 1:
        errors[units[0]] = "systemctl %s %s: %s" % (verb, units[0], err or "rc %d" % rc)
        return
    if verb in _IDEMPOTENT:
        for u in units:
            rc1, _, err1 = _systemctl(verb, u)
            if rc1 != 0:
                errors[u] = "systemctl %s %s: %s" % (verb, u, err1 or "rc %d" % rc1)
        return
    lines = (err or "").splitlines()
    named = {u: "; ".join(ln.strip() for ln in lines if u in ln) for u in units}
    blamed = {u: why for u, why in named.items() if why}
    if not blamed:
        states = _show(units)
        blamed = {
            u: "%s after the call (%s)" % (states[u].get("ActiveState"), err or "rc %d" % rc)
            for u in units
            if u in states and states[u].get("ActiveState") not in _STARTED
        }
    if not blamed:
        blamed = {u: err or "rc %d" % rc for u in units}
    for u, why in blamed.items():
        errors[u] = "systemctl %s %s: %s" % (verb, u, why)


def _relink_error(m):
    """Why the model link ``m`` (``path``, ``target`` relative to the path's directory, optional
    ``version``) cannot be switched, else None: a missing target, or (with ``version``) one
    without the verified marker of that version."""
    full = os.path.join(os.path.dirname(m["path"]), m["target"])
    if not os.path.isdir(full):
        return "%s: target %s is missing; link not switched" % (m["path"], m["target"])
    if m.get("version") is None:
        return None
    marker = _read(os.path.join(full, ".clusterctl-verified"))
    try:
        got = json.loads(marker).get("version") if marker else None
    except ValueError:
        got = None
    if marker is None or got != m["version"]:
        return "%s: target %s is not the verified version %s; link not switched" % (
            m["path"],
            m["target"],
            m["version"],
        )
    return None


def _setup(job, errors):
    """Run the node set-up scripts (service user, verify-model) as root; POSIX sh, idempotent."""
    for script in job.get("setup_scripts", []):
        p = subprocess.run(
            ["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120
        )
        if p.returncode != 0:
            errors["setup"] = "node set-up failed: " + (p.stderr.strip() or "rc %d" % p.returncode)
            return


def op_apply(job):
    """Apply one host's job (see the module docstring); one ``systemctl`` call per verb for every unit.

    ``relink``: model links to point at ``target``.  An entry with ``version`` (deploy's switch
    to a pre-staged version) is checked before anything is touched: a missing or unverified
    target fails the job (``kind`` ``relink``) with nothing changed.  One without (a failed
    surge putting the old link back) whose target is missing is reported in ``errors``.
    """
    errors = {}
    bad = {
        m["path"]: why
        for m in job.get("relink", [])
        if m.get("version") is not None
        for why in [_relink_error(m)]
        if why
    }
    if bad:
        return {"ok": False, "kind": "relink", "errors": bad, "error": "; ".join(bad.values())}
    _setup(job, errors)
    if errors:
        return {"ok": False, "kind": "setup", "errors": errors, "error": "; ".join(errors.values())}
    run_id = job.get("run_id", "")
    for item in job.get("write", []):
        _save_previous(item["instance"], item.get("model_path"), item.get("model_before"), run_id)
    removed = job.get("remove", [])
    for name in removed:
        _save_previous(name, None, None, run_id)
    _run_units("stop", [_unit(n) for n in removed], errors)
    if removed and _systemctl("disable", *[_unit(n) for n in removed])[0] != 0:
        for name in removed:  # one unit's failure may leave the others enabled; as before, not an error
            _systemctl("disable", _unit(name))
    for name in removed:
        _remove(_unit_path(name))
        _remove(_env_path(name))
    for name in job.get("forget", []):  # a surge unit (deploy --surge): no copy for rollback to bring back
        for ext in (".service", ".env", ".model", ".absent", ".run"):
            _remove(os.path.join(PREVIOUS_DIR, name) + ext)
    for m in job.get("relink", []):  # a pre-staged version switched to; a failed surge's old link put back
        why = _relink_error(m)
        if why:
            errors["relink " + m["path"]] = why
        else:
            _point(m["path"], m["target"])
    # units stopped before anything is written or started (a multi-node replica's members)
    _run_units("stop", [_unit(n) for n in job.get("stop", [])], errors)
    for item in job.get("write", []):
        name = item["instance"]
        _write_atomic(_env_path(name), item["env_text"], 0o600)
        _write_atomic(_unit_path(name), item["unit_text"])
    rc, _, err = _systemctl("daemon-reload")
    if rc != 0:
        return {"ok": False, "kind": "daemon-reload", "error": err}
    if removed:
        _systemctl("reset-failed", *[_unit(n) for n in removed])
    for verb in ("enable", "disable"):
        _run_units(
            verb,
            [_unit(i["instance"]) for i in job.get("write", []) if i.get("enable", True) == (verb == "enable")],
            errors,
        )
    _run_units("restart", [_unit(n) for n in job.get("restart", [])], errors)
    _run_units("start", [_unit(n) for n in job.get("start", [])], errors)
    return {
        "ok": not errors,
        "errors": errors,
        "kind": "systemctl" if errors else None,
        "error": "; ".join(errors.values()) if errors else None,
    }


def op_rollback(job):
    """Swap each instance's current files with previous/ and (re)start what is back.

    With ``run_id``, only copies saved by that run are restored (a batch
    whose apply never reached a host must not restore an older deploy's).
    """
    errors, restored, removed, missing = {}, [], [], []
    # a multi-node replica's members on this host: stopped before anything is restored, and not started
    # here (the control side starts the workers, then the head, in order)
    hold = job.get("hold", [])
    _run_units("stop", [_unit(n) for n in hold if os.path.exists(_unit_path(n))], errors)
    for name in job.get("instances", []):
        base = os.path.join(PREVIOUS_DIR, name)
        if job.get("run_id") and (_read(base + ".run") or "") != job["run_id"]:
            missing.append(name)
            continue
        prev_unit, prev_env = _read(base + ".service"), _read(base + ".env")
        prev_model = _read(base + ".model")
        absent = os.path.exists(base + ".absent")
        if prev_unit is None and not absent:
            missing.append(name)
            continue
        cur_model_path = json.loads(prev_model)["path"] if prev_model else None
        _save_previous(name, cur_model_path, None, job.get("own_run_id", ""))  # prev_* are in memory
        if absent and prev_unit is None:
            _run_units("stop", [_unit(name)], errors)
            _systemctl("disable", _unit(name))
            _remove(_unit_path(name))
            _remove(_env_path(name))
            removed.append(name)
            continue
        _write_atomic(_env_path(name), prev_env or "", 0o600)
        _write_atomic(_unit_path(name), prev_unit)
        if prev_model:
            m = json.loads(prev_model)
            if os.path.exists(os.path.join(os.path.dirname(m["path"]), m["target"])):
                _point(m["path"], m["target"])
        restored.append(name)
    _systemctl("daemon-reload")
    held = [n for n in hold if os.path.exists(_unit_path(n))]
    if removed or restored or held:
        _systemctl("reset-failed", *[_unit(n) for n in list(dict.fromkeys(removed + restored + held))])
    _run_units("enable", [_unit(n) for n in restored], errors)
    if job.get("restart", True):  # False: the files were written but never started (playbook units step)
        _run_units("restart", [_unit(n) for n in restored if n not in hold], errors)
    return {
        "ok": not errors,
        "restored": restored,
        "removed": removed,
        "missing": missing,
        "held": held,
        "errors": errors,
        "error": "; ".join(errors.values()) if errors else None,
    }


OPS = {"read": op_read, "lock": op_lock, "unlock": op_unlock, "apply": op_apply, "rollback": op_rollback}


def main():
    try:
        job = json.loads(sys.stdin.readline())
        result = OPS[job["op"]](job)
    except Exception as e:  # one JSON line whatever happened
        result = {"ok": False, "kind": "node", "error": "%s: %s" % (type(e).__name__, e)}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
