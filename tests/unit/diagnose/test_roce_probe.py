"""The collector's RoCE additions run against stand-in tools (shell scripts
printing the shared samples) and a fake sysfs tree: QoS from mlnx_qos or,
without it, from dcb; two counter samples timed on the node."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from clusterctl.node import collector

import roce_facts as R


def tool(bindir: Path, name: str, body: str) -> None:
    p = bindir / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def sysroot(tmp: Path, mlnx: bool) -> Path:
    root = tmp / "root"
    net = root / "sys/class/net/eth2"
    (net / "device").mkdir(parents=True)
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "hw_counters").mkdir(parents=True)
    (port / "counters").mkdir(parents=True)
    (port / "hw_counters/np_cnp_sent").write_text("100\n")
    (port / "counters/port_xmit_data").write_text("400\n")
    if mlnx:
        (net / "qos").mkdir()
        (net / "qos/trust").write_text("dscp\n")
        for side in ("roce_np", "roce_rp"):
            (net / "ecn" / side / "enable").mkdir(parents=True)
            for p in range(8):
                (net / "ecn" / side / "enable" / str(p)).write_text(f"{int(p == 3)}\n")
        (net / "ecn/roce_np/cnp_dscp").write_text("48\n")
        (root / "sys/class/infiniband/mlx5_0/tc/1").mkdir(parents=True)
        (root / "sys/class/infiniband/mlx5_0/tc/1/traffic_class").write_text("Global tclass=106\n")
    return root


NIC = {"netdev": "eth2", "rdma": {"device": "mlx5_0", "port": 1, "link_layer": "Ethernet"}}


def test_qos_from_mlnx_qos_and_mlnx_ofed_sysfs(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool(bindir, "mlnx_qos", f"cat {R.FIX / 'mlnx_qos_eth2_bad_pfc_prio4.txt'}\n")
    tool(bindir, "ethtool", f"cat {R.FIX / 'ethtool_a_eth2_off.txt'}\n")
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    q = collector.nic_qos(dict(NIC), 5.0, str(sysroot(tmp_path, mlnx=True)))
    assert (q["tool"], q["trust"], q["trust_source"], q["pfc_enabled"]) == ("mlnx_qos", "dscp", "sysfs", [4])
    assert q["dscp2prio"]["26"] == 3 and q["traffic_class"] == 106
    assert q["ecn"]["roce_np"]["3"] == 1 and q["ecn"]["roce_rp"]["2"] == 0 and q["ecn"]["cnp_dscp"] == 48
    assert q["global_pause"] == {"autoneg": False, "rx": False, "tx": False}
    assert "Priority trust state: dscp" in q["raw"]["mlnx_qos -i eth2"] and q["reasons"] == {}


def test_qos_from_dcb_without_mlnx_tools(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool(
        bindir,
        "dcb",
        f"""case "$*" in
  "pfc show dev eth2") cat {R.FIX / 'dcb_pfc_show_eth2.txt'} ;;
  "-N app show dev eth2") cat {R.FIX / 'dcb_app_show_N_eth2.txt'} ;;
  *) echo "Operation not supported" >&2; exit 2 ;;
esac
""",
    )
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setattr(collector, "SBIN_DIRS", str(tmp_path / "nothing"))
    q = collector.nic_qos(dict(NIC), 5.0, str(sysroot(tmp_path, mlnx=False)))
    assert (q["tool"], q["trust"], q["pfc_enabled"]) == ("dcb", "dscp", [3])
    assert q["trust_source"] == "dcb app (DSCP entries present)" and q["dscp2prio"]["26"] == 3
    assert q["reasons"]["mlnx_qos -i eth2"] == "mlnx_qos not installed"
    assert q["reasons"]["dcb apptrust show dev eth2"] == "failed (rc 2): Operation not supported"
    assert q["reasons"]["ethtool -a eth2"] == "ethtool not installed"
    assert q["ecn"] is None and q["traffic_class"] is None
    assert q["traffic_class_reason"].startswith("no /sys/class/infiniband/mlx5_0/tc/1/traffic_class")


def test_two_samples_timed_on_the_node(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    count = tmp_path / "n"
    count.write_text("0")
    # every call prints a counter one higher than the last: the second sample must see more
    tool(
        bindir,
        "ethtool",
        f"""n=$(cat {count}); n=$((n+1)); echo $n > {count}
