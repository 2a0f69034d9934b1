"""The fake NIC tools print the real formats (the shared samples) from per-host state."""

from __future__ import annotations

import re
import time

from clusterctl.lab.hardware import faults, nics
from clusterctl.lab.hardware.host import hw_dir
from clusterctl.lab.hardware.tools import nicmodel

from .conftest import fixture_text, freeze


def _stats(out: str) -> dict[str, int]:
    lines = out.splitlines()
    assert lines[0] == "NIC statistics:"
    stats = {}
    for line in lines[1:]:
        m = re.fullmatch(r" {5}([a-z0-9_]+): (\d+)", line)
        assert m, f"not ethtool's '     name: value' layout: {line!r}"
        stats[m[1]] = int(m[2])
    return stats


def test_ethtool_S_starts_with_the_sample_byte_for_byte(make_host, tool):
    """Host 0's eth2 at provisioning is the sample port; later groups follow in driver order."""
    host = make_host()
    freeze(host)
    out = tool(host, "ethtool", "-S", "eth2")
    assert out.returncode == 0, out.stderr
    sample = fixture_text("ethtool_S_eth2.txt")
    assert out.stdout.startswith(sample)
    stats = _stats(out.stdout)
    names = list(stats)
    # PFC on priority 3 only: its five pause counters and the storm counters, nothing for 4.
    for n in (
        "rx_prio3_pause",
        "rx_prio3_pause_duration",
        "tx_prio3_pause",
        "tx_prio3_pause_duration",
        "rx_prio3_pause_transition",
        "tx_pause_storm_warning_events",
        "tx_pause_storm_error_events",
    ):
        assert n in stats
    assert "rx_prio4_pause" not in stats and "rx_global_pause" not in stats
    assert "tx_prio3_pause_transition" not in stats  # mlx5 has no such counter
    assert names.index("tx_errors_phy") < names.index("rx_prio0_bytes") < names.index("rx_prio3_pause")
    assert stats["rx_pause_ctrl_phy"] == stats["rx_prio3_pause"] == 1284512


def test_sysfs_hw_counters_and_pma_counters_match_the_samples(make_host):
    host = make_host()
    freeze(host)
    from clusterctl.lab.hardware import sysfs

    sysfs.refresh_counters(hw_dir(host), nics.load(hw_dir(host)))
    port = hw_dir(host) / "sys-class/infiniband/mlx5_0/ports/1"
    for sub, sample in (("hw_counters", "hw_counters_grep_mlx5_0_p1.txt"), ("counters", "counters_grep_mlx5_0_p1.txt")):
        got = "".join(
            f"/sys/class/infiniband/mlx5_0/ports/1/{sub}/{f.name}:{f.read_text()}"
            for f in sorted((port / sub).iterdir())
        )
        assert got == fixture_text(sample)


def test_rdma_statistic_show_layout_and_values(make_host, tool):
    host = make_host()
    freeze(host)
    out = tool(host, "rdma", "statistic", "show")
    assert out.returncode == 0, out.stderr
    sample = fixture_text("rdma_statistic_show.txt")
    # First port: same text; second port: same names and layout, its own values.
    first = sample.split("link mlx5_1/1")[0]
    assert out.stdout.startswith(first)
    shape = re.compile(r"(link mlx5_\d/1 |    [a-z_]+ \d+ )")
    assert [shape.sub("X", ln) for ln in out.stdout.splitlines()] == [shape.sub("X", ln) for ln in sample.splitlines()]
    assert [ln.split()[0] for ln in out.stdout.splitlines()] == [ln.split()[0] for ln in sample.splitlines()]
    assert tool(host, "rdma", "stat", "show", "link", "mlx5_1/1").stdout.startswith("link mlx5_1/1 \n")
    bad = tool(host, "rdma", "bogus")
    assert bad.returncode != 0 and 'Object "bogus" is unknown' in bad.stderr


def test_mlnx_qos_correct_host_prints_the_ok_sample(make_host, tool):
    host = make_host()
    out = tool(host, "mlnx_qos", "-i", "eth2")
    assert out.returncode == 0 and out.stdout == fixture_text("mlnx_qos_eth2_ok.txt")


