"""Node-side part of ``clusterctl doctor`` and ``collect`` (stdlib only, Python 3.8+, read-only).

Run as ``python3 -I -B - SPEC`` (from the node cache, ``clusterctl.fleet.cached``) with one JSON argument::

    {"instances": {name: {"unit", "port", "host"}}, "journal": bool, "lines": N,
     "timeout_s": T, "interval_s": I, "probe": {"argv": [...], "timeout_s": P} or absent}

The control side puts the probe's payload (``clusterctl.probe.payload``) in
front of this script as ``PROBE_PAYLOAD = b"..."``.  One run does, at once:

- the probe: ``python3 -I -B - ARGS`` as a child process, the payload on its
  stdin (its own process, so a hung NVML call or ``os._exit`` stays there);
- for every instance, a first ``/metrics`` sample (``GET`` with http.client
  on the node, so nothing but SSH is needed from the control side) and, with
  ``journal``, the unit's journal (``journalctl -u UNIT -o short-iso``,
  verbatim); a second sample ``interval_s`` after the first one started
  (``interval_s`` 0: none).

So a doctor run costs one SSH round trip per host, and the ``/metrics``
interval overlaps the probe's own work.  Prints one JSON document
``{"collected_at", "probe": {"argv", "rc", "stdout", "stderr"}, "instances":
{name: {"metrics", "metrics_2", "journal"}}, "metrics_interval_s"}``; exits 0
whatever the probe or the instances did (their outcomes are in the document).
"""

import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone


def now():
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def journal(unit, lines, timeout):
    argv = ["journalctl", "-u", unit, "--no-pager", "-o", "short-iso", "-n", str(lines)]
    rec = {"argv": argv, "started_at": now()}
    try:
        p = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            env=dict(os.environ, SYSTEMD_PAGER="", SYSTEMD_COLORS="0"),
        )
        rec.update(
            rc=p.returncode, stdout=p.stdout.decode("utf-8", "replace"), stderr=p.stderr.decode("utf-8", "replace")
        )
    except FileNotFoundError:
        rec.update(rc=None, stdout="", stderr="journalctl not found")
    except subprocess.TimeoutExpired:
        rec.update(rc=None, stdout="", stderr="timed out after %s s" % timeout)
    return rec


def metrics(host, port, timeout):
    """One ``GET /metrics``: ``{"url", "at", "text", "status"}`` or ``{"url", "at", "error"}``."""
    import http.client  # ~15 ms; only on hosts that run an instance

    url = "http://%s:%d/metrics" % (host, port)
    rec = {"url": url, "at": now()}
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/metrics", headers={"Accept": "text/plain"})
        r = conn.getresponse()
        body = r.read(8 << 20).decode("utf-8", "replace")
        if r.status == 200:
            rec["text"] = body
        else:
            rec["error"] = "HTTP %d %s" % (r.status, r.reason)
        rec["status"] = r.status
    except Exception as e:  # noqa: BLE001 - any failure is recorded, not raised
        rec["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        conn.close()
    return rec


def run_probe(spec, payload, out):
    """The probe as a child process; its rc and verbatim output go to ``out``."""
    argv = [sys.executable] + list(spec["argv"][1:])
    out.update(argv=argv, started_at=now())
    try:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        out.update(rc=None, stdout="", stderr="cannot start %s: %s" % (argv[0], e))
        return
    try:
        so, se = p.communicate(payload, timeout=float(spec.get("timeout_s", 90)))
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
        se += b"\nclusterctl: the probe took longer than %s s and was killed" % str(spec.get("timeout_s")).encode()
    out.update(rc=p.returncode, stdout=so.decode("utf-8", "replace"), stderr=se.decode("utf-8", "replace"))


def sample_all(insts, key, timeout, out):
    """``/metrics`` of every instance at once, into ``out[name][key]``."""
    threads, got = {}, {}
    for name, i in insts.items():

        def work(name=name, i=i):
            got[name] = metrics(i.get("host") or "127.0.0.1", int(i["port"]), timeout)

        t = threading.Thread(target=work, daemon=True)
        t.start()
        threads[name] = t
    end = time.monotonic() + timeout + 1
    for name, t in threads.items():
        t.join(max(0.0, end - time.monotonic()))
        i = insts[name]
        # a thread still stuck keeps writing to ``got`` only, never to ``out``
        out[name][key] = (
            got.get(name)
            if not t.is_alive()
            else {
                "url": "http://%s:%d/metrics" % (i.get("host") or "127.0.0.1", int(i["port"])),
                "at": now(),
                "error": "no answer within %g s" % (timeout + 1),
            }
        )


def main():
    spec = json.loads(sys.argv[1])
    timeout = float(spec.get("timeout_s", 5))
    interval = float(spec.get("interval_s") or 0)
    insts = spec.get("instances") or {}
    doc = {"collected_at": now(), "instances": {name: {} for name in insts}}
    probe = None
    if spec.get("probe"):
        doc["probe"] = {}
        probe = threading.Thread(
            target=run_probe, args=(spec["probe"], globals().get("PROBE_PAYLOAD", b""), doc["probe"]), daemon=True
        )
        probe.start()
    if insts:
        t1 = time.monotonic()
        sample_all(insts, "metrics", timeout, doc["instances"])
        if spec.get("journal"):
            for name, i in insts.items():
                doc["instances"][name]["journal"] = journal(i["unit"], int(spec.get("lines", 5000)), timeout)
        if interval > 0:
            time.sleep(max(0.0, t1 + interval - time.monotonic()))
            doc["metrics_interval_s"] = round(time.monotonic() - t1, 3)
            sample_all(insts, "metrics_2", timeout, doc["instances"])
    if probe is not None:
        probe.join()
    sys.stdout.write(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main()
