"""``net apply``'s plan on collector-shaped facts (the shared ConnectX samples):
exactly the settings that differ from the profile, only what the facts show, and
the persistence unit; the apply loop (batches, max-fail, doctor's re-check) on a
stand-in fleet."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

import roce_facts as R
from clusterctl.bringup import netqos
from clusterctl.fleet.results import HostResult, HostStatus, RunResults
from clusterctl.inventory.model import FabricProfile
from clusterctl.probe.factgroups import nic as typed_nic

PROFILE = FabricProfile()


def installed_ok(host_doc: dict[str, Any]) -> dict[str, Any]:
    """What read_installed_command reports on a host where this plan's unit is installed."""
    plan = netqos.host_plan(host_doc["host"]["hostname"], host_doc, PROFILE, {"sums": {}, "enabled": False})
    return {
        "sums": {netqos.SCRIPT_PATH: netqos._sha(plan.script), netqos.UNIT_PATH: netqos._sha(netqos.UNIT_TEXT)},
        "enabled": True,
    }


def bad_doc(host: str) -> dict[str, Any]:
    """PFC on priority 4 and trust pcp on eth2 (the field report's misconfiguration)."""
    d = R.doc(host)
    q = d["nics"][1]["qos"]
    q["pfc_enabled"], q["trust"], q["dscp2prio"] = [4], "pcp", None
    return d


def test_a_host_matching_the_profile_with_its_unit_installed_has_nothing_to_do():
    d = R.doc("gpu01")
    plan = netqos.host_plan("gpu01", d, PROFILE, installed_ok(d))
    assert plan.error is None and plan.changes == []
    assert [n.netdev for n in plan.nics] == ["eth2", "eth3"]


def test_pfc_on_4_and_trust_pcp_are_the_two_changes():
    d = bad_doc("gpu02")
    plan = netqos.host_plan("gpu02", d, PROFILE, installed_ok(d))
    assert [c.line() for c in plan.changes] == ["eth2 trust: pcp -> dscp", "eth2 PFC priorities: 4 -> 3"]


def test_every_profile_item_is_compared_where_the_facts_show_it():
    d = R.doc("gpu03")
    q = d["nics"][1]["qos"]
    q["dscp2prio"] = dict(q["dscp2prio"], **{"26": 0})
    q["ecn"]["roce_np"]["3"] = 0
    q["ecn"]["cnp_dscp"] = 46
    q["traffic_class"], q["traffic_class_reason"] = None, "not set"
    q["global_pause"] = {"autoneg": False, "rx": True, "tx": True}
    q["pfc_enabled"] = [3, 4]
    q["cm_tos"] = 0
    lines = [c.line() for c in netqos.nic_changes(typed_nic(d["nics"][1]), PROFILE)]
    assert lines == [
        "eth2 PFC priorities: 3,4 -> 3",
        "eth2 DSCP 26 priority: 0 -> 3",
        "eth2 ECN notification point on priority 3: off -> on",
        "eth2 CNP DSCP: 46 -> 48",
        "eth2 RoCE traffic class: not set -> 106",
        "eth2 RDMA-CM default ToS: 0 -> 106",
        "eth2 802.3x global pause: on -> off",
    ]
    assert netqos.nic_target(typed_nic(d["nics"][1])).cm_tos
    # no configfs (cm_tos null with its reason): the ToS is neither compared nor set
    q["cm_tos"], q["cm_tos_reason"] = None, "no /sys/kernel/config/rdma_cm (configfs not mounted ...)"
    assert not [c for c in netqos.nic_changes(typed_nic(d["nics"][1]), PROFILE) if "ToS" in c.item]
    assert not netqos.nic_target(typed_nic(d["nics"][1])).cm_tos
    # the inbox driver has no ECN/traffic class files: nothing about them is planned
    inbox = typed_nic(R.nic("eth2", "mlx5_0", inbox=True))
    assert netqos.nic_changes(inbox, PROFILE) == []
    assert netqos.nic_target(inbox).tool == "dcb" and not netqos.nic_target(inbox).ecn


