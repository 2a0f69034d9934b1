"""The seam between deploy and the gateway (ops/deploy.py): the workflow builds the drain hook from
the inventory, with the sudo password it was given, and hands it to the deploy engine and rollback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clusterctl.deploy.rollout import engine
from clusterctl.deploy.rollout.engine import DeployOptions
from clusterctl.gateway.hook import Hook
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.ops import deploy as opsdeploy

from .conftest import INVENTORY


def test_the_hook_is_built_from_the_inventory_with_the_given_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERCTL_BECOME_PASSWORD", "from-the-environment")
    made: list[Any] = []
    monkeypatch.setattr("clusterctl.gateway.hook.make_fleet", lambda hosts, cfg, **kw: made.append(kw) or "fleet")
    hook = opsdeploy.drain_hook(load_inventory_text(INVENTORY), tmp_path, "given")
    assert isinstance(hook, Hook) and hook.state_dir == tmp_path
    assert hook.fleet_factory() == "fleet" and made == [{"become_password": "given"}]
    none = opsdeploy.drain_hook(load_inventory_text(INVENTORY), tmp_path, None)
    assert none is not None and none.fleet_factory() == "fleet" and made[-1] == {"become_password": None}
    bare = load_inventory_text(INVENTORY[: INVENTORY.index("gateway:")])
    assert opsdeploy.drain_hook(bare, tmp_path, "given") is None


def test_deploy_and_rollback_are_given_the_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = load_inventory_text(INVENTORY)
    given: dict[str, Any] = {}

    class FakeDeploy:
        def __init__(self, *args: Any, gateway: Any = None, **kw: Any) -> None:
            given["deploy"] = gateway

        def run(self) -> str:
            return "report"

    monkeypatch.setattr(engine, "Deploy", FakeDeploy)
    monkeypatch.setattr(opsdeploy, "rollback", lambda *a, gateway, **kw: given.__setitem__("rollback", gateway))
    hosts = list(inv.hosts.values())
    req = opsdeploy.DeployRequest(inv, hosts, lambda hs: None, str(tmp_path), DeployOptions(), gateway_password="pw")
    assert opsdeploy.run_deploy(req) == "report"
    assert isinstance(given["deploy"], Hook) and given["deploy"].state_dir == tmp_path
    opsdeploy.run_rollback(opsdeploy.RollbackRequest(inv, hosts, lambda hs: None, str(tmp_path)))
    assert isinstance(given["rollback"], Hook)
