"""A batch's drains take its instances out at the gateway in one change, before any drain waits
(deploy/rollout/engine.py ``mark_down_batch``): one render and reload per batch, not one per instance."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from clusterctl.deploy.rollout import drain as dr
from clusterctl.deploy.rollout.drain import DRAIN_REASON, DrainResult
from clusterctl.fleet.transport import FakeReply
from clusterctl.inventory.model import Host

from .test_engine import FakeCluster, run


class Running(FakeCluster):
    """Every host runs its instance ``iN`` in an older version (the deploy restarts each)."""

    def handle(self, host: Host, command: str, stdin: bytes | None) -> FakeReply:
        job = json.loads((stdin or b"{}").decode().splitlines()[0])
        if job["op"] != "read":
            return super().handle(host, command, stdin)
        self.jobs.append((host.name, job))
        name = "i" + str(int(host.name[1:]))
        inst = {
            "unit_text": "ExecStart=/opt/vllm/bin/vllm serve /models/m --port 8000\n",
            "digest": "old",
            "env_hashes": {},
            "env_present": True,
            "active": "active",
            "sub": "running",
            "restarts": 0,
            "main_pid": 1,
            "enabled": "enabled",
            "started_mono": 0,
            "x": {"Model": "m", "Port": "8000"},
        }
        out = {"ok": True, "instances": {name: inst}, "lock": None, "previous": [], "models": {}}
        return FakeReply(0, json.dumps(out) + "\n")


class Gateway:
    """Records each change; the marked-down set as the real hook keeps it."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, list[str]]] = []
        self.down: dict[str, str] = {}
        self.lock = threading.Lock()

    def mark_down(self, name: str) -> None:
        with self.lock:
            if self.down.get(name) != DRAIN_REASON:  # already down: nothing to apply (the hook renders the same)
                self.changes.append(("down", [name]))
            self.down[name] = DRAIN_REASON

    def mark_down_many(self, names: list[str]) -> None:
        with self.lock:
            self.changes.append(("down", list(names)))
            self.down.update({n: DRAIN_REASON for n in names})

    def mark_up(self, name: str) -> None:
        self.mark_up_many([name])

    def mark_up_many(self, names: list[str]) -> None:
        with self.lock:
            self.changes.append(("up", list(names)))
            for n in names:
                self.down.pop(n, None)

    def marked(self) -> dict[str, str]:
        return dict(self.down)


def test_each_batch_marks_all_its_instances_down_in_one_change_then_up_in_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = Gateway()
    waited: list[tuple[str, bool]] = []

    def drain(inv: Any, inst: Any, *, timeout: float, gateway: Any = None, **kw: Any) -> DrainResult:
        waited.append((inst.name, gw.down.get(inst.name) == DRAIN_REASON))  # down before its drain's own mark
        gateway.mark_down(inst.name)
        return DrainResult(inst.name, True, False, 0, 0.0, True)

    monkeypatch.setattr(dr, "drain", drain)
    rep = run(tmp_path, Running(), "1,25%,100%", gateway=gw)
    assert rep.result == "ok" and [len(b) for b in rep.batches] == [1, 2, 5]
    downs = [sorted(names) for op, names in gw.changes if op == "down"]
    ups = [sorted(names) for op, names in gw.changes if op == "up"]
    assert downs == ups == [["i1"], ["i2", "i3"], ["i4", "i5", "i6", "i7", "i8"]]
    assert [op for op, _ in gw.changes] == ["down", "up"] * 3  # a batch's drains add no change of their own
    assert sorted(waited) == [(f"i{n}", True) for n in range(1, 9)]
    assert gw.down == {}
    assert [b["mark_downs"] for b in rep.to_dict()["timings"]["batches"]] == [0, 0, 0]  # this fake has no timings


def test_a_rollback_marks_every_host_down_in_one_change_and_drains_them_in_parallel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from clusterctl.deploy import remote
    from clusterctl.deploy.rollout.rollback import drain_restored_all
    from clusterctl.inventory.loader import load_inventory_text

    from .test_engine import INVENTORY

    inv = load_inventory_text(INVENTORY, "inv.yaml")
    gw = Gateway()
    at_once = threading.Barrier(3, timeout=5)  # every drain waits for the others: serial drains would time out

    def drain(inv: Any, inst: Any, *, timeout: float, gateway: Any = None, **kw: Any) -> DrainResult:
        assert gw.down.get(inst.name) == DRAIN_REASON  # already down before its drain began
        gateway.mark_down(inst.name)
        at_once.wait()
        return DrainResult(inst.name, True, False, 0, 0.0, True)

    monkeypatch.setattr(dr, "drain", drain)

    def state(host: str, name: str) -> remote.HostState:
        unit = "ExecStart=/opt/vllm/bin/vllm serve /models/m --port 8000\n"
        st = remote.InstanceState(name, unit, "d", {}, True, "active", "running", 0, 1, "enabled", 0, {"Port": "8000"})
        return remote.HostState(host, {name: st})

    states = {f"h0{n}": state(f"h0{n}", f"i{n}") for n in (1, 2, 3)}
    got = drain_restored_all(inv, states, {h: [next(iter(s.instances))] for h, s in states.items()}, gw, 5.0)
    assert sorted(r.instance for r in got) == ["i1", "i2", "i3"] and all(r.drained for r in got)
    assert gw.changes == [("down", ["i1", "i2", "i3"])]
