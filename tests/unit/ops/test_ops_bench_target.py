"""``ops/bench.endpoint``: bench's TARGET resolved behind the workflow layer (the CLI only catches
its error): a URL reads nothing, an instance name reads the inventory, then the config."""

from __future__ import annotations

import pytest

from clusterctl.config import UserConfig
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Inventory
from clusterctl.ops import bench

INVENTORY = """\
version: 1
defaults:
  gpus: {count: 2, model: H100-SXM5-80GB, memory_gib: 79.6, interconnect: nvlink}
hosts:
  gpu01: {address: 10.0.0.7}
engines:
  vllm-0.11: {path: /opt/vllm-0.11/bin/vllm, version: 0.11.0}
models:
  qwen: {path: /models/qwen}
instances:
  qwen-a: {model: qwen, engine: vllm-0.11, placement: "gpu01:0", port: 8011, env: {VLLM_API_KEY: k-inline}}
"""


def test_a_url_reads_nothing_and_an_instance_reads_the_inventory_then_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("VLLM_API_KEY", "OPENAI_API_KEY", "CLUSTERCTL_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    calls: list[str] = []

    def inv() -> Inventory:
        calls.append("inventory")
        return load_inventory_text(INVENTORY, "inv.yaml")

    def cfg() -> UserConfig:
        calls.append("config")
        return UserConfig()

    assert bench.endpoint("http://10.0.0.9:8000", inv, cfg).url == "http://10.0.0.9:8000"
    assert calls == []
    ep = bench.endpoint("qwen-a", inv, cfg)
    assert (ep.url, ep.api_key) == ("http://10.0.0.7:8011", "k-inline")
    assert calls == ["inventory", "config"]  # the config after the inventory (loading it may bind the state)
    with pytest.raises(ClusterctlError, match="instances: qwen-a"):
        bench.endpoint("qwen-b", inv, cfg)
