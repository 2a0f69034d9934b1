"""The drain hook's connections to the gateway hosts: one per run, reopened when broken or idle,
and changes asked for at the same time applied together (clusterctl/gateway/hook.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from clusterctl.fleet.fleet import Fleet
from clusterctl.fleet.results import HostStatus
from clusterctl.fleet.transport import FakeReply, FakeTransport, HostFailure
from clusterctl.gateway import state as gwstate
from clusterctl.gateway import sync as gwsync
from clusterctl.gateway.deploy import GatewayHostResult
from clusterctl.gateway.hook import GatewayError, Hook, gateway_hook
from clusterctl.inventory.model import Inventory
from clusterctl.ops import deploy as opsdeploy


class _Apply:
    """``apply_gateway`` over the fleet: one command per gateway host, its SSH status as the row's kind."""

    def __init__(self) -> None:
        self.calls: list[set[str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __call__(self, fleet: Fleet, rendered: Any, *, port: int, hosts: list[str]) -> list[GatewayHostResult]:
        self.calls.append({n for n, m in gwstate.load(self.state_dir).marked_down.items()})
        self.entered.set()
        assert self.release.wait(10)
        res = {r.host: r for r in fleet.run("apply")}
        return [
            GatewayHostResult(
                h,
                res[h].ok,
                True,
                True,
                "reloaded" if res[h].ok else None,
                res[h].error,
                None if res[h].ok else res[h].status.value,
            )
            for h in hosts
        ]


@pytest.fixture
def apply(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> _Apply:
    monkeypatch.setenv("GW_TEST_KEY", "sk-unit")
    monkeypatch.setenv("CLUSTERCTL_STATE_DIR", str(tmp_path))
    a = _Apply()
    a.state_dir = tmp_path  # type: ignore[attr-defined]
    monkeypatch.setattr(gwsync, "apply_gateway", a)
    return a


def _hook(inv: Inventory, tmp_path: Path, ft: FakeTransport, monkeypatch: pytest.MonkeyPatch) -> Hook:
    """The hook a deploy is given (``ops.deploy.drain_hook``), its fleets over ``ft``."""
    monkeypatch.setattr("clusterctl.gateway.hook.make_fleet", lambda hosts, cfg, **kw: Fleet(list(hosts), transport=ft))
    hook = opsdeploy.drain_hook(inv, tmp_path, None)
    assert isinstance(hook, Hook)
    return hook


def test_a_runs_mark_downs_and_mark_ups_share_one_connection_closed_at_its_end(
    inv: Inventory, tmp_path: Path, apply: _Apply, monkeypatch: pytest.MonkeyPatch
) -> None:
    ft = FakeTransport()
    hook = _hook(inv, tmp_path, ft, monkeypatch)
    with opsdeploy.held(hook):
        hook.mark_down("q1")
        hook.mark_down("q2")
        hook.mark_up_many(["q1", "q2"])
        assert ft.connects == {"gw01": 1} and ft.open == 1  # opened on first use, kept
    assert ft.open == 0  # closed at the run's end
    assert len(apply.calls) == 3 and apply.calls[1] == {"q1", "q2"} and apply.calls[2] == set()
    assert [t.connected for t in hook.timings] == [True, False, False]
    assert [t.op for t in hook.timings] == ["down", "down", "up"]
    hook.mark_down("q3")  # a change after close opens a new connection
    assert ft.connects == {"gw01": 2}
    hook.close()
    assert ft.open == 0


def test_a_broken_connection_is_reopened_once_and_the_change_applied(
    inv: Inventory, tmp_path: Path, apply: _Apply, monkeypatch: pytest.MonkeyPatch
) -> None:
    execs = [0]

    def handler(host: Any, command: str, stdin: bytes | None) -> FakeReply | HostFailure:
        execs[0] += 1
        return HostFailure(HostStatus.ERROR, "connection closed") if execs[0] == 2 else FakeReply()

    ft = FakeTransport(handler)
    with opsdeploy.held(_hook(inv, tmp_path, ft, monkeypatch)) as hook:
        assert isinstance(hook, Hook)
        hook.mark_down("q1")
        hook.mark_up("q1")  # its first try breaks: applied again over a new connection
        assert ft.connects == {"gw01": 2} and ft.open == 1
        assert [t.reconnected for t in hook.timings] == [False, True]
        assert gwstate.load(tmp_path).marked_down == {}

    def broken(host: Any, command: str, stdin: bytes | None) -> FakeReply | HostFailure:
        execs[0] += 1
        return HostFailure(HostStatus.ERROR, "connection closed") if execs[0] > 1 else FakeReply()

    execs[0] = 0
    ft2 = FakeTransport(broken)
    with opsdeploy.held(_hook(inv, tmp_path, ft2, monkeypatch)) as hook:
        assert isinstance(hook, Hook)
        hook.mark_down("q1")
        with pytest.raises(GatewayError, match="gw01: connection closed"):
            hook.mark_up("q1")  # broken again over the new connection: once, then the error
        assert ft2.connects == {"gw01": 2}


def test_an_idle_connection_is_closed_and_a_new_one_opened(
    inv: Inventory, tmp_path: Path, apply: _Apply, monkeypatch: pytest.MonkeyPatch
) -> None:
    ft = FakeTransport()
    hook = _hook(inv, tmp_path, ft, monkeypatch)
    now = [100.0]
    hook.clock = lambda: now[0]
    hook.mark_down("q1")
    now[0] += hook.idle_s - 1
    hook.mark_down("q2")
    assert ft.connects == {"gw01": 1}
    now[0] += hook.idle_s + 1
    hook.mark_up_many(["q1", "q2"])
    assert ft.connects == {"gw01": 2} and ft.open == 1  # the idle one closed, one open
    hook.close()
    assert ft.open == 0


def test_changes_asked_while_one_applies_go_together_in_one_reload(
    inv: Inventory, tmp_path: Path, apply: _Apply, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = _hook(inv, tmp_path, FakeTransport(), monkeypatch)
    apply.release.clear()
    errors: list[BaseException] = []

    def down(name: str) -> None:
        try:
            hook.mark_down(name)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    first = threading.Thread(target=down, args=("q1",))
    first.start()
    assert apply.entered.wait(10)
    others = [threading.Thread(target=down, args=(n,)) for n in ("q2", "q3", "l1")]
    for t in others:
        t.start()
    for _ in range(1000):  # every other change queued behind the first apply
        if len(hook._queue) == 3:
            break
        threading.Event().wait(0.01)
    apply.release.set()
    for t in [first, *others]:
        t.join(10)
    hook.close()
    assert not errors
    assert apply.calls == [{"q1"}, {"q1", "q2", "q3", "l1"}]  # two reloads for four drains
    assert sorted(hook.timings[1].names) == ["l1", "q2", "q3"]


def test_every_change_of_a_failed_apply_raises(
    inv: Inventory, tmp_path: Path, apply: _Apply, monkeypatch: pytest.MonkeyPatch
) -> None:
    ft = FakeTransport(lambda h, c, s: FakeReply(rc=1, stderr="nginx -t: boom"))
    hook = gateway_hook(inv, tmp_path)
    assert hook is not None
    monkeypatch.setattr(hook, "fleet_factory", lambda: Fleet([inv.hosts["gw01"]], transport=ft))
    apply.release.clear()
    errors: dict[str, BaseException] = {}

    def down(name: str) -> None:
        try:
            hook.mark_down(name)
        except GatewayError as e:
            errors[name] = e

    threads = [threading.Thread(target=down, args=(n,)) for n in ("q1", "q2", "q3")]
    threads[0].start()
    assert apply.entered.wait(10)
    for t in threads[1:]:
        t.start()
    for _ in range(1000):
        if len(hook._queue) == 2:
            break
        threading.Event().wait(0.01)
    apply.release.set()
    for t in threads:
        t.join(10)
    hook.close()
    assert sorted(errors) == ["q1", "q2", "q3"] and len(apply.calls) == 2


def test_a_drains_mark_down_after_its_batchs_reaches_no_host(
    inv: Inventory, tmp_path: Path, apply: _Apply, monkeypatch: pytest.MonkeyPatch
) -> None:
    ft = FakeTransport()
    hook = _hook(inv, tmp_path, ft, monkeypatch)
    hook.keep_open = False  # as fleet_hook's: a fleet per change, and none when nothing is applied
    hook.mark_down_many(["q1", "q2"])
    hook.mark_down("q1")
    hook.mark_down("q2")
    assert len(apply.calls) == 1 and ft.connects == {"gw01": 1} and ft.open == 0
    assert [(t.connected, t.applied) for t in hook.timings] == [(True, True), (False, False), (False, False)]
    assert gwstate.marked_down(tmp_path) == {"q1": "drain", "q2": "drain"}
