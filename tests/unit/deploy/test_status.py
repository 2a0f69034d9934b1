"""collect_status: unit state + /health + /metrics window -> rows, verdicts and exit codes.

Instances are real HTTP servers on 127.0.0.1 serving /metrics texts recorded
from the simulator; hosts are a fake transport answering the deploy read.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from clusterctl.deploy.status.peaks import load_peaks
from clusterctl.deploy.status.instances import collect_status, exit_code, match_instances
from clusterctl.diagnose.findings import Severity

from .status_fakes import FakeVllm, fleet_for, inventory, metrics_text, recorded, unit


@pytest.fixture
def servers():
    made: list[FakeVllm] = []

    def make(*a, **kw) -> FakeVllm:
        s = FakeVllm(*a, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _rows(inv, units, *, window=0.2, down=(), state_dir=None):
    fleet, _ = fleet_for(inv, units, down=down)
    with fleet:
        # TP health (doctor's probe per host) has its own tests (test_status_tp_health.py)
        rows = collect_status(
            inv, inv.instances, fleet, window=window, http_timeout=2, state_dir=state_dir, tp_check=False
        )
    return {r.name: r for r in rows}, rows


def test_busy_instance_from_recorded_simulator_metrics(servers, tmp_path: Path) -> None:
    busy = servers([recorded("sim-0.11-busy.1.prom"), recorded("sim-0.11-busy.2.prom")])
    idle = servers([recorded("sim-0.11-idle.prom")], version="0.33.0")
    inv = inventory({"a": ("h1", 0, busy.port), "b": ("h2", 0, idle.port)}, args={"a": {"max-num-seqs": 8}})
    by, rows = _rows(
        inv, {"h1": {"a": unit("a", started_s_ago=300)}, "h2": {"b": unit("b", version="0.33.0")}}, state_dir=tmp_path
    )
    a, b = by["a"], by["b"]
    assert (a.state, a.severity, a.healthy, a.running, a.waiting) == ("serving", Severity.WARN, True, 8.0, 16.0)
    assert a.kv_usage == pytest.approx(0.0758, abs=1e-3)
    assert a.tokens_per_s is not None and a.tokens_per_s > 1000  # 4096 tokens between the samples
    # queue 16/8 -> full (0.4) + KV 0.4 * 0.076 + throughput at its own peak (0.2): high load
    assert a.load == pytest.approx(0.4 + 0.4 * 0.0758 + 0.2, abs=2e-3) and "high load" in a.message
    assert (b.state, b.severity, b.load, b.running_version, b.engine_version) == (
        "serving",
        Severity.OK,
        0.0,
        "0.33.0",
        "0.33.0",
    )
    assert a.up_s == pytest.approx(300, abs=1) and a.gpus == ("h1:0",) and a.model_version == "v1"
    assert exit_code(rows) == 1
    assert load_peaks(tmp_path)["a"] == pytest.approx(a.tokens_per_s, rel=1e-3)


def test_the_stored_peak_makes_a_lower_rate_a_lower_score(servers, tmp_path: Path) -> None:
    (tmp_path / "throughput-peaks.json").write_text(json.dumps({"version": 1, "peaks": {"a": 1e6}}))
    busy = servers([recorded("sim-0.33-busy.1.prom"), recorded("sim-0.33-busy.2.prom")])
    inv = inventory({"a": ("h1", 0, busy.port)}, args={"a": {"max-num-seqs": 8}})
    by, _ = _rows(inv, {"h1": {"a": unit("a")}}, state_dir=tmp_path)
    a = by["a"]
    assert a.tokens_per_s is not None and a.kv_usage is not None
    assert a.load == pytest.approx(0.4 + 0.4 * a.kv_usage + 0.2 * a.tokens_per_s / 1e6, abs=1e-3)
    assert load_peaks(tmp_path)["a"] == 1e6


@pytest.mark.parametrize(
    "active,sub,health,restarts,state,severity",
    [
        ("active", "running", 200, 0, "serving", Severity.OK),
        ("active", "running", 200, 3, "serving", Severity.WARN),
        ("active", "running", 503, 0, "unhealthy", Severity.CRIT),
        ("activating", "auto-restart", None, 5, "restarting", Severity.CRIT),
        ("activating", "start", None, 0, "starting", Severity.WARN),
        ("failed", "failed", None, 0, "failed", Severity.CRIT),
        ("inactive", "dead", None, 0, "stopped", Severity.CRIT),
    ],
)
def test_unit_state_and_health_verdicts(servers, active, sub, health, restarts, state, severity) -> None:
    srv = servers([metrics_text(0, 0)], health=health or 200)
    inv = inventory({"a": ("h1", 0, srv.port)})
    by, rows = _rows(inv, {"h1": {"a": unit("a", active=active, sub=sub, restarts=restarts)}}, window=0)
    assert (by["a"].state, by["a"].severity) == (state, severity), by["a"]
    assert exit_code(rows) == int(severity)
    if state == "unhealthy":
        assert by["a"].load == 1.0 and "/health: HTTP 503" in by["a"].message


def test_a_failed_or_stopped_instance_says_why_from_its_journal(servers) -> None:
    srv = servers([metrics_text(0, 0)])
    inv = inventory({"a": ("h1", 0, srv.port), "b": ("h1", 1, srv.port + 1)})
    journal = (
        "systemd[1]: Started clusterctl-a.service - vLLM a.\n"
        "vllm-a[7]: (EngineCore_DP0 pid=9) ERROR [core.py:708] torch.OutOfMemoryError: CUDA out of memory.\n"
        "systemd[1]: clusterctl-a.service: Main process exited, code=exited, status=1/FAILURE\n"
        "systemd[1]: clusterctl-a.service: Start request repeated too quickly.\n"
    )
    failed = {**unit("a", active="failed", sub="failed"), "result": "exit-code", "journal_tail": journal}
    # vLLM exits 0 when its engine dies: under Restart=on-failure the unit ends up inactive
    exited0 = {
        **unit("b", active="inactive", sub="dead"),
        "result": "success",
        "journal_tail": "systemd[1]: clusterctl-b.service: Deactivated successfully.\n",
    }
    by, rows = _rows(inv, {"h1": {"a": failed, "b": exited0}}, window=0)
    assert (by["a"].state, by["a"].severity) == ("failed", Severity.CRIT)
    assert by["a"].message == (
        "unit failed (failed): systemd gave up restarting it: start request repeated too "
        "quickly (a crash loop); torch.OutOfMemoryError: CUDA out of memory."
    )
    assert (by["b"].state, by["b"].severity) == ("stopped", Severity.CRIT)
    assert "exited with status 0 (vLLM does so when its engine dies)" in by["b"].message
    assert exit_code(rows) == 2


def test_active_but_not_listening_is_starting_then_unhealthy(servers) -> None:
    srv = servers()
    port = srv.port
    srv.close()  # nothing listens: connection refused, as while vLLM loads
    inv = inventory({"a": ("h1", 0, port)})
    by, _ = _rows(inv, {"h1": {"a": unit("a", started_s_ago=30)}}, window=0)
    assert (by["a"].state, by["a"].severity) == ("starting", Severity.WARN)
    by, _ = _rows(inv, {"h1": {"a": unit("a", started_s_ago=3600)}}, window=0)
    assert (by["a"].state, by["a"].severity) == ("unhealthy", Severity.CRIT)


def test_absent_extra_and_unreachable_hosts_are_rows(servers) -> None:
    srv = servers()
    inv = inventory({"a": ("h1", 0, srv.port), "b": ("h2", 0, 8000), "c": ("h1", 1, 9)})
    t0 = time.monotonic()
    by, rows = _rows(
        inv,
        {
            "h1": {
                "a": unit("a"),
                "old": unit("old", port=srv.port),
                "gone": unit("gone", active="inactive", sub="dead"),
            }
        },
        down=("h2",),
    )
    assert time.monotonic() - t0 < 5
    assert by["a"].state == "serving"
    assert (by["b"].state, by["b"].severity) == ("unknown", Severity.UNKNOWN)
    assert (by["c"].state, by["c"].severity) == ("absent", Severity.CRIT)
    assert (by["old"].state, by["old"].severity, by["old"].host) == ("extra", Severity.WARN, "h1")
    assert by["old"].load == 0.0  # an extra unit still serving is measured
    assert (by["gone"].state, by["gone"].severity) == ("extra", Severity.WARN)  # not wanted: never CRIT
    assert exit_code(rows) == 2
    assert [r.name for r in rows] == ["a", "c", "gone", "old", "b"]  # by host, then name


def test_unreachable_only_is_unknown_exit_3() -> None:
    inv = inventory({"b": ("h2", 0, 8000)})
    _, rows = _rows(inv, {}, down=("h1", "h2"))
    assert exit_code(rows) == 3


def test_metrics_unreadable_on_a_healthy_instance_is_warn(servers) -> None:
    srv = servers(["not prometheus at all\n"])
    inv = inventory({"a": ("h1", 0, srv.port)})
    by, _ = _rows(inv, {"h1": {"a": unit("a")}}, window=0)
    assert (by["a"].state, by["a"].severity, by["a"].load) == ("serving", Severity.WARN, 1.0)
    assert "no vllm: metrics" in by["a"].message


@pytest.mark.parametrize(
    "pattern,expected",
    [
        (None, ["q-1", "q-2", "llama"]),
        ("all", ["q-1", "q-2", "llama"]),
        ("q-*", ["q-1", "q-2"]),
        ("q-*,!q-2", ["q-1"]),
        ("llama,q-2", ["q-2", "llama"]),
        ("nope", []),
    ],
)
def test_match_instances(pattern, expected) -> None:
    assert match_instances(["q-1", "q-2", "llama"], pattern) == expected


def test_a_hung_instance_is_a_row_within_the_http_timeout() -> None:
    import socket

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # connections complete in the backlog, nothing ever answers
    try:
        inv = inventory({"a": ("h1", 0, hung.getsockname()[1])})
        fleet, _ = fleet_for(inv, {"h1": {"a": unit("a")}})
        t0 = time.monotonic()
        with fleet:
            [row] = collect_status(inv, inv.instances, fleet, window=0.2, http_timeout=0.5, tp_check=False)
        assert time.monotonic() - t0 < 3
    finally:
        hung.close()
    assert (row.state, row.severity, row.load) == ("unhealthy", Severity.CRIT, 1.0)
    assert "timed out" in row.message


def test_an_instance_marked_down_at_the_gateway_gets_no_traffic_warn(servers) -> None:
    srv = servers()
    inv = inventory({"a": ("h1", 0, srv.port), "b": ("h1", 1, srv.port)})
    fleet, _ = fleet_for(inv, {"h1": {"a": unit("a"), "b": unit("b", active="inactive", sub="dead")}})
    with fleet:
        rows = collect_status(
            inv, inv.instances, fleet, window=0, marked_down={"a": "drain", "b": "drain"}, tp_check=False
        )
    by = {r.name: r for r in rows}
    assert (by["a"].state, by["a"].severity, by["a"].gateway_down) == ("serving", Severity.WARN, "drain")
    assert "marked down at the gateway (drain)" in by["a"].message
    assert (by["b"].state, by["b"].severity, by["b"].gateway_down) == ("stopped", Severity.CRIT, "drain")


def _replica(port: int) -> Any:
    """``big``: TP 1 x PP 2 over h1 (head) and h2 (worker ``big-node1``), beside a one-host ``a`` on h2."""
    from dataclasses import replace

    from clusterctl.inventory.model import GpuRef

    inv = inventory({"big": ("h1", 0, port), "a": ("h2", 1, port + 1)})
    inv.instances["big"] = replace(inv.instances["big"], placement=(GpuRef("h1", 0), GpuRef("h2", 0)))
    return inv


def test_a_multi_node_replica_is_one_row_with_its_members(servers) -> None:
    srv = servers([metrics_text(0, 0)])
    inv = _replica(srv.port)
    by, rows = _rows(
        inv,
        {"h1": {"big": unit("big", port=srv.port)}, "h2": {"big-node1": unit("big-node1", port=srv.port)}},
        window=0,
    )
    assert sorted(by) == ["a", "big"]  # the worker is a member of big, not an extra row
    assert (by["big"].state, by["big"].severity) == ("serving", Severity.OK), by["big"]
    assert [(m["unit"], m["host"], m["state"]) for m in by["big"].members] == [
        ("clusterctl-big.service", "h1", "running"),
        ("clusterctl-big-node1.service", "h2", "running"),
    ]
    assert by["a"].members == [] and by["big"].to_json()["members"][1]["rank"] == 1


@pytest.mark.parametrize(
    "worker, severity, words",
    [
        ({"active": "inactive", "sub": "dead"}, Severity.CRIT, "worker clusterctl-big-node1.service on h2 stopped"),
        ({"active": "failed", "sub": "failed"}, Severity.CRIT, "worker clusterctl-big-node1.service on h2 failed"),
        (
            {"active": "activating", "sub": "auto-restart"},
            Severity.CRIT,
            "worker clusterctl-big-node1.service on h2 restarting",
        ),
        ({"active": "activating", "sub": "start"}, Severity.WARN, "worker clusterctl-big-node1.service on h2 starting"),
        (None, Severity.CRIT, "worker clusterctl-big-node1.service on h2 absent"),
    ],
)
def test_a_worker_not_running_makes_the_replica_bad_and_is_named(servers, worker, severity, words) -> None:
    srv = servers([metrics_text(0, 0)])  # the head still answers /health (a status taken before it notices)
    inv = _replica(srv.port)
    h2 = (
        {}
        if worker is None
        else {
            "big-node1": {
                **unit("big-node1", port=srv.port),
                **worker,
                "journal_tail": "systemd[1]: Stopped clusterctl-big-node1.service.\n",
            }
        }
    )
    by, rows = _rows(inv, {"h1": {"big": unit("big", port=srv.port)}, "h2": h2}, window=0)
    assert by["big"].severity == severity and by["big"].message.startswith(words), by["big"]
    assert exit_code([by["big"]]) == int(severity)  # ("a" has no unit: absent, CRIT of its own)
    assert "big-node1" not in by


def test_a_replica_whose_worker_host_is_unreachable_is_unknown(servers) -> None:
    srv = servers([metrics_text(0, 0)])
    inv = _replica(srv.port)
    by, rows = _rows(inv, {"h1": {"big": unit("big", port=srv.port)}}, window=0, down=("h2",))
    assert (
        by["big"].severity == Severity.UNKNOWN
        and "worker clusterctl-big-node1.service on h2 unknown" in by["big"].message
    )
    assert by["big"].members[1]["state"] == "unknown"
