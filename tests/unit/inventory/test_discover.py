"""``inventory discover`` / ``inventory diff``: an inventory written from facts documents
(the fields of docs/facts.md), and the differences between an inventory and the facts."""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from clusterctl.cli.main import main
from clusterctl.inventory import discover as D
from clusterctl.inventory.loader import load_inventory_text

GIB = 2**30


def gpu(i: int) -> dict:
    return {
        "index": i,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total": 81559 * 2**20,
        "nvlink": [{"link": 0, "state": "active"}],
    }


def nic(netdev: str, rdma: str | None = None, speed_gbps: float = 400.0, operstate: str | None = "up") -> dict:
    return {
        "netdev": netdev,
        "operstate": operstate,
        "speed_mbps": int(speed_gbps * 1000) if rdma else 10000,
        "rdma": {"device": rdma, "port": 1, "rate_gbps": speed_gbps, "link_layer": "Ethernet"} if rdma else None,
    }


def facts(hostname: str, gpus: int = 8) -> dict:
    return {
        "host": {"hostname": hostname},
        "gpus": {"available": True, "devices": [gpu(i) for i in range(gpus)]},
        "nics": [nic("docker0"), nic("eth0"), nic("eth2", "mlx5_0"), nic("eth3", "mlx5_1")],
    }


def test_discover_names_hosts_guesses_roles_groups_racks_and_lists_engines():
    f = {"10.0.0.1": facts("r1n01"), "10.0.0.2": facts("r1n02"), "10.0.0.3": facts("r2n01", gpus=7)}
    base = {"version": 1, "defaults": {"ssh": {"user": "ops"}}, "hosts": {a: {"address": a} for a in [*f, "10.0.0.4"]}}
    engines = {h: [("/opt/vllm/bin/vllm", "0.11.0")] for h in f}
    r = D.discover(
        f,
        base,
        engines=engines,
        rack_rule=re.compile(r"r(?P<rack>\d+)n"),
        missing={"10.0.0.4": "unreachable: timed out"},
    )
    d = r.data
    assert d["defaults"]["gpus"] == {
        "count": 8,
        "model": "H100-80GB-HBM3",
        "memory_gib": 79.6,
        "interconnect": "nvlink",
    }
    assert d["defaults"]["nics"] == [
        {"netdev": "eth0", "role": "management", "speed_gbps": 10.0},
        {"netdev": "eth2", "role": "data", "rdma_device": "mlx5_0", "port": 1, "speed_gbps": 400.0},
        {"netdev": "eth3", "role": "data", "rdma_device": "mlx5_1", "port": 1, "speed_gbps": 400.0},
    ]
    assert sorted(d["hosts"]) == ["10.0.0.4", "r1n01", "r1n02", "r2n01"]
    assert d["hosts"]["r1n01"] == {"address": "10.0.0.1"} and d["hosts"]["r2n01"]["gpus"]["count"] == 7
    assert d["groups"] == {
        "rack-1": {"hosts": "r1n[01-02]", "labels": {"rack": "1"}},
        "rack-2": {"hosts": "r2n01", "labels": {"rack": "2"}},
    }
    assert d["engines"] == {"vllm-0.11.0": {"path": "/opt/vllm/bin/vllm", "version": "0.11.0"}}
    assert any("10.0.0.4: not reached (unreachable: timed out)" in n for n in r.notes)
    assert any("rack rule does not match" in n for n in r.notes)  # 10.0.0.4 keeps its address as name
    inv = load_inventory_text(yaml.safe_dump(d, sort_keys=False), "discovered.yaml", force=True)
    assert inv.hosts["r2n01"].gpus.count == 7 and inv.groups["rack-1"] == ["r1n01", "r1n02"]


