"""A collector that does no work: the smallest facts document the control side accepts.

``benchmarks/probe_cache/run.py`` builds a payload with it instead of ``clusterctl/node/collector.py``
(tools ``cheap-floor`` and ``facts-cheap``): what a probe costs above the bare exec floor when the
collector itself is cheap (the payload, the loader, the control side), not the real collector's work.
"""

import json
import socket
import sys

sys.stdout.write(
    json.dumps(
        {
            "schema": 1,
            "collected_at": "1970-01-01T00:00:00+00:00",
            "duration_s": 0.0,
            "host": {"hostname": socket.gethostname()},
            "gpus": {"available": False, "reason": "cheap collector"},
            "nics": [],
            "units": [],
            "kernel_log": None,
            "tools": {},
            "rdma_prereqs": None,
            "errors": [],
        }
    )
    + "\n"
)
