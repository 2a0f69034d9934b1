"""Back at the gateway after a drain, and why a unit died (the journal's first error)."""

from __future__ import annotations

import time

import pytest

from clusterctl.deploy.rollout import lifecycle
from clusterctl.deploy.rollout.drain import DRAIN_REASON, put_back
from clusterctl.deploy.rollout.journal import journal_command, pick_error
from clusterctl.deploy.rollout.lifecycle import run_action
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.fleet import Fleet

from .status_fakes import FakeReply, FakeTransport, FakeVllm, inventory


class MarkingGateway:
    """A hook that knows why each instance is down, like clusterctl.gateway.hook.Hook."""

    def __init__(self, marked: dict[str, str], fail: bool = False) -> None:
        self.marked_now, self.fail, self.calls = dict(marked), fail, []

    def mark_down(self, instance_name: str) -> None:
        self.marked_now[instance_name] = DRAIN_REASON

    def mark_up(self, instance_name: str) -> None:
        self.mark_up_many([instance_name])

    def mark_up_many(self, names: list[str]) -> None:
        if self.fail:
            raise ClusterctlError("gw1: nginx -t failed")
        self.calls.append(list(names))
        for n in names:
            self.marked_now.pop(n, None)

    def marked(self) -> dict[str, str]:
        return dict(self.marked_now)


def test_put_back_lifts_only_what_a_drain_marked_down_in_one_sync() -> None:
    gw = MarkingGateway({"a": DRAIN_REASON, "b": "failover: TP group UNAVAILABLE", "c": DRAIN_REASON})
    out = put_back(gw, ["a", "b", "c", "d", "a"])
    assert out == {"a": "up at the gateway", "c": "up at the gateway"}
    assert gw.calls == [["a", "c"]]  # one gateway sync for both
    assert gw.marked_now == {"b": "failover: TP group UNAVAILABLE"}  # failover's mark is failover's to lift


def test_put_back_without_a_gateway_or_with_a_failing_one() -> None:
    assert put_back(None, ["a"]) == {}
    gw = MarkingGateway({"a": DRAIN_REASON}, fail=True)
    assert put_back(gw, ["a"]) == {"a": "still down at the gateway: gw1: nginx -t failed"}


# The end of a failed vLLM start as journalctl -o cat shows it (shape of vLLM 0.11's engine-core failure).
FAILED_RUN = """INFO 12-01 10:00:01 [api_server.py:1885] vLLM API server version 0.11.0
INFO 12-01 10:00:02 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='/models/q'
ERROR 12-01 10:00:09 [core.py:708] EngineCore failed to start.
ERROR 12-01 10:00:09 [core.py:708] Traceback (most recent call last):
ERROR 12-01 10:00:09 [core.py:708]   File "/opt/vllm/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 699
ERROR 12-01 10:00:09 [core.py:708] ValueError: To serve at least one request with the models's max seq len (32768), (4.00 GiB KV cache is needed, which is larger than the available KV cache memory (1.50 GiB).
Traceback (most recent call last):
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_pick_error_prefers_the_exception_line_over_the_traceback_header() -> None:
    line = pick_error(FAILED_RUN + "--clusterctl-unit-tail--\nclusterctl-q.service: Failed with result 'exit-code'.\n")
    assert line is not None and "ValueError: To serve at least one request" in line


def test_pick_error_falls_back_to_systemds_own_lines_when_the_run_printed_nothing() -> None:
    text = (
        "--clusterctl-unit-tail--\nclusterctl-q.service: Start request repeated too quickly.\n"
        "clusterctl-q.service: Failed with result 'start-limit-hit'.\n"
    )
    assert pick_error(text) == "clusterctl-q.service: Start request repeated too quickly."
    assert pick_error("--clusterctl-unit-tail--\nStarted clusterctl-q.service.\n") is None
    # The ExecStartPre's refusal (stage/verify_model.py's wording) is the run's last word: it wins over systemd's.
    assert (
        pick_error(
            "verify-model: refusing to start: /models/q is not a symlink\n--clusterctl-unit-tail--\n"
            "clusterctl-q.service: Control process exited, code=exited, status=1/FAILURE\n"
        )
        == "verify-model: refusing to start: /models/q is not a symlink"
    )


def test_journal_command_quotes_the_unit_and_reads_the_current_invocation() -> None:
    cmd = journal_command("q-1")
    assert "systemctl show -p InvocationID --value clusterctl-q-1.service" in cmd
    assert '_SYSTEMD_INVOCATION_ID="$id"' in cmd and "-u clusterctl-q-1.service" in cmd


def test_start_of_a_failed_unit_clears_it_and_on_failure_shows_the_first_error(monkeypatch) -> None:
    monkeypatch.setattr(lifecycle, "UNIT_CHECK_S", 0.1)
    srv = FakeVllm(health=503)
    inv = inventory({"q": ("h1", 0, srv.port)})
    seen: list[str] = []

    def handler(host, command, stdin):
        seen.append(command)
        if "systemctl show -p ActiveState" in command:
            return FakeReply(0, "ActiveState=failed\nSubState=failed\nResult=exit-code\n")
        if "InvocationID" in command:
            return FakeReply(0, FAILED_RUN)
        return FakeReply(0, "")

    fleet = Fleet(list(inv.hosts.values()), transport=FakeTransport(handler), connect_timeout=2, command_timeout=10)
    t0 = time.monotonic()
    try:
        with fleet:
            [res] = run_action(inv, fleet, [inv.instances["q"]], "start", poll=0.05, health_timeout=60)
    finally:
        srv.close()
    assert time.monotonic() - t0 < 10  # it stopped waiting once the unit failed, not after 60 s
    assert not res.ok and res.error is not None
    assert res.error.startswith("unit failed/failed (result exit-code); first error in the journal: ValueError:")
    assert "cleared the unit's failed state" in res.notes
    assert seen.index(
        "systemctl is-failed --quiet clusterctl-q.service && systemctl reset-failed clusterctl-q.service"
    ) < seen.index("systemctl start clusterctl-q.service")


@pytest.mark.parametrize(
    "state", ["ActiveState=activating\nSubState=start\n", "ActiveState=active\nSubState=running\n"]
)
def test_a_unit_still_starting_is_waited_for(monkeypatch, state) -> None:
    monkeypatch.setattr(lifecycle, "UNIT_CHECK_S", 0.05)
    srv = FakeVllm(health=503)
    inv = inventory({"q": ("h1", 0, srv.port)})
    handler = lambda host, command, stdin: FakeReply(0, state if "ActiveState" in command else "")  # noqa: E731
    fleet = Fleet(list(inv.hosts.values()), transport=FakeTransport(handler), connect_timeout=2, command_timeout=10)
    try:
        with fleet:
            [res] = run_action(inv, fleet, [inv.instances["q"]], "start", poll=0.05, health_timeout=0.4)
    finally:
        srv.close()
    assert res.error == "/health did not answer 200 within 0.4 s"