echo "NIC statistics:"; echo "     rx_prio3_pause: $n"
""",
    )
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    root = sysroot(tmp_path, mlnx=False)
    nics = [dict(NIC, samples=None), {"netdev": "eth0", "rdma": None, "samples": None}]
    errors: list = []
    collector.collect_samples(nics, 0.3, 5.0, errors, str(root))
    s0, s1 = nics[0]["samples"]
    assert errors == [] and nics[1]["samples"] is None
    assert 0.3 <= s1["t"] - s0["t"] <= 1.5
    assert s0["t"] < s0["t_sysfs"] < s1["t"] < s1["t_sysfs"]
    assert s1["ethtool_stats"]["rx_prio3_pause"] == s0["ethtool_stats"]["rx_prio3_pause"] + 1
    assert s0["hw_counters"] == {"np_cnp_sent": 100} and s0["counters"] == {"port_xmit_data": 400}
    assert os.path.exists(count)


def test_collector_option_defaults_to_no_samples():
    assert collector.parse_args([]).counter_interval == 0.0
    assert collector.parse_args(["--counter-interval", "3"]).counter_interval == 3.0


def test_a_hung_qos_tool_skips_the_rest_of_that_nic_and_is_noted(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool(bindir, "mlnx_qos", "exec sleep 30\n")  # a wedged NIC: netlink never answers
    tool(bindir, "ethtool", f"cat {R.FIX / 'ethtool_a_eth2_off.txt'}\n")
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    nics = [dict(NIC, qos=None)]
    errors: list = []
    collector.collect_qos(nics, 0.5, errors, str(sysroot(tmp_path, mlnx=True)))
    q = nics[0]["qos"]
    assert q["reasons"]["mlnx_qos -i eth2"] == "timed out after 0.5 s"
    assert q["reasons"]["ethtool -a eth2"] == "skipped: an earlier QoS tool timed out on this NIC"
    assert q["trust"] == "dscp" and q["traffic_class"] == 106  # sysfs is still read
    assert {e["reason"] for e in errors} == {
        "timed out after 0.5 s (eth2)",
        "skipped: an earlier QoS tool timed out on this NIC (eth2)",
    }


def test_a_nic_whose_ethtool_hung_is_not_sampled(tmp_path):
    nics = [dict(NIC, samples=None, ethtool_stats_reason="ethtool -S timed out after 10 s")]
    errors: list = []
    collector.collect_samples(nics, 0.1, 5.0, errors, str(sysroot(tmp_path, mlnx=False)))
    assert nics[0]["samples"] is None
    assert errors == [{"source": "nics.samples", "reason": "eth2: not sampled, ethtool -S hung before"}]


def test_rdma_cm_default_tos_from_configfs_made_read_and_removed_as_lshca_does(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(R.FIX.parents[1] / "probe" / "sysroot_roce", root, symlinks=True)
    # mlx5_0's directory exists (made by an earlier cma_roce_tos): read as it is
    assert collector.read_cm_tos(str(root), "mlx5_0", 1) == (106, None)
    # mlx5_1 has none: made, read, removed again (a plain directory here stays empty: no file)
    tos, why = collector.read_cm_tos(str(root), "mlx5_1", 1)
    assert tos is None and why == "no /sys/kernel/config/rdma_cm/mlx5_1/ports/1/default_roce_tos"
    assert not (root / "sys/kernel/config/rdma_cm/mlx5_1").exists()
    (root / "sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos").write_text("junk\n")
    assert collector.read_cm_tos(str(root), "mlx5_0", 1)[1].endswith("reads 'junk'")
    shutil.rmtree(root / "sys/kernel/config")
    assert collector.read_cm_tos(str(root), "mlx5_0", 1) == (
        None,
        "no /sys/kernel/config/rdma_cm (configfs not mounted or the rdma_cm module not loaded)",
    )