def test_diff_names_each_disagreement():
    inv = load_inventory_text(
        """\
version: 1
defaults:
  gpus: {count: 8, model: H100-SXM5-80GB, memory_gib: 79.6, interconnect: nvlink}
  nics:
  - {netdev: eth0, role: management}
  - {netdev: eth2, role: data, rdma_device: mlx5_0, speed_gbps: 400}
  - {netdev: eth4, role: data, rdma_device: mlx5_4, speed_gbps: 400}
hosts:
  gpu[01-03]: {address: '10.0.0.[1-3]'}
engines:
  vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}
models:
  m: {path: /models/m, arch: {layers: 2, hidden_size: 64, attention_heads: 4, kv_heads: 4, head_dim: 16,
      vocab: 1000, params: 1000000, dtype: bfloat16}}
instances:
  a: {model: m, engine: vllm, placement: "gpu02:0", port: 8000}
""",
        "site.yaml",
    )
    f = {"gpu01": facts("gpu01"), "gpu02": facts("gpu02", gpus=7)}
    f["gpu02"]["nics"][2]["rdma"]["rate_gbps"] = 200.0
    diffs = {
        (d.host, d.what): (d.inventory, d.facts, d.severity)
        for d in D.diff(inv, f, missing={"gpu03": "unreachable"}, engines={"gpu02": [], "gpu01": []})
    }
    assert diffs[("gpu02", "gpus.count")] == ("8", "7", "WARN")
    assert ("gpu01", "gpus.count") not in diffs and (
        "gpu01",
        "gpus.model",
    ) not in diffs  # H100-SXM5-80GB = H100 80GB HBM3
    assert diffs[("gpu01", "nic eth4")] == ("data", "absent", "WARN")
    assert diffs[("gpu01", "nic eth3")] == ("not listed", "RDMA port mlx5_1", "WARN")
    assert diffs[("gpu02", "nic eth2.speed_gbps")] == ("400", "200", "WARN")
    assert diffs[("gpu02", "engine vllm")] == ("/opt/vllm/bin/vllm", "not found", "WARN")
    assert ("gpu01", "engine vllm") not in diffs  # no instance of gpu01 uses it
    assert diffs[("gpu03", "reachable")][2] == "UNKNOWN"


@pytest.mark.parametrize(
    "a,b,same",
    [
        ("H100-SXM5-80GB", "H100-80GB-HBM3", True),
        ("H100-80GB", "A100-SXM4-80GB", False),
        ("A100-40GB", "A100-SXM4-80GB", False),
        ("H200", "H200-141GB", True),
    ],
)
def test_gpu_models_match_by_family_and_memory(a, b, same):
    assert D.same_model(a, b) is same


def test_cli_discover_then_diff_round_trip_from_saved_facts(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    saved = {"gpu01": facts("gpu01"), "gpu02": facts("gpu02"), "gpu03": {"status": "unknown", "reason": "unreachable"}}
    (tmp_path / "facts.json").write_text(json.dumps(saved))
    out = tmp_path / "site.yaml"
    assert main(["inventory", "discover", "gpu[01-03]", "--facts", str(tmp_path / "facts.json"), "-o", str(out)]) == 0
    text = out.read_text()
    assert (
        text.startswith("# Written by `clusterctl inventory discover`") and "gpu03: not reached (unreachable)" in text
    )
    assert main(["inventory", "discover", "gpu01", "--facts", str(tmp_path / "facts.json"), "-o", str(out)]) == 3
    assert "exists" in capsys.readouterr().err
    # gpu03 was not reached: its GPUs are unknown, so compare the two that were
    assert main(["inventory", "diff", "gpu[01-02]", "-i", str(out), "--facts", str(tmp_path / "facts.json")]) == 0
    assert "agree" in capsys.readouterr().out
    seven = copy.deepcopy(saved)
    seven["gpu02"]["gpus"]["devices"].pop()
    (tmp_path / "facts7.json").write_text(json.dumps(seven))
    assert main(["inventory", "diff", "-i", str(out), "--facts", str(tmp_path / "facts7.json"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {"host": "gpu02", "what": "gpus.count", "inventory": "8", "facts": "7", "severity": "WARN"} in doc[
        "differences"
    ]
    assert main(["inventory", "discover", "--rack-rule", "(", "gpu01"]) == 3


def test_malformed_facts_are_read_leniently_and_a_foreign_schema_is_unknown_not_a_guess():
    doc = facts("gpu01", gpus=2)
    doc["nics"][2]["rdma"]["port"] = "one"  # was ValueError: invalid literal for int()
    doc["nics"].append("eth9")  # not a NIC entry: left out
    doc["gpus"]["devices"][1]["memory_total"] = "80GB"
    nics, _ = D.nic_specs(doc)
    assert [(n["netdev"], n["role"], n.get("port")) for n in nics] == [
        ("eth0", "management", None),
        ("eth2", "data", 1),
        ("eth3", "data", 1),
    ]
    assert D.gpu_spec(doc) == {"count": 2, "model": "H100-80GB-HBM3", "memory_gib": 79.6, "interconnect": "nvlink"}
    inv = load_inventory_text(
        "version: 1\ndefaults:\n  gpus: {count: 8}\nhosts:\n  gpu01: {address: 10.0.0.1}\n", "site.yaml"
    )
    foreign = dict(facts("gpu01"), schema=2)
    assert [(d.what, d.severity) for d in D.diff(inv, {"gpu01": foreign})] == [("facts", "UNKNOWN")]
    assert "facts schema 2" in D.diff(inv, {"gpu01": foreign})[0].facts
