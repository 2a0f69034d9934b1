#!/usr/bin/env python3
"""verify-model: refuse a model path that does not point at a verified version.

Installed on each node as ``/usr/local/lib/clusterctl/verify-model`` by
``clusterctl stage``; a vLLM instance's unit runs it as ``ExecStartPre``, so
restarts and reboots outside clusterctl are covered too::

    ExecStartPre=/usr/local/lib/clusterctl/verify-model /models/qwen3-8b

Exit 0 when MODEL_PATH is a symlink to ``.versions/<name>/<version>`` whose
``.clusterctl-verified`` marker names the sha256 of the manifest beside it
and every file of that manifest has its size; ``--deep`` also re-hashes every
file (reads the whole model).  Exit 1 with one line on stderr otherwise.
Standalone: Python 3 standard library only, no clusterctl import.
"""

import hashlib
import json
import os
import sys

MANIFEST = ".clusterctl-manifest.json"
MARKER = ".clusterctl-verified"


def check(model_path, deep=False):
    """None when ``model_path`` is verified, else the reason (one line)."""
    if not os.path.islink(model_path):
        return "%s is not a clusterctl-staged symlink" % model_path
    target = os.path.realpath(model_path)
    if os.path.basename(os.path.dirname(os.path.dirname(target))) != ".versions":
        return "%s points at %s, not at a staged version" % (model_path, target)
    try:
        with open(os.path.join(target, MARKER)) as fh:
            marker = json.load(fh)
        with open(os.path.join(target, MANIFEST), "rb") as fh:
            raw = fh.read()
    except (OSError, ValueError) as e:
        return "%s (%s) is not verified: %s" % (model_path, target, e)
    if not isinstance(marker, dict) or marker.get("manifest_sha256") != hashlib.sha256(raw).hexdigest():
        return "%s: the verified marker does not match the manifest" % target
    try:
        files = json.loads(raw.decode())["files"]
        for f in files:
            path = os.path.join(target, f["path"])
            if os.path.getsize(path) != f["size"]:
                return "%s: %s has %d bytes, the manifest says %d" % (
                    target,
                    f["path"],
                    os.path.getsize(path),
                    f["size"],
                )
            if deep:
                h = hashlib.sha256()
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 22), b""):
                        h.update(block)
                if h.hexdigest() != f["sha256"]:
                    return "%s: %s does not match its sha256" % (target, f["path"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return "%s: %s" % (target, e)
    return None


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    deep = "--deep" in args
    paths = [a for a in args if a != "--deep"]
    if len(paths) != 1:
        sys.stderr.write("usage: verify-model [--deep] MODEL_PATH\n")
        return 2
    reason = check(paths[0], deep)
    if reason:
        sys.stderr.write("verify-model: refusing to start: %s\n" % reason)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
