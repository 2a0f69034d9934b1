"""A playbook's custom gates against a fake vLLM: pass, fail with the reason, poll until it passes."""

from __future__ import annotations

import subprocess
from typing import Iterator

import pytest

from clusterctl.deploy.rollout.gates import GateTarget
from clusterctl.deploy.playbooks.load import CustomGate
from clusterctl.deploy.playbooks.gates import check_once, wait_custom, wait_one, with_vars
from tests.unit.deploy.status_fakes import FakeVllm, metrics_text


@pytest.fixture
def vllm() -> Iterator[FakeVllm]:
    fake = FakeVllm(metrics=[metrics_text(running=1, waiting=3)])
    yield fake
    fake.close()


def target(fake: FakeVllm) -> GateTarget:
    return GateTarget("a1", "h1", "127.0.0.1", fake.port, "tiny")


def no_exec(host: str, command: str, timeout: float) -> tuple[int | None, str]:
    raise AssertionError("no exec expected")


@pytest.mark.parametrize(
    "gate,why",
    [
        (CustomGate("http", 1, path="/health"), None),
        (CustomGate("http", 1, path="/version", contains="0.11.0"), None),
        (CustomGate("http", 1, path="/version", contains="0.33"), "GET /version: the answer does not contain '0.33'"),
        (CustomGate("http", 1, path="/nope"), "GET /nope answered 404, expected 200"),
        (CustomGate("http", 1, path="/nope", expect_status=404), None),
        (CustomGate("metric", 1, metric="vllm:num_requests_waiting", max=3), None),
        (
            CustomGate("metric", 1, metric="vllm:num_requests_waiting", max=0),
            "vllm:num_requests_waiting is 3, above the maximum 0",
        ),
        (
            CustomGate("metric", 1, metric="vllm:num_requests_running", min=2),
            "vllm:num_requests_running is 1, below the minimum 2",
        ),
        (CustomGate("metric", 1, metric="vllm:nope", max=1), "/metrics has no vllm:nope"),
    ],
)
def test_http_and_metric_gates(vllm: FakeVllm, gate: CustomGate, why: str | None) -> None:
    assert check_once(gate, target(vllm), no_exec) == why


def test_an_unreachable_instance_fails_with_the_reason() -> None:
    t = GateTarget("a1", "h1", "127.0.0.1", 1, "tiny")
    why = check_once(CustomGate("http", 1, path="/health"), t, no_exec, request_timeout_s=1)
    assert why is not None and "refused" in why.lower()


def test_exec_gate_sees_the_instance_in_its_environment() -> None:
    ran: list[str] = []

    def run(host: str, command: str, timeout: float) -> tuple[int | None, str]:
        ran.append(host)
        p = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        return p.returncode, p.stdout.strip()

    t = GateTarget("a b'1", "h1", "10.0.0.1", 8400, "tiny")
    ok = CustomGate("exec", 1, command='test "$INSTANCE:$PORT:$ADDRESS" = "a b\'1:8400:10.0.0.1"')
    assert check_once(ok, t, run) is None and ran == ["h1"]
    bad = CustomGate("exec", 1, command="echo no; exit 3", expect_rc=0)
    assert check_once(bad, t, run) == "exit status 3, expected 0: no"
    gone = CustomGate("exec", 1, command="true")
    assert check_once(gone, t, lambda h, c, s: (None, "unreachable: timed out")) == "unreachable: timed out"


def test_with_vars_quotes_values_and_refuses_bad_names() -> None:
    cmd = with_vars('printf %s "$X"', {"X": "$(touch /tmp/pwned); `id`"})
    assert subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout == "$(touch /tmp/pwned); `id`"
    with pytest.raises(ValueError):
        with_vars("true", {"A-B": "1"})


def test_a_gate_is_polled_until_it_passes_within_its_timeout() -> None:
    texts = [metrics_text(0, 2), metrics_text(0, 1), metrics_text(0, 0)]
    fake = FakeVllm(metrics=texts)
    try:
        g = CustomGate("metric", 1, timeout_s=5, metric="vllm:num_requests_waiting", max=0)
        r = wait_one(target(fake), [g], no_exec, poll_s=0.05)
        assert r.ok and fake.requests.count("/metrics") == 3
    finally:
        fake.close()


def test_the_first_gate_that_does_not_pass_in_time_fails_the_instance(vllm: FakeVllm) -> None:
    gates = [
        CustomGate("http", 1, path="/health"),
        CustomGate("metric", 2, timeout_s=0.2, metric="vllm:num_requests_waiting", max=0),
        CustomGate("http", 3, path="/never-asked"),
    ]
    seen = []
    [r] = wait_custom([target(vllm)], gates, no_exec, poll_s=0.05, on_result=seen.append)
    assert not r.ok and r.step == "custom: metric vllm:num_requests_waiting <= 0"
    assert r.reason.startswith(
        "custom gate metric vllm:num_requests_waiting <= 0: not passed after 0.2 s: vllm:num_requests_waiting is 3"
    )
    assert seen == [r] and "/never-asked" not in vllm.requests


def test_drift_and_bench_gates_call_the_release_gates_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterctl.bench import gate as bench
    from clusterctl.bench.gate import GateOutcome
    from clusterctl.drift import gate as drift

    calls: list[tuple[str, tuple, dict]] = []
    monkeypatch.setattr(
        drift,
        "drift_gate",
        lambda *a, **kw: (
            calls.append(("drift", a, kw))
            or GateOutcome(False, "outputs drifted from baseline 'v1': exact match 40% < 90%")
        ),
    )
    monkeypatch.setattr(
        bench, "bench_gate", lambda *a, **kw: calls.append(("bench", a, kw)) or GateOutcome(True, "no regression")
    )
    t = GateTarget("a1", "h1", "10.0.0.1", 8400, "tiny", api_key="k")
    refs = {"old-1": ("http://10.0.0.2:8400", "k2")}
    gates = [
        CustomGate("bench", 1, reference="old-1", tolerance=0.05, concurrency=(1, 4), requests=8),
        CustomGate("drift", 2, baseline="v1", calibration=False, timeout_s=60),
    ]
    r = wait_one(t, gates, no_exec, poll_s=0.01, reference=lambda n: refs[n])
    assert not r.ok and r.reason == (
        "custom gate drift against baseline 'v1': outputs drifted from baseline 'v1': exact match 40% < 90%"
    )
    assert calls == [
        (
            "bench",
            ("http://10.0.0.1:8400", "http://10.0.0.2:8400"),
            {
                "api_key": "k",
                "reference_api_key": "k2",
                "concurrency": (1, 4),
                "requests": 8,
                "tolerance": 0.05,
                "timeout": 30.0,
            },
        ),
        (
            "drift",
            ("http://10.0.0.1:8400", "v1"),
            {"api_key": "k", "thresholds": None, "use_calibration": False, "timeout": 60},
        ),
    ]  # once each: not polled


def test_a_bench_gate_whose_reference_is_unknown_fails_closed() -> None:
    from clusterctl.errors import ClusterctlError

    def unknown(name: str) -> tuple[str, str | None]:
        raise ClusterctlError(f"no instance {name!r} in the inventory")

    t = GateTarget("a1", "h1", "10.0.0.1", 8400, "tiny")
    why = check_once(CustomGate("bench", 1, reference="nope"), t, no_exec, reference=unknown)
    assert why == "bench gate: reference 'nope': no instance 'nope' in the inventory"
