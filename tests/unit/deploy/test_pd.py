"""Prefill/decode pools: the inventory section, the units' KV-transfer flag and env, the router unit."""

from __future__ import annotations

import json
import shlex

import pytest

from clusterctl.deploy.units import pd
from clusterctl.deploy.units.render import render_instance
from clusterctl.errors import ClusterctlError, InventoryError
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.pdpools import ratio

BASE = """\
version: 1
defaults:
  ssh: {user: root}
  gpus: {count: 4, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}
  nics:
    - {netdev: eth0, role: management}
    - {netdev: eth2, role: data, rdma_device: mlx5_0, port: 1, address: 10.1.0.11}
    - {netdev: eth3, role: data, rdma_device: mlx5_1, port: 1}
fabric: {kind: roce, roce_dscp: 26}
hosts:
  gpu01: {address: 10.0.0.11}
  gpu02: {address: 10.0.0.12}
  gw01: {address: 10.0.0.2, gpus: {count: 0}}
engines:
  vllm-0.11: {path: /opt/vllm-0.11/bin/vllm, version: "0.11.0"}
models:
  qwen3-8b: {path: /models/qwen3-8b, served_name: qwen3-8b}
instances:
  qp1: {model: qwen3-8b, engine: vllm-0.11, placement: "gpu01:0", port: 8001, role: prefill}
  qd1: {model: qwen3-8b, engine: vllm-0.11, placement: "gpu02:[0-1]", port: 8001, role: decode}
  qd2: {model: qwen3-8b, engine: vllm-0.11, placement: "gpu02:[2-3]", port: 8002, role: decode}
"""
POOL = """\
pd_pools:
  qwen-pd:
    model: qwen3-8b
    router: {host: gw01, port: 8300}
"""


def _inv(text: str = BASE + POOL):
    return load_inventory_text(text, "site.yaml")


def test_a_pool_has_its_members_and_p_to_d_ratio() -> None:
    inv = _inv()
    pool = inv.pd_pools["qwen-pd"]
    assert pool.connector == "NixlConnector" and pool.router.policy == "round_robin"
    assert pool.prefill == ["qp1"] and pool.decode == ["qd1", "qd2"]
    assert ratio(inv, pool) == (1, 2)


def test_templates_count_their_replicas_in_the_ratio() -> None:
    text = (
        BASE
        + """\
templates:
  qd-pool: {model: qwen3-8b, engine: vllm-0.11, replicas: 3, tp: 1, hosts: gpu01, port_base: 8101, role: decode}
"""
        + POOL
    )
    inv = _inv(text)
    assert ratio(inv, inv.pd_pools["qwen-pd"]) == (1, 5)


@pytest.mark.parametrize(
    "pool, message",
    [
        (
            "pd_pools:\n  p: {model: nope, router: {host: gw01}}\n",
            "site.yaml:23: pd_pools.p.model: 'nope' is not defined under models",
        ),
        (
            "pd_pools:\n  p: {model: qwen3-8b, router: {host: gw9}}\n",
            "site.yaml:23: pd_pools.p.router.host: 'gw9' is not defined under hosts",
        ),
        ("pd_pools:\n  p: {model: qwen3-8b}\n", "site.yaml:23: pd_pools.p: missing 'router'"),
        ("pd_pools:\n  p: {model: qwen3-8b, connector: Foo, router: {host: gw01}}\n", "pd_pools.p.connector"),
        (
            "pd_pools:\n  p: {model: qwen3-8b, router: {host: gpu01, port: 8001}}\n",
            "pd_pools.p.router.port: 8001 is also instance qp1's port on gpu01",
        ),
        (
            "pd_pools:\n  p: {model: qwen3-8b, router: {host: gpu01, port: 8300, metrics_port: 8001}}\n",
            "site.yaml:23: pd_pools.p.router.metrics_port: 8001 is also instance qp1's port on gpu01",
        ),
        (
            "pd_pools:\n  p: {model: qwen3-8b, router: {host: gw01, port: 8300, metrics_port: 8300}}\n",
            "pd_pools.p.router.metrics_port: 8300 is also the router's port",
        ),
        (
            "pd_pools:\n  p: {model: qwen3-8b, router: {host: gw01, port: 60000}}\n",
            "pd_pools.p.router: port 60000 leaves no metrics port (port + 10000 > 65535): set router.metrics_port",
        ),
        (
            "pd_pools:\n  p: {model: qwen3-8b, router: {host: gw01}}\n  q: {model: qwen3-8b, router: {host: gw01}}\n",
            "site.yaml:24: pd_pools.q: model 'qwen3-8b' already has pool 'p'",
        ),
    ],
)
def test_bad_pools_are_errors_naming_the_line(pool: str, message: str) -> None:
    with pytest.raises(InventoryError) as e:
        _inv(BASE + pool)
    assert message in str(e.value)


