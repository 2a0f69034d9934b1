"""``collect`` hands bundles to other people: the inventory redacted as ``show --json`` does, mode 0600 (issue 21)."""

from __future__ import annotations

import stat
import tarfile
from pathlib import Path

import pytest

from clusterctl.cli import collect as collect_cli
from clusterctl.cli.inventory import inventory_json
from clusterctl.cli.main import main
from clusterctl.deploy.units.secrets import redact_inventory_text
from clusterctl.diagnose.bundle import Snapshot
from clusterctl.inventory.loader import load_inventory_text

INVENTORY = """\
version: 1
defaults:
  ssh: {use_ssh_config: false}
  gpus: {count: 1, model: H100-SXM5-80GB, memory_gib: 80}
  vars: {db_password: &pw hunter2-vars}
hosts:
  gpu01: {address: 10.0.0.1}
engines:
  vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}
models:
  m: {path: /models/m}
instances:
  a:
    model: m
    engine: vllm
    placement: [gpu01:0]
    port: 8001
    env:
      HF_TOKEN: hf_live_SECRET1
      VLLM_LOGGING_LEVEL: INFO
      ADMIN_PASSWORD: *pw
      S3_SECRET_KEY: >-
        folded-SECRET2
    secrets: {VLLM_API_KEY: {env: SOME_VAR}}
"""
SECRETS = ("hf_live_SECRET1", "hunter2-vars", "folded-SECRET2")


def test_redacted_text_hides_what_show_json_hides_and_keeps_every_line():
    red = redact_inventory_text(INVENTORY)
    assert not any(s in red for s in SECRETS)
    assert red.count("\n") == INVENTORY.count("\n")
    assert [i for i, line in enumerate(red.splitlines()) if "VLLM_LOGGING_LEVEL: INFO" in line] == [
        i for i, line in enumerate(INVENTORY.splitlines()) if "VLLM_LOGGING_LEVEL: INFO" in line
    ]
    inv = load_inventory_text(red, "bundle/inventory.yaml")  # still a valid inventory
    shown = inventory_json(load_inventory_text(INVENTORY, "inv.yaml"))["instances"][0]["env"]
    kept = inv.instances["a"].env
    assert {k for k, v in shown.items() if v == "***"} <= {k for k, v in kept.items() if v == "***"}
    assert kept["VLLM_LOGGING_LEVEL"] == "INFO" and "SOME_VAR" in red  # references are not secrets


def test_text_that_is_not_yaml_is_left_out_not_copied():
    assert "hf_" not in redact_inventory_text("env: {HF_TOKEN: hf_x\n  - [")


@pytest.mark.parametrize("name", ["b", "b.tar.gz"])
def test_collect_writes_a_redacted_owner_only_bundle(tmp_path: Path, monkeypatch, name: str):
    inv = tmp_path / "site.yaml"
    inv.write_text(INVENTORY)
    monkeypatch.setattr(
        collect_cli,
        "live_snapshot",
        lambda pattern, path, **k: (
            Snapshot(facts={"gpu01": {"host": "gpu01"}}, raw={"gpu01": {"kernel.log": "ok\n"}}),
            None,
            path,
        ),
    )
    out = tmp_path / name
    assert main(["collect", "all", "-i", str(inv), "-o", str(out)]) == 0
    if name.endswith(".tar.gz"):
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
        with tarfile.open(out) as tar:
            members = tar.getmembers()
            text = tar.extractfile(next(m for m in members if m.name.endswith("inventory.yaml"))).read().decode()
        assert all(stat.S_IMODE(m.mode) == (0o700 if m.isdir() else 0o600) for m in members)
    else:
        paths = [out, *out.rglob("*")]
        assert all(stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600) for p in paths)
        text = (out / "inventory.yaml").read_text()
    assert not any(s in text for s in SECRETS) and "'***'" in text


def test_redacted_copy_stays_a_valid_inventory_with_its_host_key_policy():
    """``host_key_policy`` names a key but holds no secret: the bundle's copy must still load."""
    text = INVENTORY.replace(
        "ssh: {use_ssh_config: false}", "ssh: {use_ssh_config: false, host_key_policy: accept-new}"
    )
    red = redact_inventory_text(text)
    assert "host_key_policy: accept-new" in red and "hf_live_SECRET1" not in red
    inv = load_inventory_text(red, "bundle/inventory.yaml")
    assert inv.hosts["gpu01"].ssh.host_key_policy is not None
