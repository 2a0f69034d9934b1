"""``clusterctl node setup``: the plan from facts and a read of the node, and the
generated scripts run for real by ``sh`` against a directory tree standing for
each node (``NODE_SETUP_ROOT``), with stand-ins for systemctl, sysctl, ip and the
user tools that keep their state in that tree.  Plan -> apply -> nothing left ->
revert -> the tree is as it was.
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from clusterctl.bringup import nodesetup as ns
from clusterctl.fleet.results import HostResult, HostStatus, RunResults
from clusterctl.inventory.loader import load_inventory_text

SHIMS = {
    # units: a unit exists when its file is under $R/etc/systemd/system or $R/usr/lib/systemd/system;
    # enablement and activity live in $R/run/units/NAME.{enabled,active}.
    "systemctl": r'''#!/bin/sh
S="$R/run/units"; mkdir -p "$S"
found() { [ -e "$R/etc/systemd/system/$1" ] || [ -e "$R/usr/lib/systemd/system/$1" ]; }
case "$1" in
  daemon-reload) exit 0;;
  show) u="$5"; if found "$u"; then echo loaded; else echo not-found; fi; exit 0;;
  is-enabled) found "$2" || exit 1; v=$(cat "$S/$2.enabled" 2>/dev/null || echo disabled); echo "$v"
              [ "$v" = enabled ];;
  is-active) v=$(cat "$S/$2.active" 2>/dev/null || echo inactive); echo "$v"; [ "$v" = active ];;
  enable) found "$2" || exit 1; echo enabled > "$S/$2.enabled";;
  disable) echo disabled > "$S/$2.enabled";;
  start) found "$2" || exit 1; [ -e "$R/fail-start-$2" ] && exit 1; echo active > "$S/$2.active";;
  stop) echo inactive > "$S/$2.active";;
  *) echo "systemctl stand-in: $*" >&2; exit 2;;
esac
''',
    "sysctl": r'''#!/bin/sh
[ "$1" = -w ] || exit 2
k=${2%%=*}; v=${2#*=}; f="$R/proc/sys/$(echo "$k" | tr . /)"
[ -e "$f" ] || { echo "sysctl: cannot stat $f" >&2; exit 255; }
echo "$v" > "$f"
''',
    "ip": r'''#!/bin/sh
# ip link set dev IF mtu N
[ "$1 $2 $3" = "link set dev" ] && [ "$5" = mtu ] || exit 2
[ -d "$R/sys/class/net/$4" ] || { echo "Cannot find device \"$4\"" >&2; exit 1; }
echo "$6" > "$R/sys/class/net/$4/mtu"
''',
    "getent": r'''#!/bin/sh
grep "^$2:" "$R/etc/passwd"
''',
    "id": r'''#!/bin/sh
u="$2"; line=$(grep "^$u:" "$R/etc/passwd") || exit 1
[ "$1" = -u ] && echo "$line" | cut -d: -f3 || echo "$line" | cut -d: -f4
''',
    "useradd": r'''#!/bin/sh
for a; do u="$a"; done
echo "$u:x:990:990:vLLM:/var/lib/$u:/usr/sbin/nologin" >> "$R/etc/passwd"
mkdir -p "$R/var/lib/$u"
''',
    "userdel": r'''#!/bin/sh
grep -v "^$1:" "$R/etc/passwd" > "$R/etc/passwd.new"; mv "$R/etc/passwd.new" "$R/etc/passwd"
''',
    "install": "#!/bin/sh\nexit 0\n",
}


def make_node(
    root: Path, *, numa_balancing: str = "1", mtu: int = 1500, persistenced: bool = True, persistenced_on: bool = False
) -> None:
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    for k, v in (
        ("kernel/numa_balancing", numa_balancing),
        ("net/ipv4/conf/all/arp_ignore", "0"),
        ("net/ipv4/conf/all/arp_announce", "0"),
        ("net/core/rmem_max", "212992"),
    ):
        (root / "proc/sys" / k).parent.mkdir(parents=True, exist_ok=True)
        (root / "proc/sys" / k).write_text(v + "\n")
    for dev in ("eth2", "eth3"):
        (root / "sys/class/net" / dev).mkdir(parents=True)
        (root / "sys/class/net" / dev / "mtu").write_text(f"{mtu}\n")
    if persistenced:
        unit = root / "usr/lib/systemd/system/nvidia-persistenced.service"
        unit.parent.mkdir(parents=True)
        unit.write_text("[Service]\nExecStart=/usr/bin/nvidia-persistenced\n")
        if persistenced_on:
            (root / "run/units").mkdir(parents=True)
            (root / "run/units/nvidia-persistenced.service.enabled").write_text("enabled\n")
            (root / "run/units/nvidia-persistenced.service.active").write_text("active\n")


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def facts(*, fabric: bool = False, numa: tuple[int, ...] = (0, 1), persistence: bool = False) -> dict[str, Any]:
    return {
        "gpus": {
            "available": True,
            "count": len(numa),
            "fabric_manager": {"load_state": "loaded", "active_state": "inactive", "sub_state": "dead"}
            if fabric
            else None,
            "devices": [{"index": i, "numa_node": n, "persistence_mode": persistence} for i, n in enumerate(numa)],
        },
        "nics": [{"netdev": "eth2", "numa_node": numa[0], "mtu": 1500}],
    }


INV = """version: 1
defaults:
  gpus: {count: 2, model: H100}
  nics:
    - {netdev: eth0, role: management}
    - {netdev: eth2, role: data, rdma_device: mlx5_0}
    - {netdev: eth3, role: data, rdma_device: mlx5_1}
