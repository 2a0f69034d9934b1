"""The fake mlnx_qos / dcb / ethtool change the simulated port as the real tools
would, print the real tools' errors for bad arguments, and keep nic.json and the
QoS sysfs files in agreement (what doctor's probe reads)."""

from __future__ import annotations

import json

from clusterctl.lab.hardware import faults
from clusterctl.lab.hardware.host import hw_dir
from clusterctl.lab.hardware.tools import nicmodel


def _qos(host):
    return json.loads((hw_dir(host) / "nic.json").read_text())["nics"]["eth2"]["qos"]


def test_mlnx_qos_sets_trust_pfc_and_dscp_and_sysfs_follows(make_host, tool):
    host = make_host()
    faults.inject(host, "qos-pfc", priority=4)
    faults.inject(host, "qos-trust", trust="pcp")
    assert (hw_dir(host) / "sys-class/net/eth2/qos/trust").read_text() == "pcp\n"
    r = tool(host, "mlnx_qos", "-i", "eth2", "--pfc", "0,0,0,1,0,0,0,0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\tenabled     0   0   0   1   0   0   0   0   " in r.stdout  # state printed after the change
    r = tool(host, "mlnx_qos", "-i", "eth2", "--trust", "dscp")
    assert r.returncode == 0 and "Priority trust state: dscp" in r.stdout
    r = tool(host, "mlnx_qos", "-i", "eth2", "--dscp2prio", "set,26,5")
    assert r.returncode == 0
    q = _qos(host)
    assert q["pfc"] == [0, 0, 0, 1, 0, 0, 0, 0] and q["trust"] == "dscp" and q["dscp2prio"][26] == 5
    assert (hw_dir(host) / "sys-class/net/eth2/qos/trust").read_text() == "dscp\n"
    # what ethtool -S shows follows PFC: pause counters for priority 3, none for 4
    stats = tool(host, "ethtool", "-S", "eth2").stdout
    assert "rx_prio3_pause:" in stats and "rx_prio4_pause:" not in stats
    assert "prio:5 dscp:26," in tool(host, "mlnx_qos", "-i", "eth2").stdout


def test_mlnx_qos_rejects_bad_arguments_with_mlnx_tools_messages(make_host, tool):
    host = make_host()
    before = _qos(host)
    cases = [
        (["--pfc", "0,0,0,1"], 1, "pfc list must have 8 items\n"),
        (["--pfc", "0,0,0,1,0,0,0,0,0"], 1, "Too many items for PFC\n"),
        (["--pfc", "0,0,0,2,0,0,0,0"], 1, "Bad value for PFC: 2 is not in the range 0..1\nUsage: "),
        (["--trust", "tos"], 1, "Invalid trust state command. Refer to the help.\n"),
        (["--dscp2prio", "set,64,3"], 1, "Invalid dscp2prio command. Refer to the help.\n"),
        (
            ["--dscp2prio", "set,26,3", "--trust", "dscp"],
            1,
            "trust and dscp2prio commands cannot be used at the same time.\n",
        ),
        (["extra"], 1, "Bad arguments\nUsage: mlnx_qos -i <interface> [options]\n"),
    ]
    for args, rc, out in cases:
        r = tool(host, "mlnx_qos", "-i", "eth2", *args)
        assert (r.returncode, r.stdout[: len(out)]) == (rc, out), (args, r.stdout, r.stderr)
    r = tool(host, "mlnx_qos", "-i", "eth2", "--no-such")
    assert r.returncode == 2 and r.stderr.endswith("mlnx_qos: error: no such option: --no-such\n")
    assert _qos(host) == before  # nothing changed by a refused command


def test_dcb_sets_pfc_and_the_dscp_app_table_on_an_inbox_host(make_host, tool):
    host = make_host(flavour="inbox")
    faults.inject(host, "qos-pfc", priority=4)
    r = tool(host, "dcb", "pfc", "set", "dev", "eth2", "prio-pfc", "all:off", "3:on")
    assert r.returncode == 0, r.stderr
    assert (
        tool(host, "dcb", "pfc", "show", "dev", "eth2").stdout.splitlines()[1]
        == "prio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off "
    )
    assert tool(host, "dcb", "app", "flush", "dev", "eth2", "dscp-prio").returncode == 0
    assert tool(host, "dcb", "-N", "app", "show", "dev", "eth2").stdout == ""  # no DSCP entries: trust pcp
    r = tool(host, "dcb", "app", "replace", "dev", "eth2", "dscp-prio", "26:3", "48:6")
    assert r.returncode == 0, r.stderr
    out = tool(host, "dcb", "-N", "app", "show", "dev", "eth2").stdout
    assert " 26:3 " in out and " 48:6 " in out
    for args, msg in (
        (["pfc", "set", "dev", "eth2", "prio-pfc", "8:on"], "In PRIO:PFC mapping, PRIO is expected to be 0..7"),
        (["pfc", "set", "dev", "eth2", "prio-pfc", "3:yes"], 'argument of "PFC" must be "on" or "off", not "yes"'),
        (["pfc", "set", "dev", "eth2", "bogus"], 'What is "bogus"?'),
        (["app", "replace", "dev", "eth2", "dscp-prio", "64:3"], "DSCP is expected to be 0..63"),
        (["pfc", "set", "dev", "eth9", "prio-pfc", "3:on"], 'Cannot find device "eth9"'),
        (["nope", "show"], 'Object "nope" is unknown'),
    ):
        r = tool(host, "dcb", *args)
        assert r.returncode != 0 and msg in r.stderr, (args, r.stderr)


def test_ethtool_A_turns_global_pause_off(make_host, tool):
    host = make_host()
    faults.inject(host, "qos-global-pause")
    assert "RX:\t\ton" in tool(host, "ethtool", "-a", "eth2").stdout
    assert tool(host, "ethtool", "-A", "eth2", "rx", "off", "tx", "off").returncode == 0
    assert "RX:\t\toff" in tool(host, "ethtool", "-a", "eth2").stdout
    r = tool(host, "ethtool", "-A", "eth2", "rx", "maybe")
    assert r.returncode == 1 and "bad command line argument" in r.stderr


def test_cma_roce_tos_sets_and_shows_the_configfs_tos_with_the_real_scripts_errors(make_host, tool):
    """mlnx-tools' sbin/cma_roce_tos (bash): getopts, then root, rdma_cm, device and port checks;
    a ToS bash or the kernel refuses is said on stderr, nothing is set, and it still exits 0."""
    host = make_host()
    path = nicmodel.cm_tos_path(str(hw_dir(host)), "mlx5_0", 1)
    faults.inject(host, "qos-tos", tos=0)
    r = tool(host, "cma_roce_tos", "-d", "mlx5_0", "-t", "106")
    assert (r.returncode, r.stdout, open(path).read()) == (0, "106\n", "106\n"), r.stderr
    assert tool(host, "cma_roce_tos", "-d", "mlx5_0").stdout == "106\n"  # no -t: shows it
    r = tool(host, "cma_roce_tos", "-d", "mlx5_0", "-t", "0x20")
    assert r.returncode == 0 and "0x20: integer expression expected" in r.stderr and r.stdout == "106\n"
    r = tool(host, "cma_roce_tos", "-d", "mlx5_0", "-t", "300")
    assert r.returncode == 0 and "write error: Invalid argument" in r.stderr and r.stdout == "106\n"
    r = tool(host, "cma_roce_tos", "-d", "mlx5_0", "-t", "0152")  # bash: decimal; kstrtou8 base 0: octal
    assert r.stdout == "106\n"
    r = tool(host, "cma_roce_tos", "-x", "-d", "mlx5_0")
    assert r.returncode == 0 and "illegal option -- x" in r.stderr
    r = tool(host, "cma_roce_tos", "-d", "mlx5_7", "-t", "106")
    assert (r.returncode, r.stdout) == (1, "Failed to create configuration for mlx5_7\n")
    r = tool(host, "cma_roce_tos", "-d", "mlx5_0", "-p", "2", "-t", "106")
    assert (r.returncode, r.stdout) == (1, "Device mlx5_0 port 2 does not exist\n")
    assert tool(host, "cma_roce_tos", "-h").stdout.startswith("Set/Show RoCE default ToS of RDMA_CM applications")
