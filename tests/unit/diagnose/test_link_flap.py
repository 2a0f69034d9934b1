"""net.link_flap: a data NIC whose carrier was lost, from the kernel or networkd log; the
RoCE counters only see a flap during doctor's few-second sample."""

from __future__ import annotations

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.linkflap import check_link_flaps

import roce_facts as R

# mlx5e_update_carrier's lines (the lab's link-flap fault writes the same), an Intel NIC's, networkd's
MLX5 = ["mlx5_core 0000:3b:00.0 eth2: Link down", "mlx5_core 0000:3b:00.0 eth2: Link up"]
NETWORKD = ["systemd-networkd[812]: eth3: Lost carrier", "systemd-networkd[812]: eth3: Gained carrier"]


def with_log(lines, host="gpu02"):
    ctx = R.cluster(4, per_leaf=2)
    ctx.facts[host]["kernel_log"]["lines"] = [{"text": t} for t in lines]
    return {(f.host, f.subject): f for f in check_link_flaps(ctx)}


def test_a_flap_of_a_data_nic_is_a_warning_naming_it():
    fs = with_log(MLX5 * 3 + ["mlx5_core 0000:86:00.0 eth0: Link down"])  # eth0: management, not reported
    f = fs[("gpu02", "nic:eth2")]
    assert f.severity == Severity.WARN and "lost its carrier 3 time(s)" in f.message and "came back" in f.message
    assert "RDMA/NCCL connections" in f.action and f.evidence[-1] == MLX5[0]
    assert ("gpu02", "nic:eth0") not in fs
    assert fs[("gpu01", "host")].severity == Severity.OK


def test_networkd_carrier_lines_count_and_a_link_still_down_is_critical():
    fs = with_log(NETWORKD + ["systemd-networkd[812]: eth3: Lost carrier"])
    f = fs[("gpu02", "nic:eth3")]
    assert f.severity == Severity.CRIT and "no link up after it" in f.message


def test_an_unreadable_kernel_log_is_unknown_not_ok():
    ctx = R.cluster(2, per_leaf=2)
    ctx.facts["gpu01"]["kernel_log"] = {"source": None, "lines": []}
    fs = {f.host: f for f in check_link_flaps(ctx)}
    assert fs["gpu01"].severity == Severity.UNKNOWN and fs["gpu02"].severity == Severity.OK
