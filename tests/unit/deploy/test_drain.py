"""drain and stop/start/restart: gateway first, wait for in-flight requests, bounded by the timeout."""

from __future__ import annotations

import time


from clusterctl.deploy.rollout.drain import drain
from clusterctl.deploy.rollout.lifecycle import run_action
from clusterctl.errors import ClusterctlError
from clusterctl.ops.deploy import drain_hook

from .status_fakes import fleet_for, inventory, metrics_text, server, unit  # noqa: F401 (server: a fixture)


class Gateway:
    def __init__(self, log: list[str], fail: bool = False):
        self.log, self.fail = log, fail

    def mark_down(self, instance_name: str) -> None:
        if self.fail:
            raise ClusterctlError("nginx reload failed")
        self.log.append(f"down {instance_name}")

    def mark_up(self, instance_name: str) -> None:
        self.log.append(f"up {instance_name}")


class Countdown:
    """/metrics whose in-flight count falls by one per scrape from ``start`` (waiting first)."""

    def __init__(self, running: int, waiting: int, log: list[str] | None = None):
        self.running, self.waiting, self.log = running, waiting, log

    def __call__(self) -> str:
        if self.log is not None:
            self.log.append("scrape")
        text = metrics_text(self.running, self.waiting)
        if self.waiting:
            self.waiting -= 1
        elif self.running:
            self.running -= 1
        return text


def test_marks_down_first_then_waits_until_nothing_is_in_flight(server) -> None:
    log: list[str] = []
    srv = server(metrics_fn=Countdown(2, 1, log))
    inv = inventory({"a": ("h1", 0, srv.port)})
    res = drain(inv, inv.instances["a"], timeout=10, poll=0.05, gateway=Gateway(log))
    assert res.drained and not res.timed_out and res.remaining == 0 and res.marked_down
    assert log == ["down a", "scrape", "scrape", "scrape", "scrape"]  # 3, 2, 1, 0 in flight


def test_timeout_bounds_the_wait_and_reports_what_is_left(server) -> None:
    srv = server(metrics=[metrics_text(3, 0)])
    inv = inventory({"a": ("h1", 0, srv.port)})
    t0 = time.monotonic()
    res = drain(inv, inv.instances["a"], timeout=0.5, poll=0.1)
    assert 0.4 < time.monotonic() - t0 < 3
    assert (res.drained, res.timed_out, res.remaining, res.marked_down) == (False, True, 3, False)


def test_an_instance_not_listening_has_nothing_to_drain(server) -> None:
    srv = server()
    port = srv.port
    srv.close()
    inv = inventory({"a": ("h1", 0, port)})
    res = drain(inv, inv.instances["a"], timeout=30, poll=0.1)
    assert res.drained and res.remaining == 0 and res.waited_s < 5


def test_stop_drains_then_runs_systemctl_stop_as_root(server) -> None:
    srv = server(metrics_fn=Countdown(1, 0))
    inv = inventory({"a": ("h1", 0, srv.port)})
    fleet, transport = fleet_for(inv, {"h1": {"a": unit("a")}})
    log: list[str] = []
    with fleet:
        [res] = run_action(inv, fleet, [inv.instances["a"]], "stop", drain_timeout=10, poll=0.05, gateway=Gateway(log))
    assert res.ok and res.drain is not None and res.drain.drained
    assert log == ["down a"]  # a stopped instance stays down at the gateway
    assert [c for _, c, _ in transport.commands] == ["systemctl stop clusterctl-a.service"]


def test_restart_waits_for_health_and_marks_up(server) -> None:
    srv = server()
    inv = inventory({"a": ("h1", 0, srv.port)})
    fleet, transport = fleet_for(inv, {})
    log: list[str] = []
    with fleet:
        [res] = run_action(
            inv,
            fleet,
            [inv.instances["a"]],
            "restart",
            drain_timeout=5,
            poll=0.05,
            health_timeout=5,
            gateway=Gateway(log),
        )
    assert res.ok and res.healthy_after_s is not None
    assert log == ["down a", "up a"]
    assert [c for _, c, _ in transport.commands] == [
        "systemctl is-failed --quiet clusterctl-a.service && systemctl reset-failed clusterctl-a.service",
        "systemctl restart clusterctl-a.service",
    ]


def test_start_that_never_gets_healthy_fails_the_row(server) -> None:
    srv = server(health=503)
    inv = inventory({"a": ("h1", 0, srv.port)})
    fleet, _ = fleet_for(inv, {})
    with fleet:
        [res] = run_action(inv, fleet, [inv.instances["a"]], "start", poll=0.05, health_timeout=0.3)
    assert not res.ok and "did not answer 200 within 0.3 s" in (res.error or "")


def test_no_drain_and_a_failing_gateway(server) -> None:
    srv = server(metrics=[metrics_text(5, 0)])
    inv = inventory({"a": ("h1", 0, srv.port), "b": ("h2", 0, srv.port)})
    fleet, transport = fleet_for(inv, {}, down=("h2",))
    with fleet:
        a, b = run_action(inv, fleet, [inv.instances["a"], inv.instances["b"]], "stop", drain_first=False)
        [c] = run_action(inv, fleet, [inv.instances["a"]], "stop", gateway=Gateway([], fail=True))
    assert a.ok and a.drain is None
    assert not b.ok and "systemctl stop on h2" in (b.error or "") and "refused" in (b.error or "")
    # The gateway could not take it out: it is not stopped blindly.
    assert not c.ok and c.error == "gateway: nginx reload failed"
    assert [cmd for h, cmd, _ in transport.commands if h == "h1"] == ["systemctl stop clusterctl-a.service"]


def test_no_gateway_configured_means_no_hook() -> None:
    inv = inventory({})
    assert inv.gateway is None and drain_hook(inv, None, None) is None