def test_the_persistence_unit_is_a_change_until_installed_and_enabled():
    d = R.doc("gpu04")
    none = netqos.host_plan("gpu04", d, PROFILE, {"sums": {}, "enabled": False})
    assert [c.line() for c in none.changes] == [
        f"persistence ({netqos.UNIT}, {netqos.SCRIPT_PATH}): not installed -> installed"
    ]
    off = dict(installed_ok(d), enabled=False)
    assert [c.item for c in netqos.host_plan("gpu04", d, PROFILE, off).changes] == [f"persistence ({netqos.UNIT})"]
    other = FabricProfile(pfc_priority=4)  # a new profile renders a new script: it differs
    assert netqos.host_plan("gpu04", d, other, installed_ok(d)).changes[-1].current == "differs"


def test_unreadable_hosts_and_unsafe_names_are_errors_not_changes():
    assert netqos.host_plan("x", None, PROFILE, None, "unreachable: timed out").error == "unreachable: timed out"
    d = R.doc("gpu05")
    d["nics"][1]["qos"]["tool"] = None
    assert "neither mlnx_qos nor dcb" in (
        netqos.host_plan("gpu05", d, PROFILE, installed_ok(R.doc("gpu05"))).error or ""
    )
    d = R.doc("gpu06")
    d["nics"][1]["netdev"] = "eth2;reboot"
    assert "not a network or RDMA device name" in (netqos.host_plan("gpu06", d, PROFILE, {"sums": {}}).error or "")


def test_malformed_or_foreign_schema_facts_are_an_error_naming_why_not_a_crash():
    d = R.doc("gpu07")
    d["nics"] = {"eth2": "not a list"}
    assert netqos.host_plan("gpu07", d, PROFILE, None).error == "facts not readable: the nics section is malformed"
    d = R.doc("gpu07")
    d["nics"][1]["qos"] = {"tool": "mlnx_qos", "trust": 7, "pfc_enabled": "3", "ecn": {"roce_np": ["x"]}}
    d["nics"][1]["rdma"]["port"] = "one"
    plan = netqos.host_plan("gpu07", d, PROFILE, None)  # was a TypeError on the ECN table
    assert [c.item for c in plan.changes if c.nic == "eth2"] == [
        "ECN notification point on priority 3",
        "ECN reaction point on priority 3",
    ]
    assert plan.nics[0].port == 1
    d = dict(R.doc("gpu07"), schema=2)
    assert "facts schema 2" in (netqos.host_plan("gpu07", d, PROFILE, None).error or "")


def test_installed_state_parses_sha256sum_and_is_enabled():
    text = f"{'a' * 64}  {netqos.SCRIPT_PATH}\n{'b' * 64}  {netqos.UNIT_PATH}\nenabled=enabled\n"
    assert netqos.installed_state(text) == {
        "sums": {netqos.SCRIPT_PATH: "a" * 64, netqos.UNIT_PATH: "b" * 64},
        "enabled": True,
    }
    assert netqos.installed_state("enabled=\n")["enabled"] is False


# --------------------------------------------------------------- the apply loop


class FakeFleet:
    """Answers the installed-state read and the install command; records what ran where."""

    def __init__(self, world: "World", hosts):
        self.world, self.hosts = world, list(hosts)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def run(self, command, *, sudo=False, timeout=None, **kw):
        rows = []
        for h in self.hosts:
            cmd = command[h.name] if isinstance(command, dict) else command
            if cmd.startswith("sha256sum"):
                rows.append(HostResult(h.name, HostStatus.OK, 0, self.world.installed_text(h.name)))
            else:
                self.world.ran.append(h.name)
                if h.name in self.world.install_fails:
                    rows.append(HostResult(h.name, HostStatus.FAILED, 1, "", "roce-qos.service failed on this host\n"))
                else:
                    self.world.fix(h.name, cmd)
                    rows.append(HostResult(h.name, HostStatus.OK, 0))
        return RunResults(rows)


