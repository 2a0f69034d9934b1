"""Gateway unit tests: a small inventory with two models, a gray release and a mirror."""

from __future__ import annotations

import pytest

from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Inventory

INVENTORY = """\
version: 1
defaults:
  ssh: {use_ssh_config: false}
  gpus: {count: 4, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}
hosts:
  gw01: {address: 10.0.0.1}
  gpu[01-02]: {address: '10.0.1.[1-2]'}
engines:
  vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}
models:
  qwen: {path: /models/qwen3-8b, served_name: Qwen/Qwen3-8B}
  qwen-v2: {path: /models/qwen3-8b-v2, served_name: Qwen/Qwen3-8B}
  llama: {path: /models/llama}
instances:
  q1: {model: qwen, engine: vllm, placement: [gpu01:0], port: 8001}
  q2: {model: qwen, engine: vllm, placement: [gpu02:0], port: 8001}
  q3: {model: qwen-v2, engine: vllm, placement: [gpu02:1], port: 8002}
  l1: {model: llama, engine: vllm, placement: ['gpu01:[2-3]'], port: 8003}
gateway:
  hosts: gw01
  port: 8080
  max_conns: 4
  limits: {connections: 100, requests_per_second: 50, burst: 20}
  sync_interval_s: 5
  api_key: {env: GW_TEST_KEY}
  gray:
    - {stable: qwen, canary: qwen-v2, percent: 10}
  mirrors:
    - {model: llama, candidate: qwen-v2, percent: 5}
"""


@pytest.fixture(autouse=True)
def _no_ssh_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")


@pytest.fixture
def inv() -> Inventory:
    return load_inventory_text(INVENTORY, "inv.yaml")
