"""Control side: sources, the chain plan, pushing a local directory through a node's stdin."""

from __future__ import annotations

import pytest

from clusterctl.node.stage import manifest as mf, verify_model
from clusterctl.stage.plan import (
    StageError,
    load_manifest,
    parse_source,
    plan_chains,
    push_frames,
    rack_groups,
    write_manifest,
)

from unit.stage.nodehelp import make_model, manifest_for, run_node, stage_job
from unit.stage.rangeserver import RangeServer

HOSTS = [(f"n{i}", f"10.0.0.{i}") for i in range(1, 8)]


def test_one_chain_each_host_knows_its_ancestors_nearest_first():
    plans = plan_chains(HOSTS[:4], "chain", port=7000)
    assert [p.upstream_hosts for p in plans] == [[], ["n1"], ["n2", "n1"], ["n3", "n2", "n1"]]
    assert plans[2].upstreams == [("10.0.0.2", 7000), ("10.0.0.1", 7000)]
    assert [p.port for p in plans] == [7000, 7000, 7000, None]  # the tail serves nobody
    assert [p.children for p in plans] == [1, 1, 1, 0]


def test_several_chains_bound_the_source_readers():
    plans = plan_chains(HOSTS, "chain", chains=3)
    heads = [p.host for p in plans if not p.upstreams]
    assert heads == ["n1", "n4", "n6"]  # 7 hosts: chains of 3, 2, 2
    assert plans[3].upstream_hosts == [] and plans[4].upstream_hosts == ["n4"]
    assert all(not p.upstreams for p in plan_chains(HOSTS, "none"))
    with pytest.raises(StageError, match="expected one of chain, tree, none"):
        plan_chains(HOSTS, "star")


def test_a_tree_feeds_fanout_children_per_node_and_knows_every_ancestor():
    plans = {p.host: p for p in plan_chains(HOSTS, "tree", port=7000, fanout=2)}
    # n1 -> n2, n3; n2 -> n4, n5; n3 -> n6, n7: depth 2 instead of 6.
    assert [plans[h].children for h in ("n1", "n2", "n3", "n4")] == [2, 2, 2, 0]
    assert plans["n5"].upstream_hosts == ["n2", "n1"] and plans["n7"].upstream_hosts == ["n3", "n1"]
    assert plans["n4"].port is None and plans["n3"].port == 7000
    assert max(len(p.upstreams) for p in plans.values()) == 2
    wide = plan_chains(HOSTS, "tree", fanout=6)
    assert [p.children for p in wide] == [6, 0, 0, 0, 0, 0, 0]


def test_one_chain_per_rack_reads_the_source_once_per_rack():
    racks = ["r1", "r2", "r1", "r2", "r1", "r3", "r3"]
    plans = plan_chains(HOSTS, "chain", groups=rack_groups(HOSTS, racks))
    assert [p.host for p in plans if not p.upstreams] == ["n1", "n2", "n6"]
    by = {p.host: p for p in plans}
    assert by["n5"].upstream_hosts == ["n3", "n1"] and by["n4"].upstream_hosts == ["n2"]


def test_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_STAGE_AUTH", "Bearer t0ken")
    s = parse_source("https://u:pw@store.example/models/q?sig=x")
    assert s.kind == "http" and s.headers == {"Authorization": "Bearer t0ken"}
    assert "pw" not in s.label and "sig" not in s.label and "pw" not in repr(s)
    assert parse_source("file:///mnt/nfs/q").node_spec() == {"kind": "file", "root": "/mnt/nfs/q"}
    assert parse_source(str(tmp_path)).kind == "push"
    with pytest.raises(StageError, match=r"inv.yaml: models.q.source: unsupported source scheme 'gs'"):
        parse_source("gs://bucket/q", "inv.yaml: models.q.source")
    with pytest.raises(StageError, match="no such directory on this machine"):
        parse_source(str(tmp_path / "nope"))


def test_manifest_from_an_http_source_and_a_missing_one(tmp_path):
    src = make_model(tmp_path / "src", {"a.bin": 100_000})
    with RangeServer(str(src)) as srv:
        with pytest.raises(StageError, match="clusterctl stage manifest DIR"):
            load_manifest(parse_source(srv.url), "q", None)
        written = mf.compute(str(src), "q", "2025-06", chunk_size=65536)
        write_manifest(str(src), written)
        man = load_manifest(parse_source(srv.url), "q", None)
        assert man.version == "2025-06" and man.files == written.files
        assert load_manifest(parse_source(srv.url), "q", "pinned").version == "pinned"


def test_a_local_directory_is_pushed_through_stdin(tmp_path):
    src = make_model(tmp_path / "src", {"a.bin": 200_000, "b/c.json": 10})
    source = parse_source(str(src))
    man = load_manifest(source, "q", "v1", chunk_size=65536)
    target = tmp_path / "node" / "q"
    rc, res = run_node(stage_job(man, target, source.node_spec()), extra_stdin=push_frames(source, man))
    assert rc == 0, res
    assert (target / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert verify_model.check(str(target)) is None
    # A truncated push is an error, and nothing is switched.
    rc, res = run_node(
        stage_job(manifest_for(src, version="v2"), tmp_path / "n2" / "q", source.node_spec()),
        extra_stdin=push_frames(source, manifest_for(src, version="v2"))[:70_000],
    )
    assert rc == 1 and res["kind"] == "fetch" and "run stage again" in res["error"]
    assert not (tmp_path / "n2" / "q").exists()


def test_relay_address_prefers_the_storage_then_the_data_nic():
    from clusterctl.inventory.model import Host, NicSpec
    from clusterctl.stage.run import relay_address

    h = Host("g1", "10.0.0.1", nics=[NicSpec("eth0", "management"), NicSpec("ens1f0", "data", address="192.168.10.1")])
    assert relay_address(h) == "192.168.10.1" and relay_address(h, "management") == "10.0.0.1"
    h.nics.append(NicSpec("ens2", "storage", address="172.16.0.1"))
    assert relay_address(h) == "172.16.0.1" and relay_address(h, "data") == "192.168.10.1"
    with pytest.raises(StageError, match="g1 has no storage NIC with an address"):
        relay_address(Host("g1", "10.0.0.1"), "storage")
    assert relay_address(Host("g1", "10.0.0.1")) == "10.0.0.1"
