"""The gateway workflows (ops/gateway.py) without the CLI: which hosts a deploy reaches, what a
status run concludes, a render that never holds the key, and no workflow without a gateway."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.gateway.deploy import GatewayHostResult
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.ops import gateway as gwops

from .conftest import INVENTORY


@pytest.fixture
def request_(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> gwops.GatewayRequest:
    monkeypatch.setenv("GW_TEST_KEY", "sk-never-shown")
    return gwops.GatewayRequest(load_inventory_text(INVENTORY), tmp_path / "state")


def test_deploy_reaches_the_named_gateway_host_or_every_one_and_refuses_another(
    request_: gwops.GatewayRequest,
) -> None:
    assert gwops.deploy_hosts(request_, "gw01") == ["gw01"] and gwops.deploy_hosts(request_, "all") == ["gw01"]
    with pytest.raises(ClusterctlError, match="'gpu01' is not a gateway host"):
        gwops.deploy_hosts(request_, "gpu01")


def test_a_sync_reaches_every_instance_host_and_the_gateway(request_: gwops.GatewayRequest) -> None:
    assert gwops.sync_hosts(request_) == ["gpu01", "gpu02", "gw01"]


def test_render_writes_the_files_redacted(request_: gwops.GatewayRequest, tmp_path: Path) -> None:
    out = gwops.render(request_, out=tmp_path / "out")
    assert out.written and all(p.is_file() for p in out.written)
    assert not any("sk-never-shown" in p.read_text() for p in out.written)
    assert not list((tmp_path / "out").rglob("*.tmp"))


def test_status_is_crit_for_a_failed_host_and_warn_for_a_stale_one(
    request_: gwops.GatewayRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    replies: list[GatewayHostResult] = []

    @contextmanager
    def fleet(hosts: Any) -> Iterator[None]:
        yield None

    monkeypatch.setattr(gwops, "gateway_status", lambda fleet, **kw: list(replies))
    monkeypatch.setattr(gwops.gwstate, "load", lambda d: gwops.gwstate.GatewayState(config="abc"))
    req = gwops.GatewayRequest(request_.inventory, request_.state_dir, fleets=fleet)
    replies[:] = [GatewayHostResult("gw01", True, config="abc")]
    assert gwops.status(req).code == ExitCode.OK
    replies[:] = [GatewayHostResult("gw01", True, config="old")]
    st = gwops.status(req)
    assert (st.code, st.stale, st.to_json()["exit_code"]) == (ExitCode.WARN, ["gw01"], 1)
    replies[:] = [GatewayHostResult("gw01", False, error="unreachable")]
    assert gwops.status(req).code == ExitCode.CRIT


def test_no_gateway_section_is_a_clusterctl_error(tmp_path: Path) -> None:
    bare = gwops.GatewayRequest(load_inventory_text(INVENTORY[: INVENTORY.index("gateway:")]), tmp_path)
    for run in (gwops.render, gwops.list_keys, gwops.sync_hosts):
        with pytest.raises(ClusterctlError, match="no 'gateway:' section"):
            run(bare)
