"""`clusterctl facts` on the lab sees the simulated hardware and injected faults.

The probe runs unchanged on the lab hosts; what it reports comes from the
fake NVML library, the fake /sys/class tree and the host's kern.log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from clusterctl.lab import faults as lab_faults


def _facts(lab) -> dict:
    cp = subprocess.run([sys.executable, "-m", "clusterctl.cli.main", "facts", "all",
                         "-i", str(lab.inventory), "--json"],
                        capture_output=True, text=True, timeout=180)
    assert cp.returncode == 0, cp.stderr[-2000:]
    doc = json.loads(cp.stdout)
    rows = doc if isinstance(doc, list) else doc.get("hosts", doc)
    if isinstance(rows, dict):
        return {name: (r.get("facts") or r) for name, r in rows.items()}
    return {r["host"]: (r.get("facts") or r) for r in rows}


@pytest.fixture
def healed(lab):
    touched: list[str] = []
    yield touched
    for name in touched:
        lab_faults.heal(lab.cfg, lab.host(name))


def test_facts_report_gpus_nics_an_xid_a_lost_gpu_and_moving_cnp_counters(lab, healed):
    a, b, c = lab.names[:3]
    healed.extend([a, b, c])
    lab_faults.inject(lab.cfg, lab.host(a), "xid", options=["code=48", "gpu=1"])
    lab_faults.inject(lab.cfg, lab.host(b), "gpu-lost", options=["gpu=2"])
    lab_faults.inject(lab.cfg, lab.host(c), "cnp", options=["rate=10000"])
    first = _facts(lab)
    time.sleep(2.0)
    second = _facts(lab)

    for name in lab.names:
        f = first[name]
        assert f["gpus"]["available"] and f["gpus"]["count"] == 8
        assert f["gpus"]["devices"][0]["name"] == "NVIDIA H100 80GB HBM3"
        rdma = {n["netdev"]: n["rdma"] for n in f["nics"] if n.get("rdma")}
        assert rdma["eth2"]["device"] == "mlx5_0" and rdma["eth2"]["state"] == "ACTIVE"
        assert {n["netdev"]: n["mtu"] for n in f["nics"]}["eth3"] == 4200

    xid_lines = [ln["text"] for ln in first[a]["kernel_log"]["lines"] if "NVRM: Xid" in ln["text"]]
    assert any("Xid (PCI:0000:2a:00): 48," in t for t in xid_lines), xid_lines
    assert not [ln for ln in first[c]["kernel_log"]["lines"] if "NVRM: Xid" in ln["text"]]

    lost = [d for d in first[b]["gpus"]["devices"] if d.get("lost")]
    assert len(lost) == 1 and all(not d.get("lost") for d in first[a]["gpus"]["devices"])

    def cnp(facts: dict) -> int:
        port = next(n["rdma"] for n in facts["nics"] if n["netdev"] == "eth2")
        return int(port["hw_counters"]["np_cnp_sent"])
    assert cnp(second[c]) - cnp(first[c]) >= 10000
    assert cnp(second[a]) == cnp(first[a])
