"""A hung engine (``/health`` 200, requests running, no token) is ``hung`` in status and down at
the gateway; serving again, it is up again.  The samples are a recorded vLLM 0.11.0 /metrics page
(tests/fixtures/vllm/metrics_v0.11.0.prom) with its counters rewritten."""

from __future__ import annotations

import re
from pathlib import Path

from clusterctl.deploy.status import instances as S
from clusterctl.deploy.status.metrics import HttpAnswer, WindowedMetrics, parse_sample
from clusterctl.diagnose.findings import Severity
from clusterctl.gateway.sync import HUNG_REASON, HUNG_WAITING_REASON, Observed, decide
from clusterctl.inventory.model import Inventory

REAL = (Path(__file__).parents[2] / "fixtures/vllm/metrics_v0.11.0.prom").read_text()


def page(running: float, generated: float, waiting: float = 3.0, prompt: float = 50000.0) -> str:
    text = re.sub(r"(?m)^(vllm:num_requests_running\{[^}]*\}) \S+$", rf"\g<1> {running}", REAL)
    text = re.sub(r"(?m)^(vllm:num_requests_waiting\{[^}]*\}) \S+$", rf"\g<1> {waiting}", text)
    text = re.sub(r"(?m)^(vllm:prompt_tokens_total\{[^}]*\}) \S+$", rf"\g<1> {prompt}", text)
    return re.sub(r"(?m)^(vllm:generation_tokens_total\{[^}]*\}) \S+$", rf"\g<1> {generated}", text)


def row_after(first: str, last: str) -> S.InstanceStatus:
    row = S.InstanceStatus("q1", "gpu01", 8001, "absent", Severity.CRIT, active="active", up_s=100.0)
    S._unit_verdict(row, HttpAnswer(200))
    w = WindowedMetrics(first=parse_sample(first, at=0.0), last=parse_sample(last, at=5.0))
    S._apply_load(row, w, 8, None)
    return row


def test_requests_running_and_no_token_is_hung_though_health_answers() -> None:
    assert "vllm:num_requests_running{" in REAL and "vllm:generation_tokens_total{" in REAL
    row = row_after(page(3, 1000), page(3, 1000))
    assert (row.state, row.severity, row.healthy) == ("hung", Severity.CRIT, True)
    assert row.message.startswith("engine hung: 3 request(s) running, no token generated in 5.0 s")


def test_tokens_moving_or_nothing_running_is_serving() -> None:
    assert row_after(page(3, 1000), page(3, 1040)).state == "serving"
    assert row_after(page(0, 1000, waiting=0), page(0, 1000, waiting=0)).state == "serving"  # idle, not hung
    # one sample only (window 0): nothing to compare, never called hung
    row = S.InstanceStatus("q1", "gpu01", 8001, "absent", Severity.CRIT, active="active", up_s=100.0)
    S._unit_verdict(row, HttpAnswer(200))
    one = parse_sample(page(3, 1000), at=0.0)
    S._apply_load(row, WindowedMetrics(first=one, last=one), 8, None)
    assert row.state == "serving"


def test_sync_takes_a_hung_instance_out_and_puts_it_back(inv: Inventory) -> None:
    serving = {n: Observed("serving", 0.1, None, True) for n in inv.instances}
    hung = {**serving, "q1": Observed("hung", 0.9, None, True, reason="")}
    states = decide(inv, inv.instances, hung)
    assert states["q1"].down and states["q1"].reason == HUNG_REASON
    assert not any(s.down for n, s in states.items() if n != "q1")
    assert not decide(inv, inv.instances, serving)["q1"].down


def test_requests_only_waiting_none_running_and_no_token_is_hung() -> None:
    # the simulator's hang fault with requests sent after it: all queued, none admitted
    row = row_after(page(0, 1000, waiting=4), page(0, 1000, waiting=6))
    assert (row.state, row.severity, row.healthy) == ("hung", Severity.CRIT, True)
    assert row.message.startswith(
        "engine hung: 6 request(s) waiting, none running or admitted, no token generated in 5.0 s"
    )
    assert row_after(page(0, 1000, waiting=4), page(0, 1010, waiting=4)).state == "serving"  # served between
    assert row_after(page(0, 1000, waiting=4, prompt=5e4), page(0, 1000, waiting=4, prompt=6e4)).state == "serving"
    assert row_after(page(0, 1000, waiting=0), page(0, 1000, waiting=0)).state == "serving"  # idle


def test_sync_names_the_waiting_hang_with_fixed_words(inv: Inventory) -> None:
    serving = {n: Observed("serving", 0.1, None, True) for n in inv.instances}
    hung = {**serving, "q1": Observed("hung", 0.9, None, True, running=0.0, waiting=6.0)}
    assert (
        decide(inv, inv.instances, hung)["q1"]
        == decide(inv, inv.instances, {**hung, "q1": Observed("hung", 0.5, None, True, running=0.0, waiting=9.0)})["q1"]
    )
    assert decide(inv, inv.instances, hung)["q1"].reason == HUNG_WAITING_REASON
    assert (
        decide(inv, inv.instances, {**hung, "q1": Observed("hung", 0.9, None, True, running=2.0)})["q1"].reason
        == HUNG_REASON
    )
