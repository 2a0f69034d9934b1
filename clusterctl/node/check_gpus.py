#!/usr/bin/env python3
"""check-gpus: refuse to start an instance whose placed GPUs are not the ones present.

Installed on each node as ``/usr/local/lib/clusterctl/check-gpus`` by deploy; an
instance's unit runs it as ``ExecStartPre`` with the UUIDs recorded when the
instance was placed (the unit's ``CUDA_VISIBLE_DEVICES`` names the same UUIDs)::

    ExecStartPre=/usr/local/lib/clusterctl/check-gpus GPU-8f6c... GPU-1d2e...

After a GPU falls off the bus and the host reboots, NVML indexes shift; a unit
pinned by index would start on the wrong GPU, maybe one another instance holds.
Pinned by UUID, CUDA would refuse a missing one only once vLLM is loading; this
refuses before, with one line naming the missing GPU and what is present.

Exit 0 when every UUID is present (NVML, ``libnvidia-ml.so.1`` through ctypes),
1 with one line on stderr otherwise (NVML unusable included: CUDA would fail
too).  ``--list`` prints ``index uuid`` per GPU (deploy's read uses it).
Standalone: Python 3 standard library only, no clusterctl import.
"""

import ctypes
import sys


def present():
    """``[(index, uuid)]`` from NVML; raises RuntimeError with the reason."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        raise RuntimeError("NVML not loadable (libnvidia-ml.so.1): %s" % e)
    init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
    rc = init()
    if rc != 0:
        raise RuntimeError("nvmlInit failed (NVML return %d)" % rc)
    try:
        count = ctypes.c_uint(0)
        rc = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        if rc != 0:
            raise RuntimeError("nvmlDeviceGetCount failed (NVML return %d)" % rc)
        out = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            buf = ctypes.create_string_buffer(96)
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue  # a lost GPU: its UUID is not present
            if lib.nvmlDeviceGetUUID(handle, buf, ctypes.c_uint(96)) == 0:
                out.append((i, buf.value.decode("ascii", "replace")))
        return out
    finally:
        lib.nvmlShutdown()


def main(argv):
    try:
        gpus = present()
    except RuntimeError as e:
        sys.stderr.write("check-gpus: refusing to start: %s\n" % e)
        return 1
    if argv[:1] == ["--list"]:
        for i, u in gpus:
            sys.stdout.write("%d %s\n" % (i, u))
        return 0
    have = dict((u, i) for i, u in gpus)
    missing = [u for u in argv if u not in have]
    if missing:
        sys.stderr.write(
            "check-gpus: refusing to start: placed GPU(s) %s not present on this host "
            "(present: %s); the GPU indexes may have shifted after a GPU was lost; "
            "redeploy to place the instance again\n"
            % (", ".join(missing), ", ".join("%d=%s" % (i, u) for i, u in gpus) or "none")
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
