"""Node-side part of ``clusterctl collect`` (stdlib only, Python 3.8+, read-only).

Piped to ``python3 -`` with one JSON argument: ``{"instances": {name:
{"unit", "port", "host"}}, "journal": bool, "lines": N, "timeout_s": T}``.
For every instance it takes one ``/metrics`` sample (fetched with urllib on
the node, so nothing but SSH is needed from the control side) and, with
``journal``, the unit's journal (``journalctl -u UNIT -o short-iso``,
verbatim).  The control side runs it twice, ``--interval`` apart, for the two
samples.  Prints one JSON document; never fails on a missing tool.
"""

import json
import os
import subprocess
import sys
import urllib.request
from datetime import datetime, timezone


def now():
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def journal(unit, lines, timeout):
    argv = ["journalctl", "-u", unit, "--no-pager", "-o", "short-iso", "-n", str(lines)]
    rec = {"argv": argv, "started_at": now()}
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                           timeout=timeout, env=dict(os.environ, SYSTEMD_PAGER="", SYSTEMD_COLORS="0"))
        rec.update(rc=p.returncode, stdout=p.stdout.decode("utf-8", "replace"),
                   stderr=p.stderr.decode("utf-8", "replace"))
    except FileNotFoundError:
        rec.update(rc=None, stdout="", stderr="journalctl not found")
    except subprocess.TimeoutExpired:
        rec.update(rc=None, stdout="", stderr="timed out after %s s" % timeout)
    return rec


def metrics(host, port, timeout):
    url = "http://%s:%d/metrics" % (host, port)
    rec = {"url": url, "at": now()}
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            rec["text"] = r.read(8 << 20).decode("utf-8", "replace")
            rec["status"] = r.status
    except Exception as e:  # noqa: BLE001 - any failure is recorded, not raised
        rec["error"] = "%s: %s" % (type(e).__name__, e)
    return rec


def main():
    spec = json.loads(sys.argv[1])
    timeout = float(spec.get("timeout_s", 5))
    out = {"collected_at": now(), "instances": {}}
    for name, i in spec.get("instances", {}).items():
        rec = {"metrics": metrics(i.get("host") or "127.0.0.1", int(i["port"]), timeout)}
        if spec.get("journal"):
            rec["journal"] = journal(i["unit"], int(spec.get("lines", 5000)), timeout)
        out["instances"][name] = rec
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