class World:
    def __init__(self, docs: dict[str, dict[str, Any]]):
        self.docs = docs
        self.installed: dict[str, dict[str, Any]] = {h: installed_ok(d) for h, d in docs.items()}
        self.ran: list[str] = []
        self.install_fails: set[str] = set()
        self.stays_bad: set[str] = set()

    def installed_text(self, host: str) -> str:
        st = self.installed[host]
        return "".join(f"{v}  {k}\n" for k, v in st["sums"].items()) + ("enabled=enabled\n" if st["enabled"] else "")

    def fix(self, host: str, cmd: str) -> None:
        if host not in self.stays_bad:
            self.docs[host] = R.doc(host)

    def collect(self, fleet, **kw):
        out = {}
        for h in fleet.hosts:
            raw = copy.deepcopy(self.docs[h.name])
            out[h.name] = SimpleNamespace(ok=True, facts=SimpleNamespace(raw=raw), reason=None)
        return out


@pytest.fixture
def world(monkeypatch):
    def make(docs):
        w = World(docs)
        monkeypatch.setattr("clusterctl.probe.run.collect_facts", w.collect)
        return w

    return make


def runner(w: World, n: int = 4, **kw) -> netqos.NetApply:
    inv = R.inventory(n, per_leaf=2)
    hosts = [inv.hosts[h] for h in inv.hosts]
    return netqos.NetApply(inv, hosts, lambda hs: FakeFleet(w, hs), **kw)


def test_apply_changes_only_the_host_that_differs_and_a_second_apply_changes_nothing(world):
    docs = {f"gpu{i:02d}": R.doc(f"gpu{i:02d}") for i in range(1, 5)}
    docs["gpu03"] = bad_doc("gpu03")
    w = world(docs)
    rep = runner(w).run()
    assert rep.ok and w.ran == ["gpu03"]
    assert [(o.host, o.status) for o in rep.outcomes] == [
        ("gpu01", "unchanged"),
        ("gpu02", "unchanged"),
        ("gpu03", "changed"),
        ("gpu04", "unchanged"),
    ]
    again = runner(w).run()
    assert again.ok and w.ran == ["gpu03"] and {o.status for o in again.outcomes} == {"unchanged"}


def test_a_host_doctor_still_flags_after_apply_fails_and_stops_the_serial_run(world):
    docs = {f"gpu{i:02d}": bad_doc(f"gpu{i:02d}") for i in range(1, 5)}
    w = world(docs)
    w.stays_bad.add("gpu01")
    rep = runner(w).run()
    assert not rep.ok and w.ran == ["gpu01"]  # one host at a time: the first failure stops the run
    first = rep.outcomes[0]
    assert first.status == "failed" and "roce.qos still finds" in (first.error or "")
    assert "PFC on priority 4" in first.error and first.findings
    assert [o.status for o in rep.outcomes[1:]] == ["skipped"] * 3


def test_max_fail_percentage_lets_a_batch_absorb_a_failure(world):
    docs = {f"gpu{i:02d}": bad_doc(f"gpu{i:02d}") for i in range(1, 5)}
    w = world(docs)
    w.install_fails.add("gpu02")
    rep = runner(w, serial=["2"], max_fail_percentage=50).run()
    assert sorted(w.ran) == ["gpu01", "gpu02", "gpu03", "gpu04"] and rep.stopped is None
    by = {o.host: o for o in rep.outcomes}
    assert by["gpu02"].status == "failed" and "roce-qos.service failed" in by["gpu02"].error
    assert by["gpu01"].batch == by["gpu02"].batch == 1 and by["gpu03"].status == "changed"
    assert not rep.ok  # a failed host is still a failed run (exit 2)
