"""start/stop/restart of a multi-node replica act on every member's unit, in the replica's order
(docs/multinode.md): stop drains the head, stops the head then the workers; start starts the workers,
then the head, and waits for the head's /health; restart is a stop then a start."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable


from clusterctl.deploy.rollout.lifecycle import run_action
from clusterctl.deploy.units.multinode import units as member_units
from clusterctl.fleet.fleet import Fleet
from clusterctl.fleet.transport import FakeReply, FakeTransport
from clusterctl.inventory.model import GpuRef, Host

from .status_fakes import inventory, metrics_text, server  # noqa: F401 (server: a fixture)

SHOW = "systemctl show -p ActiveState,SubState,Result"


class Gateway:
    def __init__(self) -> None:
        self.log: list[str] = []

    def mark_down(self, name: str) -> None:
        self.log.append(f"down {name}")

    def mark_up(self, name: str) -> None:
        self.log.append(f"up {name}")


def _replica(port: int):
    """``big``: GPU 0 of h1 (the head) and of h2 (rank 1), served on ``port`` from 127.0.0.1."""
    inv = inventory({"big": ("h1", 0, port)})
    inv.instances["big"] = replace(inv.instances["big"], placement=(GpuRef("h1", 0), GpuRef("h2", 0)))
    return inv


def _fleet(inv, answer: Callable[[str, str], FakeReply | None] | None = None) -> tuple[Fleet, FakeTransport]:
    def handler(host: Host, command: str, stdin: bytes | None) -> FakeReply:
        got = answer(host.name, command) if answer else None
        if got is not None:
            return got
        if command.startswith(SHOW):
            return FakeReply(0, "ActiveState=activating\nSubState=start\nResult=success\n")
        return FakeReply(0, "")

    t = FakeTransport(handler)
    return Fleet(list(inv.hosts.values()), transport=t, connect_timeout=2, command_timeout=10), t


def _systemctl(t: FakeTransport) -> list[tuple[str, str]]:
    """(host, command) of the state-changing systemctl calls, in the order they were sent."""
    return [
        (h, c)
        for h, c, _ in t.commands
        if c.startswith("systemctl ") and not c.startswith(SHOW) and "is-failed" not in c
    ]


def test_the_members_are_the_head_then_the_workers_each_on_its_own_gpus() -> None:
    inv = _replica(8000)
    units = member_units(inv.instances["big"])
    assert [(m.name, h, [str(g) for g in m.placement]) for m, h in units] == [
        ("big", "h1", ["h1:0"]),
        ("big-node1", "h2", ["h2:0"]),
    ]


def test_stop_drains_the_head_then_stops_the_head_and_then_the_worker(server) -> None:
    srv = server(metrics=[metrics_text(0, 0)])
    inv = _replica(srv.port)
    fleet, t = _fleet(inv)
    gw = Gateway()
    with fleet:
        [res] = run_action(inv, fleet, [inv.instances["big"]], "stop", drain_timeout=5, poll=0.05, gateway=gw)
    assert res.ok and res.drain is not None and res.drain.drained, res
    assert gw.log == ["down big"]  # stays down while stopped
    assert _systemctl(t) == [
        ("h1", "systemctl stop clusterctl-big.service"),
        ("h2", "systemctl stop clusterctl-big-node1.service"),
    ]
    assert res.units == ["clusterctl-big.service on h1", "clusterctl-big-node1.service on h2"]


def test_start_starts_the_worker_before_the_head_and_waits_for_the_heads_health(server) -> None:
    srv = server()
    inv = _replica(srv.port)
    fleet, t = _fleet(inv)
    gw = Gateway()
    with fleet:
        [res] = run_action(inv, fleet, [inv.instances["big"]], "start", poll=0.05, health_timeout=5, gateway=gw)
    assert res.ok and res.healthy_after_s is not None, res
    assert _systemctl(t) == [
        ("h2", "systemctl start clusterctl-big-node1.service"),
        ("h1", "systemctl start clusterctl-big.service"),
    ]
    # each member's failed state is cleared first (a worker that hit its start limit starts again)
    cleared = [(h, c) for h, c, _ in t.commands if "reset-failed" in c]
    assert [h for h, _ in cleared] == ["h1", "h2"] and "clusterctl-big-node1.service" in cleared[1][1]
    assert gw.log == ["up big"]


def test_restart_is_stop_all_then_workers_then_head_never_a_restart_of_one_member(server) -> None:
    srv = server()
    inv = _replica(srv.port)
    fleet, t = _fleet(inv)
    gw = Gateway()
    with fleet:
        [res] = run_action(
            inv, fleet, [inv.instances["big"]], "restart", drain_timeout=5, poll=0.05, health_timeout=5, gateway=gw
        )
    assert res.ok, res
    assert _systemctl(t) == [
        ("h1", "systemctl stop clusterctl-big.service"),
        ("h2", "systemctl stop clusterctl-big-node1.service"),
        ("h2", "systemctl start clusterctl-big-node1.service"),
        ("h1", "systemctl start clusterctl-big.service"),
    ]
    assert gw.log == ["down big", "up big"]


def test_a_worker_that_fails_to_start_leaves_the_head_stopped_and_is_named(server) -> None:
    srv = server()
    inv = _replica(srv.port)

    def answer(host: str, cmd: str) -> FakeReply | None:
        if host == "h2" and cmd == "systemctl start clusterctl-big-node1.service":
            return FakeReply(1, "", "Job for clusterctl-big-node1.service failed because the control process exited")
        if host == "h2" and "journalctl" in cmd:
            return FakeReply(0, "Dec 02 02:00:00 h2 vllm[1]: RuntimeError: NCCL error: unhandled system error\n")
        return None

    fleet, t = _fleet(inv, answer)
    gw = Gateway()
    with fleet:
        [res] = run_action(inv, fleet, [inv.instances["big"]], "start", poll=0.05, health_timeout=5, gateway=gw)
    assert not res.ok
    assert "systemctl start on h2" in (res.error or "") and "NCCL error" in (res.error or "")
    assert "the head clusterctl-big.service was not started" in (res.error or "")
    assert ("h1", "systemctl start clusterctl-big.service") not in _systemctl(t)
    assert gw.log == []  # not marked up


def test_a_worker_that_dies_while_the_head_loads_fails_the_start_naming_it(server) -> None:
    srv = server(health=503)
    inv = _replica(srv.port)

    def answer(host: str, cmd: str) -> FakeReply | None:
        if host == "h2" and cmd.startswith(SHOW):
            return FakeReply(0, "ActiveState=failed\nSubState=failed\nResult=exit-code\n")
        return None

    fleet, _ = _fleet(inv, answer)
    with fleet:
        [res] = run_action(inv, fleet, [inv.instances["big"]], "start", poll=0.05, health_timeout=30)
    assert not res.ok and res.duration_s < 20
    assert (res.error or "").startswith("clusterctl-big-node1.service on h2: unit failed/failed"), res.error


def test_a_failed_stop_of_a_worker_is_reported_and_the_restart_does_not_start_anything(server) -> None:
    srv = server()
    inv = _replica(srv.port)

    def answer(host: str, cmd: str) -> FakeReply | None:
        if host == "h2" and cmd == "systemctl stop clusterctl-big-node1.service":
            return FakeReply(1, "", "Failed to stop clusterctl-big-node1.service: Access denied")
        return None

    fleet, t = _fleet(inv, answer)
    with fleet:
        [res] = run_action(
            inv, fleet, [inv.instances["big"]], "restart", drain_first=False, poll=0.05, health_timeout=5
        )
    assert not res.ok and "systemctl stop on h2" in (res.error or "") and "Access denied" in (res.error or "")
    assert not [c for _, c in _systemctl(t) if " start " in c]