def test_wrong_pfc_priority_prints_the_bad_sample(make_host, tool):
    host = make_host()
    # The bad sample came through dcbnl, which lists each priority's DSCPs high to low.
    state = nics.load(hw_dir(host))
    state["nics"]["eth2"]["qos"]["dscp_order"] = "descending"
    nics.save(hw_dir(host), state)
    faults.qos_pfc(host, nic="eth2", priority=4)
    out = tool(host, "mlnx_qos", "-i", "eth2")
    assert out.stdout == fixture_text("mlnx_qos_eth2_bad_pfc_prio4.txt")
    stats = _stats(tool(host, "ethtool", "-S", "eth2").stdout)
    assert "rx_prio4_pause" in stats and "rx_prio3_pause" not in stats
    dcb = tool(host, "dcb", "pfc", "show", "dev", "eth2").stdout
    assert "3:off 4:on" in dcb
    assert tool(host, "mlnx_qos", "-i", "eth3").stdout == fixture_text("mlnx_qos_eth2_ok.txt")


def test_trust_pcp_dscp_remap_and_global_pause_show_where_real_tools_show_them(make_host, tool):
    host = make_host()
    faults.qos_trust(host, trust="pcp")
    out = tool(host, "mlnx_qos", "-i", "eth2").stdout
    assert "Priority trust state: pcp\n" in out and "dscp2prio" not in out
    assert tool(host, "dcb", "-N", "app", "show", "dev", "eth2").stdout == ""
    faults.qos_trust(host, trust="dscp")
    faults.qos_dscp(host, dscp=26, priority=0)
    out = tool(host, "mlnx_qos", "-i", "eth2").stdout
    assert "\tprio:0 dscp:00,01,02,03,04,05,06,07,\n\tprio:0 dscp:26,\n" in out
    assert "\tprio:3 dscp:24,25,27,28,29,30,31,\n" in out
    assert " 26:0 " in tool(host, "dcb", "-N", "app", "show", "dev", "eth2").stdout
    assert "AF31:0" in tool(host, "dcb", "app", "show", "dev", "eth2").stdout
    faults.qos_global_pause(host, on=True)
    stats = _stats(tool(host, "ethtool", "-S", "eth2").stdout)
    assert {"rx_global_pause", "rx_global_pause_duration", "tx_global_pause"} <= set(stats)
    assert "RX:\t\ton" in tool(host, "ethtool", "-a", "eth2").stdout


def test_dcb_pfc_matches_the_sample_and_statistics_are_the_pause_counters(make_host, tool):
    host = make_host()
    freeze(host)
    assert tool(host, "dcb", "pfc", "show", "dev", "eth2").stdout == fixture_text("dcb_pfc_show_eth2.txt")
    out = tool(host, "dcb", "-s", "pfc", "show", "dev", "eth2").stdout.splitlines()
    assert out[2] == "requests 0:0 1:0 2:0 3:22301 4:0 5:0 6:0 7:0 "
    assert out[3] == "indications 0:0 1:0 2:0 3:1284512 4:0 5:0 6:0 7:0 "
    missing = tool(host, "dcb", "pfc", "show", "dev", "eth9")
    assert missing.returncode != 0 and 'Cannot find device "eth9"' in missing.stderr


def test_ibdev2netdev_has_the_sample_layout(make_host, tool):
    host = make_host()
    line = re.compile(r"mlx5_\w+ port \d+ ==> \S+ \((Up|Down)\)")
    assert all(line.fullmatch(x) for x in fixture_text("ibdev2netdev.txt").splitlines())
    out = tool(host, "ibdev2netdev").stdout.splitlines()
    assert out == ["mlx5_0 port 1 ==> eth2 (Up)", "mlx5_1 port 1 ==> eth3 (Up)"]
    faults.link_down(host, nic="eth3")
    assert tool(host, "ibdev2netdev").stdout.splitlines()[1] == "mlx5_1 port 1 ==> eth3 (Down)"
    assert "state DOWN" in tool(host, "rdma", "link", "show", "mlx5_1/1").stdout


def test_counters_advance_with_wall_clock_time_at_the_configured_rate(make_host, tool):
    host = make_host()
    faults.pause_storm(host, nic="eth2", priority=3, per_s=5000, paused=0.5)
    t1 = time.time()
    a = _stats(tool(host, "ethtool", "-S", "eth2").stdout)
    time.sleep(1.0)
    b = _stats(tool(host, "ethtool", "-S", "eth2").stdout)
    t2 = time.time()
    dt_max = t2 - t1 + 0.05
    d_pause = b["rx_prio3_pause"] - a["rx_prio3_pause"]
    assert 5000 * 0.9 <= d_pause <= 5000 * dt_max
    d_dur = b["rx_prio3_pause_duration"] - a["rx_prio3_pause_duration"]
    assert 0.5e6 * 0.9 <= d_dur <= 0.5e6 * dt_max  # µs paused per second
    # One output is one instant: the MAC-control total equals the per-priority sum.
    for x in (a, b):
        assert x["rx_pause_ctrl_phy"] == x["rx_mac_control_phy"] == x["rx_prio3_pause"]
    # Untouched error counters stay flat; traffic keeps moving.
    assert b["rx_discards_phy"] == a["rx_discards_phy"]
    assert b["rx_vport_rdma_unicast_bytes"] > a["rx_vport_rdma_unicast_bytes"]


