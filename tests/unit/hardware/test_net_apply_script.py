"""The ``roce-qos.sh`` that ``net apply`` installs, run with ``sh`` against the
lab's fake mlnx_qos / dcb / ethtool and a copy of the fake sysfs: it puts a
misconfigured port back to the profile, writes sysfs files only where they
differ, and a second run changes nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from clusterctl.bringup import netqos
from clusterctl.inventory.model import FabricProfile
from clusterctl.lab.hardware import faults
from clusterctl.lab.hardware.host import hw_dir
from clusterctl.lab.hardware.tools import nicmodel

from .conftest import TOOLS


def _run(host: Path, script: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    for name in ("mlnx_qos", "dcb", "ethtool", "cma_roce_tos"):
        if (hw_dir(host) / "bin" / name).is_symlink() or name not in ("mlnx_qos", "cma_roce_tos"):
            wrapper = bindir / name
            wrapper.write_text(f"#!/bin/sh\nexec python3 {TOOLS / (name + '.py')} \"$@\"\n")
            wrapper.chmod(0o755)
    sysroot = tmp / "sys"
    sysroot.mkdir(exist_ok=True)
    if not (sysroot / "class").exists():
        (sysroot / "class").symlink_to(hw_dir(host) / "sys-class")
        (sysroot / "kernel").mkdir()
        (sysroot / "kernel/config").symlink_to(hw_dir(host) / "configfs")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "LAB_HW_DIR": str(hw_dir(host)), "ROCE_QOS_SYSFS": str(sysroot)}
    path = tmp / "roce-qos.sh"
    path.write_text(script)
    return subprocess.run(["sh", str(path)], env=env, capture_output=True, text=True, timeout=60)


def _targets(flavour: str) -> list[netqos.NicTarget]:
    mlnx = flavour == "mlnx"
    return [
        netqos.NicTarget(n, "mlnx_qos" if mlnx else "dcb", d, 1, ecn=mlnx, tclass=mlnx, cm_tos=True)
        for n, d in (("eth2", "mlx5_0"), ("eth3", "mlx5_1"))
    ]


def _qos(host: Path, nic: str = "eth2") -> dict:
    return json.loads((hw_dir(host) / "nic.json").read_text())["nics"][nic]["qos"]


def test_the_script_fixes_pfc_trust_dscp_and_global_pause_with_mlnx_qos(make_host, tmp_path):
    host = make_host()
    faults.inject(host, "qos-pfc", priority=4)
    faults.inject(host, "qos-trust", trust="pcp")
    faults.inject(host, "qos-dscp", dscp=26, priority=0)
    faults.inject(host, "qos-global-pause")
    script = netqos.render_script("lab01", _targets("mlnx"), FabricProfile())
    r = _run(host, script, tmp_path)
    assert r.returncode == 0, r.stderr
    q = _qos(host)
    assert q["trust"] == "dscp" and q["pfc"] == [0, 0, 0, 1, 0, 0, 0, 0] and q["dscp2prio"][26] == 3
    assert q["global_pause"] is False
    assert (hw_dir(host) / "sys-class/net/eth2/qos/trust").read_text() == "dscp\n"


def test_the_script_writes_ecn_and_traffic_class_files_only_where_they_differ(make_host, tmp_path):
    host = make_host()
    sysc = hw_dir(host) / "sys-class"
    np3 = sysc / "net/eth2/ecn/roce_np/enable/3"
    cnp = sysc / "net/eth2/ecn/roce_np/cnp_dscp"
    tc = sysc / "infiniband/mlx5_0/tc/1/traffic_class"
    np3.write_text("0\n")
    cnp.write_text("46\n")
    tc.write_text("")
    untouched = sysc / "net/eth3/ecn/roce_rp/enable/3"
    before = untouched.stat().st_mtime_ns
    r = _run(host, netqos.render_script("lab01", _targets("mlnx"), FabricProfile()), tmp_path)
    assert r.returncode == 0, r.stderr
    assert (np3.read_text(), cnp.read_text(), tc.read_text()) == ("1\n", "48\n", "106\n")
    assert untouched.stat().st_mtime_ns == before  # already right: not written


def test_the_dcb_script_fixes_an_inbox_port_and_a_second_run_changes_nothing(make_host, tmp_path):
    host = make_host(flavour="inbox")
    faults.inject(host, "qos-pfc", priority=4)
    faults.inject(host, "qos-trust", trust="pcp")
    script = netqos.render_script("lab01", _targets("inbox"), FabricProfile())
    assert "mlnx_qos" not in script.split("# eth2")[1]
    r = _run(host, script, tmp_path)
    assert r.returncode == 0, r.stderr
    q = _qos(host)
    want = nicmodel.default_qos()
    assert (q["trust"], q["pfc"], q["dscp2prio"]) == (want["trust"], want["pfc"], want["dscp2prio"])
    state = (hw_dir(host) / "nic.json").read_text()
    r = _run(host, script, tmp_path)
    assert (
        r.returncode == 0
        and json.loads((hw_dir(host) / "nic.json").read_text())["nics"]["eth2"]["qos"]
        == json.loads(state)["nics"]["eth2"]["qos"]
    )


def test_a_failing_tool_or_a_missing_file_makes_the_script_fail_and_say_which(make_host, tmp_path):
    host = make_host()
    (hw_dir(host) / "sys-class/infiniband/mlx5_1/tc/1/traffic_class").unlink()
    r = _run(host, netqos.render_script("lab01", _targets("mlnx"), FabricProfile()), tmp_path)
    assert r.returncode == 1 and "missing: " in r.stderr and "mlx5_1/tc/1/traffic_class" in r.stderr
    bad = [netqos.NicTarget("eth7", "mlnx_qos")]
    r = _run(host, netqos.render_script("lab01", bad, FabricProfile()).replace("-lt 30", "-lt 0"), tmp_path)
    assert r.returncode == 1 and "missing: network device eth7" in r.stderr
    assert not os.environ.get("ROCE_QOS_SYSFS")  # the override is the test's, not the process's


def _cm_tos(host: Path, dev: str = "mlx5_0") -> str:
    return Path(nicmodel.cm_tos_path(str(hw_dir(host)), dev, 1)).read_text()


def test_the_script_sets_the_rdma_cm_default_tos_with_cma_roce_tos_or_configfs(make_host, tmp_path):
    for flavour in ("mlnx", "inbox"):  # mlnx: the fake cma_roce_tos; inbox: the configfs file itself
        host = make_host(name=f"lab-{flavour}", flavour=flavour)
        faults.inject(host, "qos-tos", tos=0)
        faults.inject(host, "qos-tos", nic="eth3", tos=104)
        script = netqos.render_script("lab01", _targets(flavour), FabricProfile())
        assert "cm_tos mlx5_0 1 106" in script
        (tmp_path / flavour).mkdir()
        r = _run(host, script, tmp_path / flavour)
        assert r.returncode == 0, r.stderr
        assert (_cm_tos(host), _cm_tos(host, "mlx5_1")) == ("106\n", "106\n"), flavour
        before = Path(nicmodel.cm_tos_path(str(hw_dir(host)), "mlx5_0", 1)).stat().st_mtime_ns
        r = _run(host, script, tmp_path / flavour)
        assert r.returncode == 0, r.stderr
        if flavour == "inbox":  # already right: the file is not written again
            assert Path(nicmodel.cm_tos_path(str(hw_dir(host)), "mlx5_0", 1)).stat().st_mtime_ns == before


def test_a_tos_the_kernel_does_not_keep_or_no_rdma_cm_fails_the_script(make_host, tmp_path):
    host = make_host(flavour="inbox")
    prof = FabricProfile()
    (tmp_path / "a").mkdir()
    # a configfs file that does not keep what is written (as a kernel refusing the value)
    path = Path(nicmodel.cm_tos_path(str(hw_dir(host)), "mlx5_0", 1))
    path.unlink()
    path.symlink_to("/dev/null")
    r = _run(host, netqos.render_script("lab01", _targets("inbox"), prof), tmp_path / "a")
    assert r.returncode == 1 and "RDMA-CM default ToS of mlx5_0 port 1 reads nothing, not 106" in r.stderr, r.stderr
    shutil.rmtree(hw_dir(host) / "configfs" / "rdma_cm")
    (tmp_path / "b").mkdir()
    r = _run(host, netqos.render_script("lab01", _targets("inbox"), prof), tmp_path / "b")
    assert r.returncode == 1 and "configfs not mounted or rdma_cm not loaded" in r.stderr, r.stderr