fabric: {kind: roce, mtu: 4200}
hosts:
  gpu01: {address: 10.0.0.1}
  gpu02: {address: 10.0.0.2}
"""


class Nodes:
    """Each host is a directory; commands run in ``sh`` with the stand-ins first on PATH."""

    def __init__(self, tmp: Path, docs: dict[str, dict[str, Any]]):
        self.docs = docs
        self.bin = tmp / "bin"
        self.bin.mkdir()
        for name, text in SHIMS.items():
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.roots = {h: tmp / h for h in docs}
        self.ran: list[str] = []

    def sh(self, host: str, cmd: str) -> subprocess.CompletedProcess[str]:
        env = dict(
            os.environ,
            PATH=f"{self.bin}:{os.environ['PATH']}",
            NODE_SETUP_ROOT=str(self.roots[host]),
            R=str(self.roots[host]),
        )
        return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=60)

    def collect(self, fleet: Any, **kw: Any) -> dict[str, Any]:
        return {
            h.name: SimpleNamespace(ok=True, facts=SimpleNamespace(raw=copy.deepcopy(self.docs[h.name])), reason=None)
            for h in fleet.hosts
        }


class FakeFleet:
    def __init__(self, nodes: Nodes, hosts: Any):
        self.nodes, self.hosts = nodes, list(hosts)

    def __enter__(self) -> "FakeFleet":
        return self

    def __exit__(self, *a: Any) -> bool:
        return False

    def run(self, command: Any, *, sudo: bool = False, timeout: float | None = None, **kw: Any) -> RunResults:
        rows = []
        for h in self.hosts:
            cmd = command[h.name] if isinstance(command, dict) else command
            if h.name not in (command if isinstance(command, dict) else {h.name: 1}):
                continue
            if cmd.startswith("sh -c"):
                self.nodes.ran.append(h.name)
            r = self.nodes.sh(h.name, cmd)
            rows.append(
                HostResult(
                    h.name, HostStatus.OK if r.returncode == 0 else HostStatus.FAILED, r.returncode, r.stdout, r.stderr
                )
            )
        return RunResults(rows)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def make(docs: dict[str, dict[str, Any]], inv_text: str = INV) -> tuple[Nodes, Any]:
        nodes = Nodes(tmp_path, docs)
        monkeypatch.setattr("clusterctl.probe.run.collect_facts", nodes.collect)
        inv = load_inventory_text(inv_text, filename="test.yaml")
        return nodes, inv

    return make


def setup(nodes: Nodes, inv: Any, **kw: Any) -> ns.NodeSetup:
    return ns.NodeSetup(inv, list(inv.hosts.values()), lambda hs: FakeFleet(nodes, hs), **kw)


def test_plan_apply_nothing_left_then_revert_restores_every_file_and_value(world):
    nodes, inv = world({"gpu01": facts(), "gpu02": facts()})
    make_node(nodes.roots["gpu01"])
    make_node(nodes.roots["gpu02"], numa_balancing="0", mtu=4200, persistenced_on=True)
    before = {h: snapshot(r) for h, r in nodes.roots.items()}

    plans = {p.host: p for p in setup(nodes, inv).plan()}
    assert [c.line() for c in plans["gpu01"].changes] == [
        "nvidia-persistenced.service: disabled/inactive -> enabled/active",
        "service user vllm: absent -> present (home /var/lib/vllm)",
        "sysctl kernel.numa_balancing: 1 -> 0",
        "sysctl net.ipv4.conf.all.arp_announce: 0 -> 2",
        "sysctl net.ipv4.conf.all.arp_ignore: 0 -> 1",
        "eth2 MTU: 1500 -> 4200",
        "eth3 MTU: 1500 -> 4200",
        "/etc/security/limits.d/90-clusterctl-vllm.conf: absent -> written",
        "/etc/sysctl.d/90-clusterctl.conf: absent -> written",
        "/etc/clusterctl/node-mtu.sh: absent -> written",
        "/etc/systemd/system/node-mtu.service: absent -> written",
        "node-mtu.service: not installed -> enabled",
    ]
    # gpu02 already has the persistence daemon, NUMA balancing off and the MTU: only what differs
    assert not any("persistenced" in c.item or "numa" in c.item or "MTU" in c.item for c in plans["gpu02"].changes)
    assert nodes.ran == []  # a plan changes nothing

    rep = setup(nodes, inv, serial=["100%"]).run()
    assert rep.ok, rep.to_dict()
    assert {o.host: o.status for o in rep.outcomes} == {"gpu01": "changed", "gpu02": "changed"}
    r1 = nodes.roots["gpu01"]
    assert (r1 / "proc/sys/kernel/numa_balancing").read_text().strip() == "0"
    assert (r1 / "sys/class/net/eth3/mtu").read_text().strip() == "4200"
    assert (r1 / "run/units/nvidia-persistenced.service.active").read_text().strip() == "active"
    assert "vllm - memlock unlimited" in (r1 / "etc/security/limits.d/90-clusterctl-vllm.conf").read_text()
    dropin = (r1 / "etc/sysctl.d/90-clusterctl.conf").read_text()
    assert "kernel.numa_balancing = 0" in dropin and "net.ipv4.conf.all.arp_ignore = 1" in dropin
    assert oct((r1 / "etc/clusterctl/node-setup.json").stat().st_mode & 0o777) == "0o600"

    nodes.ran.clear()
    again = setup(nodes, inv).run()
    assert again.ok and nodes.ran == [] and {o.status for o in again.outcomes} == {"unchanged"}

    rplans = {p.host: p for p in setup(nodes, inv, revert=True).plan()}
    assert "sysctl kernel.numa_balancing: set -> 1" in [c.line() for c in rplans["gpu01"].changes]
    assert not any("persistenced" in c.item for c in rplans["gpu02"].changes)  # it was on before: left on
    rev = setup(nodes, inv, revert=True, serial=["100%"]).run()
    assert rev.ok and {o.status for o in rev.outcomes} == {"reverted"}, rev.to_dict()
    for h, r in nodes.roots.items():
        after = snapshot(r)
        after.pop("run/units/nvidia-persistenced.service.enabled", None)  # 'disabled' written back: as before
        after.pop("run/units/nvidia-persistenced.service.active", None)
        after.pop("run/units/node-mtu.service.enabled", None)
        b = dict(before[h])
        b.pop("run/units/nvidia-persistenced.service.enabled", None)
        b.pop("run/units/nvidia-persistenced.service.active", None)
        assert after == b, h
    units = nodes.roots["gpu01"] / "run/units"
    assert (units / "nvidia-persistenced.service.enabled").read_text().strip() == "disabled"
    assert (units / "nvidia-persistenced.service.active").read_text().strip() == "inactive"
    assert (nodes.roots["gpu02"] / "run/units/nvidia-persistenced.service.active").read_text().strip() == "active"
    assert [p.changes for p in setup(nodes, inv, revert=True).plan()] == [[], []]


def test_a_second_apply_keeps_the_first_values_for_revert(world):
    nodes, inv = world({"gpu01": facts(), "gpu02": facts()})
    for r in nodes.roots.values():
        make_node(r)
    assert setup(nodes, inv, serial=["100%"]).run().ok
    # someone sets it back by hand; the next apply must not record its own value as the original
    (nodes.roots["gpu01"] / "proc/sys/kernel/numa_balancing").write_text("1\n")
    rep = setup(nodes, inv).run()
    assert {o.host: o.status for o in rep.outcomes} == {"gpu01": "changed", "gpu02": "unchanged"}
    assert setup(nodes, inv, revert=True, serial=["100%"]).run().ok
    assert (nodes.roots["gpu01"] / "proc/sys/kernel/numa_balancing").read_text().strip() == "1"


def test_a_file_in_the_way_is_kept_and_put_back_on_revert(world):
    nodes, inv = world({"gpu01": facts(), "gpu02": facts()})
    for r in nodes.roots.values():
        make_node(r)
    theirs = nodes.roots["gpu01"] / "etc/sysctl.d/90-clusterctl.conf"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("vm.swappiness = 1\n")
    plan = setup(nodes, inv).plan()[0]
    assert "/etc/sysctl.d/90-clusterctl.conf: differs -> written" in [c.line() for c in plan.changes]
    assert setup(nodes, inv, serial=["100%"]).run().ok
    assert "numa_balancing" in theirs.read_text()
    assert setup(nodes, inv, revert=True, serial=["100%"]).run().ok
    assert theirs.read_text() == "vm.swappiness = 1\n"


def test_unreadable_settings_are_errors_never_unchanged(world):
    nodes, inv = world({"gpu01": facts(), "gpu02": facts(fabric=True)})
    make_node(nodes.roots["gpu01"])
    (nodes.roots["gpu01"] / "proc/sys/kernel/numa_balancing").unlink()
    (nodes.roots["gpu01"] / "sys/class/net/eth3/mtu").unlink()
    (nodes.roots["gpu01"] / "sys/class/net/eth3").rmdir()
    make_node(nodes.roots["gpu02"], persistenced=False)
    plans = {p.host: p for p in setup(nodes, inv).plan()}
    assert "kernel.numa_balancing: cannot be read" in (plans["gpu01"].error or "")
    assert "eth3: MTU cannot be read" in (plans["gpu01"].error or "")
    # no unit for either daemon, GPUs not in persistence mode, an NVSwitch fabric: install them first
    err = plans["gpu02"].error or ""
    assert "nvidia-persistenced.service is not installed" in err
    assert "nvidia-fabricmanager.service is not installed" in err
    rep = setup(nodes, inv).run(list(plans.values()))
    assert not rep.ok and nodes.ran == [] and {o.status for o in rep.outcomes} == {"unread"}


def test_the_fabric_manager_is_planned_only_on_nvswitch_systems_and_a_failed_start_fails_the_host(world):
    nodes, inv = world({"gpu01": facts(fabric=True), "gpu02": facts()})
    for r in nodes.roots.values():
        make_node(r, persistenced_on=True)
    fm = nodes.roots["gpu01"] / "etc/systemd/system/nvidia-fabricmanager.service"
    fm.parent.mkdir(parents=True)
    fm.write_text("[Service]\n")
    (nodes.roots["gpu01"] / "fail-start-nvidia-fabricmanager.service").write_text("")
    plans = {p.host: p for p in setup(nodes, inv).plan()}
    assert "nvidia-fabricmanager.service: disabled/inactive -> enabled/active" in [
        c.line() for c in plans["gpu01"].changes
    ]
    assert not any("fabricmanager" in c.item for c in plans["gpu02"].changes)
    rep = setup(nodes, inv).run(list(plans.values()))
    first = rep.outcomes[0]
    assert first.status == "failed" and "systemctl start nvidia-fabricmanager.service" in (first.error or "")
    assert rep.outcomes[1].status == "skipped" and rep.stopped  # serial 1, max-fail 0: the run stops


def test_the_inventory_adds_and_drops_kernel_parameters_and_bad_ones_are_refused():
    inv = load_inventory_text(
        INV.replace(
            "  gpus: {count: 2, model: H100}",
            "  gpus: {count: 2, model: H100}\n"
            "  vars:\n    sysctl: {kernel.numa_balancing: null, net.core.rmem_max: "
            "268435456}",
        ),
        filename="t.yaml",
    )
    w = ns.wanted_sysctls(inv.hosts["gpu01"], facts())
    assert w == {
        "net.core.rmem_max": "268435456",
        "net.ipv4.conf.all.arp_announce": "2",
        "net.ipv4.conf.all.arp_ignore": "1",
    }
    single = ns.wanted_sysctls(load_inventory_text(INV, filename="t.yaml").hosts["gpu01"], facts(numa=(0, 0)))
    assert "kernel.numa_balancing" not in single  # one NUMA node: nothing to balance
    bad = load_inventory_text(
        INV.replace(
            "  gpus: {count: 2, model: H100}",
            "  gpus: {count: 2, model: H100}\n  vars:\n    sysctl: {'kernel.x; rm -rf /': 1}",
        ),
        filename="t.yaml",
    )
    with pytest.raises(ns.ClusterctlError, match="not a kernel parameter name"):
        ns.wanted_sysctls(bad.hosts["gpu01"], facts())


def test_a_read_only_proc_sys_is_an_error_naming_the_parameter():
    read = ns.parse_read(
        "unit nvidia-persistenced.service loaded enabled active\nuser present\n"
        "sysctl kernel.numa_balancing ro 1\nmtu eth2 4200\nmtu eth3 4200\nmtu-unit enabled\n"
    )
    inv = load_inventory_text(INV, filename="t.yaml")
    plan = ns.host_plan(inv.hosts["gpu01"], inv, facts(persistence=True), read)
    assert "kernel.numa_balancing is 1, wanted 0, but /proc/sys/kernel/numa_balancing is read-only" in plan.error


def test_malformed_or_foreign_schema_facts_plan_with_a_clear_error_not_a_crash():
    inv = load_inventory_text(INV, filename="t.yaml")
    read = ns.parse_read("unit nvidia-persistenced.service loaded enabled active\nuser present\n")
    doc = facts()
    doc["nics"] = ["eth2", None]  # was AttributeError: 'str' object has no attribute 'get'
    doc["gpus"]["devices"].append("gpu2")
    assert "kernel.numa_balancing" in ns.wanted_sysctls(inv.hosts["gpu01"], doc)
    assert ns.host_plan(inv.hosts["gpu01"], inv, doc, read).error is None
    foreign = dict(facts(), schema=2)
    plan = ns.host_plan(inv.hosts["gpu01"], inv, foreign, read)
    assert "GPUs not readable (facts schema 2 from the collector" in (plan.error or "")