def test_role_instances_without_a_pool_or_a_pool_without_decode_are_errors() -> None:
    with pytest.raises(InventoryError) as e:
        _inv(BASE)
    assert "site.yaml:19: instances.qp1: role prefill needs a pd_pools entry for model 'qwen3-8b'" in str(e.value)
    no_decode = BASE.replace("role: decode", "role: mixed")
    with pytest.raises(InventoryError) as e:
        _inv(no_decode + POOL)
    assert "pd_pools.qwen-pd: model 'qwen3-8b' has no decode instances or templates" in str(e.value)


def _exec(unit: str) -> list[str]:
    line = next(x for x in unit.replace("\\\n", " ").splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.split("=", 1)[1])


def _environment(unit: str) -> dict[str, str]:
    out = {}
    for x in unit.splitlines():
        if x.startswith("Environment="):
            k, v = shlex.split(x.split("=", 1)[1])[0].split("=", 1)
            out[k] = v
    return out


def test_pool_members_get_the_kv_transfer_config_and_the_data_nic_env() -> None:
    inv = _inv()
    pre = render_instance(inv, inv.instances["qp1"], secrets={})
    argv = _exec(pre.unit_text)
    cfg = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert cfg == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    env = _environment(pre.unit_text)
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.1.0.11"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "18001"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"
    assert env["UCX_IB_TRAFFIC_CLASS"] == "106"
    # the TP group's NCCL env is still there
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1" and env["NCCL_SOCKET_IFNAME"] == "eth2"
    d2 = _environment(render_instance(inv, inv.instances["qd2"], secrets={}).unit_text)
    assert d2["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "18002"


def test_p2p_nccl_pools_render_producer_and_consumer() -> None:
    inv = _inv(BASE + POOL.replace("model: qwen3-8b", "model: qwen3-8b\n    connector: P2pNcclConnector"))
    roles = {}
    for name in ("qp1", "qd1"):
        argv = _exec(render_instance(inv, inv.instances[name], secrets={}).unit_text)
        roles[name] = json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_role"]
        assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in _environment(
            render_instance(inv, inv.instances[name], secrets={}).unit_text
        )
    assert roles == {"qp1": "kv_producer", "qd1": "kv_consumer"}


def test_an_explicit_kv_transfer_config_in_args_wins() -> None:
    text = BASE.replace(
        "port: 8001, role: prefill", "port: 8001, role: prefill, args: {kv-transfer-config: '{\"kv_connector\":\"X\"}'}"
    )
    inv = _inv(text + POOL)
    argv = _exec(render_instance(inv, inv.instances["qp1"], secrets={}).unit_text)
    assert argv.count("--kv-transfer-config") == 1
    assert argv[argv.index("--kv-transfer-config") + 1] == '{"kv_connector":"X"}'


def test_mixed_instances_are_untouched() -> None:
    inv = _inv(BASE.replace("role: prefill", "role: mixed").replace("role: decode", "role: mixed"))
    unit = render_instance(inv, inv.instances["qp1"], secrets={}).unit_text
    assert "--kv-transfer-config" not in unit and "NIXL" not in unit


def test_router_command_and_unit() -> None:
    inv = _inv()
    pool = inv.pd_pools["qwen-pd"]
    argv = pd.router_argv(inv, pool, inv.instances.values(), binary="/x/vllm-router")
    assert argv == [
        "/x/vllm-router",
        "--vllm-pd-disaggregation",
        "--host",
        "10.0.0.2",
        "--port",
        "8300",
        "--policy",
        "round_robin",
        "--prometheus-host",
        "10.0.0.2",
        "--prometheus-port",
        "18300",
        "--kv-connector",
        "nixl",
        "--prefill",
        "http://10.0.0.11:8001",
        "--decode",
        "http://10.0.0.12:8001",
        "--decode",
        "http://10.0.0.12:8002",
    ]
    unit = pd.router_unit(inv, pool, inv.instances.values(), binary="/x/vllm-router")
    assert _exec(unit) == argv and "Restart=always" in unit
    other = _inv(BASE + POOL.replace("port: 8300}", "port: 8300, metrics_port: 9300}"))
    assert pd.router_argv(other, other.pd_pools["qwen-pd"], other.instances.values())[10:12] == [
        "--prometheus-port",
        "9300",
    ]
    with pytest.raises(ClusterctlError, match="needs placed prefill and decode instances"):
        pd.router_argv(inv, pool, [inv.instances["qp1"]])
