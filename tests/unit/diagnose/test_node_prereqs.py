"""Doctor's ``node.prereqs``: the kernel parameters and the service user's limits that ``node setup``
converges, read by the collector from a node tree (``/proc/sys``, the sysctl drop-in, limits.conf and
limits.d, /etc/passwd) and compared with what node setup wants; each drift names ``node setup``."""

from __future__ import annotations

from pathlib import Path

from clusterctl.bringup import nodesetup
from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.nodeprep import effective_limit
from clusterctl.diagnose.registry import AnalysisContext, run_analyzers
from clusterctl.inventory.model import Host, Inventory, NicSpec
from clusterctl.node import collector

DATA = [NicSpec(netdev="eth2", role="data"), NicSpec(netdev="eth3", role="data")]


def tree(
    tmp: Path,
    *,
    sysctl: dict[str, str],
    dropin: str | None,
    limits: dict[str, str],
    users: tuple[str, ...] = ("root", "vllm"),
) -> Path:
    root = tmp / "node"
    for key, value in sysctl.items():
        p = root / "proc/sys" / key.replace(".", "/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(value + "\n")
    (root / "etc/sysctl.d").mkdir(parents=True)
    if dropin is not None:
        (root / nodesetup.SYSCTL_PATH.lstrip("/")).write_text(dropin)
    (root / "etc/security/limits.d").mkdir(parents=True)
    for name, text in limits.items():
        (root / "etc/security" / name).write_text(text)
    (root / "etc/passwd").write_text("".join(f"{u}:x:{i}:{i}::/home/{u}:/bin/sh\n" for i, u in enumerate(users)))
    return root


def findings(root: Path, vars_: dict | None = None) -> list:
    facts = {
        "gpus": {"devices": [{"numa_node": 0}, {"numa_node": 1}]},
        "nics": [],
        "node_prereqs": collector.collect_node_prereqs(str(root)),
    }
    host = Host("gpu01", "10.0.0.1", nics=DATA, vars=vars_ or {})
    ctx = AnalysisContext(
        inventory=Inventory(path="inv.yaml", hosts={"gpu01": host}), facts={"gpu01": facts}, thresholds={}
    )
    return [f for f in run_analyzers(ctx, ["node.prereqs"])]


RIGHT = {"kernel.numa_balancing": "0", "net.ipv4.conf.all.arp_ignore": "1", "net.ipv4.conf.all.arp_announce": "2"}
DROPIN = (
    "# written by clusterctl node setup\nkernel.numa_balancing = 0\nnet.ipv4.conf.all.arp_ignore = 1\n"
    "net.ipv4.conf.all.arp_announce = 2\n"
)
LIMITS = {"limits.d/90-clusterctl-vllm.conf": "vllm - memlock unlimited\nvllm - nofile 1048576\n"}


def test_a_node_as_node_setup_leaves_it_is_ok(tmp_path):
    [f] = findings(tree(tmp_path, sysctl=RIGHT, dropin=DROPIN, limits=LIMITS))
    assert f.severity == Severity.OK and "kernel parameters and vllm's limits" in f.message


def test_drift_of_each_kind_is_a_warning_naming_node_setup(tmp_path):
    sysctl = dict(RIGHT, **{"kernel.numa_balancing": "1", "net.core.rmem_max": "212992"})
    limits = {
        "limits.conf": "*  soft memlock 65536\n*  hard memlock 65536\n",
        "limits.d/10-site.conf": "@ops - memlock unlimited\nvllm soft nofile 1024\n",
    }
    got = findings(
        tree(tmp_path, sysctl=sysctl, dropin=DROPIN.replace("arp_announce = 2", "arp_announce = 1"), limits=limits),
        {"sysctl": {"net.core.rmem_max": 268435456, "vm.nope": 1}},
    )
    by = {f.subject: f for f in got}
    assert {s: f.severity for s, f in by.items()} == {
        "sysctl:kernel.numa_balancing": Severity.WARN,  # 1 now, 0 wanted (GPUs on two NUMA nodes)
        "sysctl:net.ipv4.conf.all.arp_announce": Severity.WARN,  # right now, the drop-in keeps another value
        "sysctl:net.core.rmem_max": Severity.WARN,  # vars.sysctl, never set by node setup here
        "sysctl:vm.nope": Severity.WARN,
        "limits:vllm": Severity.WARN,
        "limits:vllm:nofile": Severity.WARN,
    }
    assert (
        by["sysctl:kernel.numa_balancing"].message
        == "gpu01: kernel parameter kernel.numa_balancing = 1; the inventory wants 0"
    )
    assert "does not keep it (it has 1): lost at the next boot" in by["sysctl:net.ipv4.conf.all.arp_announce"].message
    assert "is not in /etc/sysctl.d/90-clusterctl.conf" in by["sysctl:net.core.rmem_max"].message
    assert "memlock soft 65536, hard 65536" in by["limits:vllm"].message
    assert all("clusterctl node setup --hosts 'gpu01'" in f.action for f in got if f.severity == Severity.WARN)


def test_a_parameter_in_the_drop_in_but_not_in_the_kernel_is_unknown_and_no_user_no_limit_check(tmp_path):
    got = findings(
        tree(tmp_path, sysctl=RIGHT, dropin=DROPIN + "vm.nope = 1\n", limits={}, users=("root",)),
        {"sysctl": {"vm.nope": 1}},
    )
    assert [(f.subject, f.severity) for f in got] == [("sysctl:vm.nope", Severity.UNKNOWN)]


def test_facts_without_the_section_say_nothing():
    host = Host("gpu01", "10.0.0.1", nics=DATA)
    ctx = AnalysisContext(
        inventory=Inventory(path="inv.yaml", hosts={"gpu01": host}),
        facts={"gpu01": {"gpus": {}, "nics": []}},
        thresholds={},
    )
    assert run_analyzers(ctx, ["node.prereqs"]) == []


def test_pam_limits_precedence():
    e = [
        {"domain": "*", "type": "-", "item": "memlock", "value": "64"},
        {"domain": "vllm", "type": "soft", "item": "memlock", "value": "unlimited"},
        {"domain": "*", "type": "hard", "item": "memlock", "value": "128"},
    ]
    assert effective_limit(e, "vllm", "memlock") == {"soft": "unlimited", "hard": "128"}
    assert effective_limit(e, "other", "memlock") == {"soft": "64", "hard": "128"}
