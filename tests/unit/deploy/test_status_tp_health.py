"""TP health in every status row and every gateway sync: an UNAVAILABLE group that still answers is not serving."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from clusterctl.deploy.status import instances as status
from clusterctl.deploy.status.instances import collect_status
from clusterctl.diagnose.findings import Severity
from clusterctl.gateway.observe import observe
from clusterctl.gateway.sync import decide
from clusterctl.inventory.model import GpuRef

from .status_fakes import FakeVllm, fleet_for, inventory, unit


def _tp2(srv_a: FakeVllm, srv_b: FakeVllm):
    inv = inventory({"g": ("h1", 0, srv_a.port), "s": ("h2", 0, srv_b.port)})
    inv.instances["g"] = dataclasses.replace(inv.instances["g"], placement=(GpuRef("h1", 0), GpuRef("h1", 1)))
    return inv


def test_an_unavailable_group_that_answers_is_crit_in_status_and_down_at_the_next_sync(
    monkeypatch, tmp_path: Path
) -> None:
    a, b = FakeVllm(), FakeVllm()
    asked: list[list[str]] = []

    def fake_tp(inv, instances, fleet, on_event=None):
        asked.append(sorted(instances))
        return {"g": "UNAVAILABLE: member h1:1 is critical (gpu.lost); the group of 2 cannot serve"}

    monkeypatch.setattr(status, "tp_health", fake_tp)
    try:
        inv = _tp2(a, b)
        fleet, _ = fleet_for(inv, {"h1": {"g": unit("g", port=a.port)}, "h2": {"s": unit("s", port=b.port)}})
        with fleet:
            rows = {r.name: r for r in collect_status(inv, dict(inv.instances), fleet, window=0)}
        assert asked == [["g", "s"]]  # every placed instance: TP 1 is a group of one
        g = rows["g"]
        assert g.severity == Severity.CRIT and g.tp_group is not None and g.tp_group.startswith("UNAVAILABLE")
        assert g.message.startswith("TP group UNAVAILABLE: member h1:1 is critical")
        assert g.to_json()["tp_group"].startswith("UNAVAILABLE")
        assert rows["s"].severity == Severity.OK and rows["s"].tp_group is None
        # A plain gateway sync (no flag) sees it too and takes the group out.
        fleet, _ = fleet_for(inv, {"h1": {"g": unit("g", port=a.port)}, "h2": {"s": unit("s", port=b.port)}})
        with fleet:
            observed, unavailable = observe(inv, dict(inv.instances), fleet, window=0, state_dir=tmp_path)
        assert unavailable == {"g"}
        servers = decide(inv, dict(inv.instances), observed, unavailable=unavailable)
        assert servers["g"].down and not servers["s"].down
    finally:
        a.close()
        b.close()


def test_a_one_gpu_instance_on_a_lost_gpu_is_taken_out_by_a_plain_sync(monkeypatch, tmp_path: Path) -> None:
    """The regression of the day the TP check became part of every sync: it was narrowed to groups of more
    than one GPU, so a TP 1 instance whose GPU fell off the bus (XID 79) kept its traffic while /health answered."""
    a, b = FakeVllm(), FakeVllm()
    monkeypatch.setattr(
        status,
        "tp_health",
        lambda inv, instances, fleet, on_event=None: {
            n: ("UNAVAILABLE: member h2:0 is critical (gpu.xid); the group of 1 cannot serve" if n == "s" else "OK")
            for n in instances
        },
    )
    try:
        inv = inventory({"g": ("h1", 0, a.port), "s": ("h2", 0, b.port)})
        fleet, _ = fleet_for(inv, {"h1": {"g": unit("g", port=a.port)}, "h2": {"s": unit("s", port=b.port)}})
        with fleet:
            observed, unavailable = observe(inv, dict(inv.instances), fleet, window=0, state_dir=tmp_path)
        assert unavailable == {"s"}
        servers = decide(inv, dict(inv.instances), observed, unavailable=unavailable)
        assert servers["s"].down and servers["s"].reason == "TP group UNAVAILABLE" and not servers["g"].down
    finally:
        a.close()
        b.close()


def test_a_degraded_group_is_a_warning_and_ok_adds_nothing(monkeypatch) -> None:
    a, b = FakeVllm(), FakeVllm()
    verdicts = {"g": "DEGRADED: member h1:1 has a WARN (gpu.ecc)"}
    monkeypatch.setattr(status, "tp_health", lambda inv, instances, fleet, on_event=None: verdicts)
    try:
        inv = _tp2(a, b)
        units = {"h1": {"g": unit("g", port=a.port)}, "h2": {"s": unit("s", port=b.port)}}
        fleet, _ = fleet_for(inv, units)
        with fleet:
            [g] = [r for r in collect_status(inv, dict(inv.instances), fleet, window=0) if r.name == "g"]
        assert g.severity == Severity.WARN and g.message.startswith("TP group DEGRADED")
        verdicts["g"] = "OK"
        fleet, _ = fleet_for(inv, units)
        with fleet:
            [g] = [r for r in collect_status(inv, dict(inv.instances), fleet, window=0) if r.name == "g"]
        assert g.severity == Severity.OK and g.tp_group == "OK" and "TP group" not in g.message
    finally:
        a.close()
        b.close()
