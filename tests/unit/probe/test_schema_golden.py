"""The facts document's key set is stable (schema 1) and documented.

A full document is assembled from the collector's own functions: fake NVML
for two GPUs, the RoCE sysfs fixture for NICs, a parsed ``systemctl show``
block for units and a kernel-log line.  Its key paths must equal
``tests/fixtures/probe/golden_keys.json``; every key must be named in
``docs/facts.md``.  Changing the schema means changing both, and bumping
``SCHEMA`` when a key is removed or changes meaning.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from clusterctl.node import collector

from probe_fakes import FIXTURES, collector_args, h100

GOLDEN = FIXTURES / "golden_keys.json"
DOC = Path(__file__).resolve().parents[3] / "docs" / "facts.md"

#: Maps whose keys are data, not schema (counter names, os-release keys...).
FREE_FORM = {
    "host.os_release",
    "nics[].rdma.counters",
    "nics[].rdma.hw_counters",
    "nics[].ethtool_stats",
    "gpus.devices[].field_errors",
    "units[].environment",
    "node_prereqs.sysctl",
    "node_prereqs.sysctl_dropin",
}


def key_paths(value: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            p = f"{prefix}.{k}" if prefix else k
            out.add(p)
            if p not in FREE_FORM:
                out |= key_paths(v, p)
    elif isinstance(value, list):
        for item in value:
            out |= key_paths(item, prefix + "[]")
    return out


def full_document(fake_nvml) -> dict[str, Any]:
    g0 = h100(0)
    g0["nvmlDeviceGetRetiredPages"] = [0x1000]
    g0["nvmlDeviceGetRetiredPagesPendingStatus"] = 0
    fake_nvml([g0, h100(1)])
    doc = collector.collect(collector_args())
    doc["nics"] = collector.collect_nics([], root=str(FIXTURES / "sysroot_roce"))
    doc["units"] = [collector.unit_entry(collector.parse_show("Id=clusterctl-x.service\nNRestarts=0\n")[0], 0.0)]
    doc["kernel_log"]["lines"] = [collector.file_line("x")]
    doc["host"]["disks"] = doc["host"]["disks"] or [
        dict.fromkeys(
            ["device", "mount", "fstype", "total_bytes", "free_bytes", "avail_bytes", "inodes_total", "inodes_free"]
        )
    ]
    doc["gpus"]["devices"][0]["nearest_nics"] = {"netdevs": ["ens108np0"], "depth": 2}
    doc["rdma_prereqs"]["acs"] = [
        {
            "gpu": 0,
            "netdev": "ens108np0",
            "bridges": [collector.acs_control(str(FIXTURES / "sysroot_roce"), "0000:00:00.0", 1.0)],
        }
    ]
    doc["units"][0].update(environment={"NCCL_IB_TC": "106"}, environment_files=["/x"])
    doc["errors"] = [{"source": "x", "reason": "y"}]
    doc["node_prereqs"]["limits"] = collector.parse_limits("vllm - memlock unlimited\n", "/etc/security/limits.conf")
    return doc


def test_key_set_matches_golden(fake_nvml):
    got = sorted(key_paths(full_document(fake_nvml)))
    want = json.loads(GOLDEN.read_text())
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    assert not missing and not extra, f"schema drift: missing {missing}, new {extra}"


def test_every_key_is_documented():
    text = DOC.read_text()
    documented = set(re.findall(r"`([a-z_0-9]+)`", text))
    leaves = {p.rsplit(".", 1)[-1].replace("[]", "") for p in json.loads(GOLDEN.read_text())}
    assert not sorted(leaves - documented), f"undocumented keys: {sorted(leaves - documented)}"


def test_device_entry_has_every_key_even_when_lost(fake_nvml):
    gpu = h100(0)
    gpu["nvmlDeviceGetName"] = __import__("probe_fakes").NVMLError(15)
    fake_nvml([gpu])
    dev = collector.collect_gpus(collector_args(), [])["devices"][0]
    assert list(dev) == collector.DEVICE_KEYS
