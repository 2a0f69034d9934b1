"""ops/bringup.py: the net apply / node setup workflows check their request before they read
anything or ask for a password, hand the rollout options to the feature, and apply exactly the
plans that were shown."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from clusterctl.bringup.batch import ApplyReport
from clusterctl.config import UserConfig
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.loader import load_inventory
from clusterctl.ops import bringup

EXAMPLE = Path(__file__).resolve().parents[3] / "inventories" / "example-pcie-small.yaml"


def _request(asked: list[str], **kw: Any) -> bringup.BringupRequest:
    inv = load_inventory(EXAMPLE)

    def config() -> UserConfig:
        asked.append("config")
        return UserConfig()

    def password() -> None:
        asked.append("password")
        return None

    return bringup.BringupRequest(
        str(EXAMPLE), inv, list(inv.hosts.values()), load_config=config, become_password=password, **kw
    )


def test_a_fabric_that_is_not_roce_is_refused_before_any_prompt() -> None:
    asked: list[str] = []
    req = _request(asked)
    req = replace(req, inventory=replace(req.inventory, fabric=replace(req.inventory.fabric, kind="ib")))
    with pytest.raises(
        ClusterctlError, match=r"example-pcie-small.yaml: fabric.kind is ib: net apply sets RoCE QoS only"
    ):
        bringup.net_apply(req)
    assert asked == []


@pytest.mark.parametrize("make", [bringup.net_apply_runner, bringup.node_setup_runner])
def test_a_bad_serial_is_refused_before_any_prompt(make: Any) -> None:
    asked: list[str] = []
    with pytest.raises(ClusterctlError):
        make(_request(asked, serial="zero"))
    assert asked == []


def test_the_runners_get_the_rollout_options_and_ask_config_then_password_once() -> None:
    asked: list[str] = []
    net = bringup.net_apply_runner(_request(asked, serial="1,50%", max_fail_percentage=10.0))
    assert (net.serial, net.max_fail) == (["1", "50%"], 10.0)
    assert asked == ["config", "password"]
    asked.clear()
    node = bringup.node_setup_runner(_request(asked, max_fail_percentage=5.0), revert=True)
    assert (node.serial, node.max_fail, node.revert) == (["1"], 5.0, True)
    assert asked == ["config", "password"]


def test_apply_runs_the_plans_that_were_shown_and_reads_no_host_again() -> None:
    calls: list[Any] = []

    class Runner:
        def plan(self) -> list[str]:
            calls.append("plan")
            return ["p1", "p2"]

        def run(self, plans: Any = None) -> ApplyReport:
            calls.append(("run", plans))
            return ApplyReport(plans)

    planned = bringup.plan(Runner())
    assert planned.plans == ["p1", "p2"] and calls == ["plan"]
    rep = planned.apply()
    assert calls == ["plan", ("run", ["p1", "p2"])] and rep.plans == ["p1", "p2"]


def test_engine_list_reads_the_selected_hosts_with_the_requests_fleets(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    req = _request(asked)
    req = replace(req, hosts=list(req.hosts)[:1])
    seen: list[Any] = []
    monkeypatch.setattr(
        bringup,
        "list_engines",
        lambda inv, hosts, make, names: seen.append((inv, [h.name for h in hosts], callable(make), names)) or [],
    )
    assert bringup.engine_list(req, ["vllm-0.11"]) == []
    assert seen == [(req.inventory, [req.hosts[0].name], True, ["vllm-0.11"])]
    assert asked == ["config", "password"]


def test_engine_install_refuses_a_bad_request_before_any_prompt_and_builds_its_fleets_once(tmp_path: Path) -> None:
    asked: list[str] = []
    with pytest.raises(ClusterctlError, match="no engine vllm-9"):
        bringup.engine_op_runner(_request(asked), "vllm-9")
    with pytest.raises(ClusterctlError, match="no vllm wheel of version"):
        bringup.engine_op_runner(_request(asked), "vllm-0.11", wheels=str(tmp_path))
    with pytest.raises(ClusterctlError):
        bringup.engine_op_runner(_request(asked, serial="zero"), "vllm-0.11", remove=True)
    assert asked == []
    op = bringup.engine_op_runner(_request(asked, serial="1,50%", max_fail_percentage=10.0), "vllm-0.11", remove=True)
    assert (op.serial, op.max_fail, op.remove) == (["1", "50%"], 10.0, True) and asked == []
    op.make_fleet([]).close()
    op.make_fleet([]).close()
    assert asked == ["config", "password"]
