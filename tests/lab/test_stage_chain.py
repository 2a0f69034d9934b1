"""Staging on real lab hosts: chain relay over the bridge, status, switch, a dead relay, ExecStartPre.

A ranged HTTP server on this machine's bridge address serves a small
real-byte synthetic model (tiny-qwen3, ~6 MB, 128 KiB chunks); the lab hosts
fetch it over real SSH (the non-root host through sudo) and relay it to each
other over TCP on their bridge addresses.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from clusterctl.fleet import Fleet
from clusterctl.inventory.loader import load_inventory
from clusterctl.inventory.model import Model
from clusterctl.lab.vllm_sim import synth
from clusterctl.node.stage import manifest as mf
from clusterctl.stage.bundle import program
from clusterctl.stage.plan import load_manifest, parse_source, write_manifest
from clusterctl.stage.run import VERIFY_MODEL_PATH, node_op, stage_model

from unit.stage.rangeserver import RangeServer

CHUNK = 128 * 1024


@pytest.fixture(scope="module")
def source(lab, tmp_path_factory):
    root = tmp_path_factory.mktemp("stage-src")
    for seed, v in enumerate(("v1", "v2")):
        synth.write_model("tiny-qwen3", root / v, seed=seed)
        write_manifest(str(root / v), mf.compute(str(root / v), "tiny", v, CHUNK))
    with RangeServer(str(root), host=f"{lab.cfg.net}.0.1") as srv:
        yield srv, root


@pytest.fixture(scope="module")
def inventory(lab, source, tmp_path_factory):
    srv, _ = source
    path = tmp_path_factory.mktemp("stage-inv") / "inventory.yaml"
    text = lab.inventory.read_text() + (
        f"models:\n  tiny:\n    path: /models/tiny\n    source: {srv.url}v1/\n    version: v1\n"
    )
    path.write_text(text)
    for h in lab.names:  # start from hosts that never had this model
        lab.run(h, "rm -rf /models/tiny /models/tiny-relay /models/.versions/tiny", timeout=30, check=True)
    yield path
    for h in lab.names:
        lab.run(
            h,
            "rm -rf /models /usr/local/lib/clusterctl; systemctl stop stgtest-model 2>/dev/null; "
            "rm -f /etc/systemd/system/stgtest-model.service; systemctl daemon-reload",
            timeout=30,
        )


def _cli(*args: str) -> tuple[int, dict]:
    p = subprocess.run(
        [sys.executable, "-m", "clusterctl.cli.main", *args], capture_output=True, text=True, timeout=300
    )
    assert p.stdout, p.stderr
    return p.returncode, json.loads(p.stdout)


def test_chain_stages_everywhere_reading_the_source_once(lab, source, inventory):
    srv, root = source
    srv.requests.clear()
    rc, out = _cli("stage", "tiny", "-i", str(inventory), "--json")
    assert rc == 0, out
    chunks = len(mf.compute(str(root / "v1"), "tiny", "v1", CHUNK).chunks())
    assert len(srv.requests) == chunks  # one host read the source; the others relayed
    rows = {r["host"]: r for r in out["hosts"]}
    assert [rows[h]["status"] for h in lab.names] == ["staged"] * len(lab.names)
    assert "upstream" not in rows[lab.names[0]]
    for prev, h in zip(lab.names, lab.names[1:]):
        assert rows[h]["upstream"] == f"{lab.host(prev).address}:7707"
    rc, st = _cli("stage", "status", "tiny", "-i", str(inventory), "--json")
    assert rc == 0
    for r in st["hosts"]:
        m = r["models"][0]
        assert m["current"] == "v1" and m["versions"] == [
            {"version": "v1", "verified": True, "in_use": True, "bytes": out["bytes_total"]}
        ]
        assert r["verify_model_installed"]
    same = lab.run(lab.names[-1], "sha256sum /models/tiny/model.safetensors", check=True).stdout.split()[0]
    assert same == mf.compute(str(root / "v1"), "t", "v1").files[-1].sha256


def test_new_version_switches_warms_and_prunes(lab, source, inventory):
    srv, root = source
    rc, out = _cli(
        "stage",
        "tiny",
        "-i",
        str(inventory),
        "--json",
        "--source",
        f"{srv.url}v2/",
        "--version",
        "v2",
        "--warm",
        "--keep",
        "1",
    )
    assert rc == 0, out
    for r in out["hosts"]:
        assert r["switched_from"] == "v1" and r["pruned"] == ["v1"]
        assert r["warm"]["resident"] == r["warm"]["bytes"] == out["bytes_total"]
    rc, st = _cli("stage", "status", "-i", str(inventory), "--json")
    assert {r["models"][0]["current"] for r in st["hosts"]} == {"v2"}
    assert {len(r["models"][0]["versions"]) for r in st["hosts"]} == {1}


def test_unit_refuses_an_unverified_model(lab, inventory):
    h = lab.names[0]
    unit = "[Service]\nType=exec\nExecStartPre=" + VERIFY_MODEL_PATH + " %s\nExecStart=/bin/sleep 300\n"
    lab.run(h, "mkdir -p /models/handmade && cp -r /models/tiny/. /models/handmade/", check=True)
    for path, active in (("/models/handmade", False), ("/models/tiny", True)):
        lab.run(
            h,
            f"printf '{unit % path}' > /etc/systemd/system/stgtest-model.service && systemctl daemon-reload",
            check=True,
        )
        r = lab.run(h, "systemctl start stgtest-model; systemctl is-active stgtest-model", timeout=30)
        assert r.stdout.strip() == ("active" if active else "failed"), r
        if not active:
            log = lab.run(h, "journalctl -u stgtest-model --no-pager -n 20", timeout=30).stdout
            assert "refusing to start: /models/handmade is not a clusterctl-staged symlink" in log
        lab.run(h, "systemctl stop stgtest-model; systemctl reset-failed stgtest-model", timeout=30)


def test_a_relay_node_dies_mid_transfer_and_the_others_complete(lab, source, inventory):
    srv, root = source
    inv = load_inventory(str(inventory))
    hosts = [inv.hosts[n] for n in lab.names]
    model = Model("tiny", "/models/tiny-relay", source=f"{srv.url}v1/")
    man = load_manifest(parse_source(model.source), "tiny", "v1", CHUNK)
    victim = lab.names[1]
    srv.requests.clear()
    srv.delay = 0.5  # 8 reads in flight, ~3 s for the source: the chain is mid-transfer when the victim dies

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 30
        while len(srv.requests) < 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        d = program().digest  # the staging program runs from the node cache, its sha256 on the command line
        pids = lab.run(victim, f"pgrep -f '[{d[0]}]{d[1:]}'", timeout=10).stdout.split()
        assert pids
        lab.run(victim, "kill -9 " + " ".join(pids), timeout=10)

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    try:
        with Fleet(hosts, fanout=len(hosts), command_timeout=120) as fleet:
            report = stage_model(fleet, hosts, model, parse_source(model.source), man, stall_timeout=5)
    finally:
        killer.join()
        srv.delay = 0
    rows = {r.host: r for r in report.rows}
    assert not rows[victim].ok
    for h in lab.names:
        if h != victim:
            assert rows[h].status == "staged", rows[h]
    after = lab.names[2]
    assert rows[after].data["upstream"] == f"{lab.host(lab.names[0]).address}:7707"
    assert any(lab.host(victim).address in e for e in rows[after].data["events"])
    assert len(srv.requests) == len(man.chunks())  # still read once
    with Fleet(hosts, fanout=len(hosts)) as fleet:
        st = {r.host: r for r in node_op(fleet, "status", [model])}
    assert st[victim].data["models"][0]["current"] is None and st[victim].data["models"][0]["partial"] == ["v1"]


def test_tree_relay_reads_the_source_once_with_two_children_per_node(lab, source, inventory):
    srv, root = source
    srv.requests.clear()
    # A version name no host has yet (earlier tests left v1 under /models/.versions/tiny).
    rc, out = _cli(
        "stage",
        "tiny",
        "-i",
        str(inventory),
        "--json",
        "--source",
        f"{srv.url}v1/",
        "--version",
        "v1-tree",
        "--relay",
        "tree",
        "--tree-fanout",
        "2",
    )
    assert rc == 0, out
    assert len(srv.requests) == len(mf.compute(str(root / "v1"), "tiny", "v1", CHUNK).chunks())
    rows = {r["host"]: r for r in out["hosts"]}
    names = lab.names
    assert "upstream" not in rows[names[0]] and all(rows[h]["status"] == "staged" for h in names)
    # Breadth-first: host i's parent is host (i - 1) // 2.
    for i, h in enumerate(names[1:], start=1):
        assert rows[h]["upstream"] == f"{lab.host(names[(i - 1) // 2]).address}:7707"


def test_progress_streams_over_ssh_while_hosts_stage(lab, source, inventory):
    srv, _ = source
    inv = load_inventory(str(inventory))
    hosts = [inv.hosts[n] for n in lab.names]  # the last host goes through sudo
    model = Model("tiny-progress", "/models/tiny-progress", source=f"{srv.url}v1/")
    man = load_manifest(parse_source(model.source), model.name, "v1", CHUNK)
    seen: dict[str, list[tuple[float, int]]] = {h: [] for h in lab.names}
    finished: dict[str, float] = {}
    srv.delay = 0.05
    try:
        with Fleet(hosts, fanout=len(hosts), command_timeout=120) as fleet:
            report = stage_model(
                fleet,
                hosts,
                model,
                parse_source(model.source),
                man,
                relay="none",
                on_progress=lambda h, d, t: seen[h].append((time.monotonic(), d)),
                on_result=lambda r: finished.setdefault(r.host, time.monotonic()),
                progress_interval=0.1,
            )
    finally:
        srv.delay = 0
    assert report.ok, report.rows
    for h in lab.names:
        assert seen[h][-1][1] == man.total_bytes
        # Live: some report arrived before the host's command returned, with part of the bytes.
        assert any(t < finished[h] and 0 <= d < man.total_bytes for t, d in seen[h]), seen[h]
    for h in lab.names:
        lab.run(h, "rm -rf /models/tiny-progress /models/.versions/tiny-progress", timeout=30)


def test_pin_keeps_the_budget_resident_through_an_evict_until_unpinned(lab, source, inventory):
    h = lab.names[-1]  # the non-root host: pinning goes through sudo
    rc, out = _cli("stage", "pin", "tiny", "-i", str(inventory), "--hosts", h, "--budget", "2M", "--json")
    assert rc == 0, out
    m = out["hosts"][0]["models"][0]
    assert m["pin"]["mode"] == "mlock" and m["pin"]["bytes"] == 2 << 20
    rc, ev = _cli("stage", "evict", "tiny", "-i", str(inventory), "--hosts", h, "--json")
    assert rc == 0
    # DONTNEED cannot drop locked pages: at least the budget stays resident.
    assert ev["hosts"][0]["models"][0]["residency"]["resident"] >= 2 << 20
    rc, st = _cli("stage", "status", "tiny", "-i", str(inventory), "--hosts", h, "--json")
    assert st["hosts"][0]["models"][0]["pin"]["mode"] == "mlock"
    rc, un = _cli("stage", "unpin", "tiny", "-i", str(inventory), "--hosts", h, "--json")
    assert rc == 0 and "pin" not in un["hosts"][0]["models"][0]
    assert lab.run(h, "systemctl is-active clusterctl-pin-tiny.service", timeout=30).stdout.strip() != "active"
    rc, ev = _cli("stage", "evict", "tiny", "-i", str(inventory), "--hosts", h, "--json")
    assert ev["hosts"][0]["models"][0]["residency"]["resident"] < 2 << 20
