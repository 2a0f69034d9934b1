"""A five-host inventory and the recorded state of its hosts, for playbook plan tests.

``recorded_states`` is what ``remote.read_hosts`` would return: h1's instance
unchanged, h2's changed (older flags), h3's new, h4's stopped (to start), h5
with an instance to remove and one unchanged.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from clusterctl.deploy import remote
from clusterctl.deploy.rollout.engine import desired, render_all
from clusterctl.node.deploy import env_hashes
from clusterctl.deploy.remote import HostState, InstanceState
from clusterctl.inventory.loader import load_inventory

SALT = "pb-salt"
KEY = "pb-key-4d1c09"
KEY_ENV = "CLUSTERCTL_TEST_PLAYBOOK_KEY"
HOSTS = ["h1", "h2", "h3", "h4", "h5"]


def inventory_text(max_len: int = 2048) -> str:
    hosts = "\n".join(f"  {h}: {{address: 127.0.0.{i}}}" for i, h in enumerate(HOSTS, 1))
    insts = "\n".join(
        f"""  a{i}:
    model: tiny
    engine: vllm-0.11
    placement: "{h}:0"
    port: 8100
    args: {{max-model-len: {max_len}}}
    secrets:
      VLLM_API_KEY: {{env: {KEY_ENV}}}"""
        for i, h in enumerate(HOSTS, 1)
    )
    return f"""\
version: 1
defaults:
  ssh: {{user: root, connect_timeout: 0.5}}
  gpus: {{count: 2, model: H100-SXM5-80GB, memory_gib: 79.6, interconnect: nvlink}}
hosts:
{hosts}
groups:
  back: {{hosts: "h[3-5]"}}
engines:
  vllm-0.11: {{path: /opt/vllm-0.11/bin/vllm, version: 0.11.0}}
models:
  tiny: {{path: /models/tiny}}
instances:
{insts}
"""


def _have(r: Any, active: str = "active") -> InstanceState:
    return InstanceState(
        r.instance,
        r.unit_text,
        r.digest,
        env_hashes(r.env_text, SALT),
        True,
        active,
        "running" if active == "active" else "dead",
        0,
        1,
        "enabled",
        1,
        {},
    )


def recorded_states(inv_path: str, state_dir: str) -> dict[str, HostState]:
    inv = load_inventory(inv_path)
    now = {r.instance: r for r in render_all(inv, desired(inv, state_dir)[0])}
    old_inv_path = Path(inv_path).with_name("old.yaml")
    old_inv_path.write_text(inventory_text(max_len=1024))
    old_inv = load_inventory(str(old_inv_path))
    old = {r.instance: r for r in render_all(old_inv, desired(old_inv, state_dir)[0])}
    gone = dataclasses.replace(old["a5"], instance="gone")
    return {
        "h1": HostState("h1", {"a1": _have(now["a1"])}, salt=SALT),
        "h2": HostState("h2", {"a2": _have(old["a2"])}, salt=SALT),
        "h3": HostState("h3", {}, salt=SALT),
        "h4": HostState("h4", {"a4": _have(now["a4"], active="inactive")}, salt=SALT),
        "h5": HostState("h5", {"a5": _have(now["a5"]), "gone": _have(gone)}, salt=SALT),
    }


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The inventory's path; ``remote.read_hosts`` answers with :func:`recorded_states` (no SSH)."""
    state_dir = tmp_path / "state"
    monkeypatch.setenv("CLUSTERCTL_STATE_DIR", str(state_dir))
    monkeypatch.setenv(KEY_ENV, KEY)
    p = tmp_path / "inv.yaml"
    p.write_text(inventory_text())
    states = recorded_states(str(p), str(state_dir))

    def read_hosts(fleet: Any, *, hosts: list[str] | None = None, **_: Any) -> dict[str, HostState]:
        return {h: s for h, s in states.items() if hosts is None or h in hosts}

    monkeypatch.setattr(remote, "read_hosts", read_hosts)
    return str(p)