def test_rate_changes_never_move_a_counter_backwards(make_host):
    host = make_host()
    state = nics.load(hw_dir(host))
    nic = state["nics"]["eth2"]
    t = state["t0"]
    nicmodel.set_rate(nic, "np_cnp_sent", 1000.0, now=t + 10)
    v10 = nicmodel.value(nic, "np_cnp_sent", t + 10)
    nicmodel.set_rate(nic, "np_cnp_sent", 0.0, now=t + 20)
    assert nicmodel.value(nic, "np_cnp_sent", t + 20) == v10 + 10_000
    assert nicmodel.value(nic, "np_cnp_sent", t + 99) == v10 + 10_000
    before = nicmodel.value(nic, "link_down_events_phy", t + 29)
    nicmodel.add(nic, "link_down_events_phy", 2, now=t + 30)
    assert nicmodel.value(nic, "link_down_events_phy", t + 31) == before + 2


def test_cnp_discards_and_flaps_move_their_counters(make_host, tool):
    host = make_host()
    flaps0 = _stats(tool(host, "ethtool", "-S", "eth3").stdout)["link_down_events_phy"]
    faults.cnp(host, nic="eth3", per_s=1000)
    faults.discards(host, nic="eth3", per_s=100)
    faults.link_flap(host, nic="eth3", count=2)
    state = nics.load(hw_dir(host))["nics"]["eth3"]
    rates = {k: v[1] for k, v in state["counters"].items()}
    assert rates["np_cnp_sent"] == 1000 and rates["rp_cnp_handled"] == 950
    assert rates["rx_discards_phy"] == rates["rx_prio3_buf_discard"] == 100
    assert rates["out_of_sequence"] == 10
    stats = _stats(tool(host, "ethtool", "-S", "eth3").stdout)
    assert stats["link_down_events_phy"] == flaps0 + 2
    assert stats["tx_prio6_bytes"] == 78 * stats["tx_prio6_packets"]  # CNPs ride priority 6
    assert "Link down" in (host / "upper/var/log/kern.log").read_text()


def test_inbox_flavour_lacks_mlnx_tools_and_capability_gated_counters(make_host, tool):
    mlnx = make_host("lab01", 0, flavour="mlnx")
    inbox = make_host("lab02", 1, flavour="inbox")
    m = _stats(tool(mlnx, "ethtool", "-S", "eth2").stdout)
    i = _stats(tool(inbox, "ethtool", "-S", "eth2").stdout)
    for gated in ("rx_err_lane_0_phy", "rx_prio3_buf_discard", "rx_prio3_cong_discard", "rx_prio3_marked"):
        assert gated in m and gated not in i
    assert (hw_dir(mlnx) / "bin/mlnx_qos").is_symlink()
    assert not (hw_dir(inbox) / "bin/mlnx_qos").exists()
    assert not (hw_dir(inbox) / "sys-class/net/eth2/ecn").exists()
    assert (hw_dir(mlnx) / "sys-class/net/eth2/ecn/roce_np/enable/3").read_text() == "1\n"
    assert tool(inbox, "dcb", "pfc", "show", "dev", "eth2").returncode == 0


def test_unknown_devices_and_unmodelled_options_fail_like_the_real_tools(make_host, tool):
    host = make_host()
    r = tool(host, "ethtool", "-S", "eth9")
    assert r.returncode != 0 and "No such device" in r.stderr and r.stdout == ""
    r = tool(host, "ethtool", "-k", "eth2")
    assert r.returncode != 0 and "Operation not supported" in r.stderr
    r = tool(host, "mlnx_qos", "-i", "eth2", "--tsa", "ets,ets,ets,ets,ets,ets,ets,ets")
    assert r.returncode != 0 and "does not model" in r.stderr
    # mlnx-tools python/mlnx_qos: its own checks print on stdout and exit 1
    r = tool(host, "mlnx_qos")
    assert r.returncode == 1 and r.stdout.startswith("Interface name is required\nUsage: mlnx_qos -i")
