"""Pre-flight reader, run on a node with ``python3 -`` (3.8+, stdlib only, read-only).

Argument: a JSON object ``{"models": [DIR, ...], "ports": true}``.  Prints one
JSON object::

    {"models": {DIR: {"config": {...config.json...}, "weights": {...}, "files": N,
                      "tensors": N, "bytes": N, "dtypes": {dtype: bytes}}
                      or {"error": "why"}},
     "listeners": {"ss": "<ss -Htlnp output>", "error": null},
     "pid_units": {"PID": "unit.service" or null}}

Weights are read from the safetensors headers only (8-byte little-endian
header length, then the JSON header with each tensor's dtype, shape and
``data_offsets``), never from the data, so a 140 GB checkpoint costs a few
reads.  Tensors are summed by how tensor parallelism shards them (see
``clusterctl.deploy.preflight.memory.WeightSizes``).
"""

import glob
import json
import os
import struct
import subprocess
import sys
from typing import Any, Dict, List, Optional

#: A header larger than this is not a safetensors header (the format caps it at 100 MB).
MAX_HEADER = 100 * 1000 * 1000


def classify(name: str, shape: List[int]) -> str:
    """The sharding class of one tensor: replicated, vocab, kv[_linear] or split[_linear]."""
    if not shape or "norm" in name:
        return "replicated"
    if "embed_tokens" in name or name.startswith("lm_head"):
        return "vocab"
    linear = name.endswith("proj.weight")
    if ".k_proj." in name or ".v_proj." in name:
        return "kv_linear" if linear else "kv"
    return "split_linear" if linear else "split"


def read_header(path: str) -> Dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("%s: shorter than a safetensors header" % path)
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER:
            raise ValueError("%s: header length %d is not plausible" % (path, n))
        text = f.read(n)
        if len(text) != n:
            raise ValueError("%s: header truncated" % path)
    header = json.loads(text.decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("%s: header is not a JSON object" % path)
    return header


def model_sizes(directory: str) -> Dict[str, Any]:
    """config.json and the summed tensor sizes of one model directory."""
    out = {}  # type: Dict[str, Any]
    cfg_path = os.path.join(directory, "config.json")
    try:
        with open(cfg_path) as f:
            out["config"] = json.load(f)
    except (OSError, ValueError) as e:
        return {"error": "%s: %s" % (cfg_path, e)}
    files = sorted(glob.glob(os.path.join(glob.escape(directory), "*.safetensors")))
    if not files:
        return {"error": "%s: no *.safetensors files" % directory, "config": out["config"]}
    sums = {"replicated": 0, "split": 0, "split_linear": 0, "kv": 0, "kv_linear": 0}  # type: Dict[str, int]
    vocab = []  # type: List[List[int]]
    dtypes = {}  # type: Dict[str, int]
    tensors = 0
    try:
        for path in files:
            for name, t in read_header(path).items():
                if name == "__metadata__":
                    continue
                start, end = t["data_offsets"]
                nbytes = int(end) - int(start)
                shape = [int(x) for x in t.get("shape") or []]
                cls = classify(name, shape)
                if cls == "vocab":
                    vocab.append([shape[0], nbytes])
                else:
                    sums[cls] += nbytes
                dtypes[t.get("dtype", "?")] = dtypes.get(t.get("dtype", "?"), 0) + nbytes
                tensors += 1
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {"error": "%s: %s" % (directory, e), "config": out["config"]}
    weights = dict(sums)  # type: Dict[str, Any]
    weights["vocab"] = vocab
    out.update(weights=weights, files=len(files), tensors=tensors, bytes=sum(dtypes.values()), dtypes=dtypes)
    return out


def unit_of(pid: int) -> Optional[str]:
    """The systemd service or scope a process runs in, from /proc/PID/cgroup."""
    try:
        with open("/proc/%d/cgroup" % pid) as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        for part in reversed(line.rsplit(":", 1)[-1].split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return None


def listeners() -> Dict[str, Any]:
    try:
        p = subprocess.run(
            ["ss", "-Htlnp"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"ss": "", "error": "ss: %s" % e}
    if p.returncode != 0:
        return {"ss": p.stdout, "error": "ss exited %d: %s" % (p.returncode, p.stderr.strip()[:300])}
    return {"ss": p.stdout, "error": None}


def engine_state(path: str) -> Dict[str, Any]:
    """Whether an engine's executable (the inventory's ``engines.NAME.path``) is there and runnable."""
    return {"exists": os.path.lexists(path), "executable": os.path.isfile(path) and os.access(path, os.X_OK)}


def main(argv: List[str]) -> int:
    req = json.loads(argv[1]) if len(argv) > 1 else {}
    doc = {"models": {d: model_sizes(d) for d in req.get("models", [])}}  # type: Dict[str, Any]
    if "engines" in req:
        doc["engines"] = {p: engine_state(p) for p in req["engines"]}
    if req.get("ports"):
        doc["listeners"] = listeners()
        pids = set()
        for line in doc["listeners"]["ss"].splitlines():
            for chunk in line.split("pid=")[1:]:
                digits = chunk.split(",", 1)[0]
                if digits.isdigit():
                    pids.add(int(digits))
        doc["pid_units"] = {str(p): unit_of(p) for p in sorted(pids)}
    sys.stdout.write(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
