"""pd.router: a prefill/decode pool's router unit that is down or failing is a finding on its host,
with the action; a ready pool without one is said (the gateway sends the pool's model to it)."""

from __future__ import annotations

from typing import Any

import pytest

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import AnalysisContext, run_analyzers
from clusterctl.diagnose.thresholds import load_thresholds
from clusterctl.inventory.loader import load_inventory_text

from test_pd_check import INV


def _unit(active: str, sub: str, restarts: int = 0, result: str = "success") -> dict[str, Any]:
    return {
        "unit": "clusterctl-router-qwen-pd.service",
        "load_state": "loaded",
        "active_state": active,
        "sub_state": sub,
        "result": result,
        "restarts": restarts,
        "exec_main_status": 1,
    }


def _run(units: list[dict[str, Any]] | None, inv_text: str = INV) -> list:
    inv = load_inventory_text(inv_text, "site.yaml")
    facts: dict[str, Any] = {"gpu01": {"units": units}, "gpu02": {"units": []}}
    ctx = AnalysisContext(inventory=inv, facts=facts, raw={}, thresholds=load_thresholds())
    return run_analyzers(ctx, ["pd.router"])


@pytest.mark.parametrize(
    "active, sub, words",
    [
        ("failed", "failed", "router of pool qwen-pd (model qwen3-8b, port 8300) down: unit failed"),
        ("inactive", "dead", "down: unit inactive"),
        ("activating", "auto-restart", "in a crash loop"),
    ],
)
def test_a_router_down_or_looping_is_crit_with_the_action(active: str, sub: str, words: str) -> None:
    [f] = _run([_unit(active, sub, restarts=2, result="exit-code")])
    assert (f.severity, f.host, f.subject) == (Severity.CRIT, "gpu01", "router:qwen-pd")
    assert words in f.message
    assert "journalctl -u clusterctl-router-qwen-pd.service on gpu01" in f.action
    if active != "activating":
        assert "clusterctl restart router-qwen-pd" in f.action and "gets no request through the gateway" in f.message


def test_an_active_router_is_ok_and_one_that_keeps_restarting_warns() -> None:
    [ok] = _run([_unit("active", "running")])
    assert ok.severity == Severity.OK and "unit active (running)" in ok.message
    [warn] = _run([_unit("active", "running", restarts=5)])
    assert warn.severity == Severity.WARN and "restarted it 5 times" in warn.message


def test_a_ready_pool_without_its_router_warns_and_an_unread_host_is_unknown() -> None:
    [f] = _run([])
    assert f.severity == Severity.WARN and "not deployed: no clusterctl-router-qwen-pd.service on gpu01" in f.message
    assert f.action.startswith("clusterctl deploy")
    [u] = _run(None)
    assert u.severity == Severity.UNKNOWN
