"""A CPU engine (vLLM's CPU build, ``engines.X.device: cpu``): unit flags and pre-flight on host RAM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clusterctl.deploy.preflight.memory import GiB
from clusterctl.deploy.preflight.checks import check_instances
from clusterctl.deploy.units.secrets import resolve_secrets
from clusterctl.deploy.units.render import render_instance
from clusterctl.errors import ClusterctlError, ConfigError
from clusterctl.inventory.loader import load_inventory
from clusterctl.inventory.model import Engine
from clusterctl.lab.vllm_sim import synth
from clusterctl.node import preflight as preflight_node
from unit.deploy.preflight_helpers import host, instance, inventory

INV = """\
version: 1
defaults:
  ssh: {user: root}
hosts:
  cpu01: {address: 10.0.0.21, gpus: {count: 2, model: H100-SXM5-80GB, memory_gib: 80}}
engines:
  vllm-cpu: {path: /opt/clusterctl-real-vllm/bin/vllm, version: "0.32.0", device: cpu}
models:
  tiny: {path: /models/tiny}
instances:
  a:
    model: tiny
    engine: vllm-cpu
    placement: cpu01:0
    port: 8001
    args: {kv-cache-memory-bytes: 64M, max-model-len: 2048}
  b:
    model: tiny
    engine: vllm-cpu
    placement: cpu01:1
    port: 8002
    args: {max-model-len: 2048}
"""


@pytest.fixture
def inv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")
    p = tmp_path / "inventory.yaml"
    p.write_text(INV)
    return load_inventory(str(p))


def test_cpu_engine_unit_passes_the_kv_size_and_enforce_eager(inv: Any) -> None:
    assert inv.engines["vllm-cpu"].device == "cpu"
    r = render_instance(inv, inv.instances["a"], secrets=resolve_secrets(inv, inv.instances["a"]))
    text = r.unit_text.replace("\\\n", " ")
    start = " ".join(next(line for line in text.splitlines() if line.startswith("ExecStart=")).split())
    assert "--kv-cache-memory-bytes 64M" in start and start.endswith("--enforce-eager"), start
    assert "Environment=TORCH_COMPILE_DISABLE=1" in r.unit_text


def test_cpu_engine_without_a_kv_size_is_refused_naming_the_instance(inv: Any) -> None:
    with pytest.raises(
        ClusterctlError,
        match=r"instances\.b\.args: engine vllm-cpu runs on CPU: set "
        r"kv-cache-memory-bytes",
    ):
        render_instance(inv, inv.instances["b"], secrets={})


def test_engine_device_must_be_gpu_or_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")
    p = tmp_path / "inventory.yaml"
    p.write_text(INV.replace("device: cpu", "device: tpu"))
    with pytest.raises(ConfigError, match=r"inventory.yaml:\d+: engines.vllm-cpu.device: 'tpu' is not one of gpu, cpu"):
        load_inventory(str(p))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("m") / "tiny"
    synth.write_model("tiny", d)
    return {"/models/tiny": preflight_node.model_sizes(str(d))}


def _cpu_inventory() -> Any:
    inv = inventory()
    inv.engines["vllm-cpu"] = Engine("vllm-cpu", "/opt/vllm/bin/vllm", "0.32.0", device="cpu")
    from clusterctl.inventory.model import Model

    inv.models["tiny"] = Model("tiny", "/models/tiny")
    return inv


def test_preflight_of_a_cpu_engine_checks_host_ram_not_gpu_memory(tiny: dict[str, Any]) -> None:
    hv = host(tiny)
    hv.mem_available = 20 * GiB
    ok = instance("a", model="tiny", engine="vllm-cpu", kv_cache_memory_bytes="64M", max_model_len=2048)
    rep = check_instances(_cpu_inventory(), {"a": ok}, {"gpu01": hv})
    assert rep.row("a").ok and rep.row("a").settings["device"] == "cpu", rep.row("a").problems
    # 64M of tiny-model KV (1 KiB per token) holds 65,536 tokens: the number vLLM 0.32 logs for it.
    assert rep.row("a").settings["predicted_kv_tokens"] == 65536
    hv.mem_available = 1 * GiB
    rep = check_instances(_cpu_inventory(), {"a": ok}, {"gpu01": hv})
    assert [(p.check, p.severity.name) for p in rep.row("a").problems] == [("memory.host", "CRIT")]
    assert "1.00 GiB available" in rep.row("a").problems[0].message


def test_preflight_cpu_engine_kv_too_small_and_missing(tiny: dict[str, Any]) -> None:
    hv = host(tiny)
    hv.mem_available = 20 * GiB
    small = instance("s", model="tiny", engine="vllm-cpu", kv_cache_memory_bytes=2**20, max_model_len=4096)
    none = instance("n", model="tiny", engine="vllm-cpu", port=8001, max_model_len=4096)
    rep = check_instances(_cpu_inventory(), {"s": small, "n": none}, {"gpu01": hv})
    p = rep.row("s").problems[0]
    # vLLM 0.32 said of this instance: "the estimated maximum model length is 896" (tests/fixtures/vllm).
    assert p.check == "memory.kv" and "holds 896 tokens for a request, less than max_model_len 4096" in p.message
    assert "at least 4325376" in p.message  # 33 blocks of 128 tokens x 1 KiB
    assert rep.row("n").problems[0].check == "flags.kv_cache_memory_bytes"
