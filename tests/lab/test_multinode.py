"""A replica across lab hosts (a ``nodes: 2`` template): deployed as a head and a headless worker unit,
gated on the head, served; served through the lab's nginx gateway, a bad version (its gate fails) is rolled
out to both hosts as one and deploy's rollback puts both members back (workers, then the head), the gateway
marking the replica down and up around it; stopping the worker takes the whole replica down (the head's /health fails);
a lost GPU on the worker's stage makes the replica's TP group UNAVAILABLE and ``failover`` moves the whole
replica (both units) onto two healthy hosts, where it serves again.

The simulator (vllm-0.33) runs vLLM's multiprocessing executor across nodes
(vllm_sim/multinode.py): the head serves only once every rank joined and its
engine dies with a lost rank.  Cheap: the tiny model, time scale 0, one GPU per
host (GPUs 0-4 of the three hosts cordoned in the test's own state, so the replica
takes GPU 5 and up), the hosts cleaned in parallel.  Needs three lab hosts (CI has four).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterctl.cli.main import main
from clusterctl.deploy.rollout.engine import Deploy, DeployOptions
from clusterctl.deploy.state import Cordon, StateStore
from clusterctl.fleet import Fleet
from clusterctl.gateway.failover import FailoverOptions, run_failover
from clusterctl.inventory.loader import load_inventory
from clusterctl.lab.hardware import faults as hw_faults
from support.deploy_lab import remove_deployed, tiny_entry, tiny_model
from support.http import http

PORT = 8510
GPU = 5
GW_PORT = 8080


def _health(url: str) -> int:
    try:
        return http(url + "/health", None, 2)[0]
    except OSError:
        return 0


def _until(what: str, ok: Any, timeout: float, journal: Any) -> None:
    end = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < end, f"{what} within {timeout} s\n{journal()}"
        time.sleep(0.2)


def _fleet(hosts: Any) -> Fleet:
    return Fleet(list(hosts), connect_timeout=10, command_timeout=120)


@pytest.fixture(scope="module")
def replica(lab, tmp_path_factory: pytest.TempPathFactory):
    assert len(lab.names) >= 3, "the multi-node test needs 3 lab hosts (failover re-places the replica)"
    hosts = lab.names[:3]
    root = tmp_path_factory.mktemp("multinode")
    doc = yaml.safe_load(Path(lab.inventory).read_text())
    doc["models"] = {"mn-tiny": tiny_entry(tiny_model(root), "/models/mn-tiny")}
    doc.pop("instances", None)
    doc["templates"] = {
        "mn": {
            "model": "mn-tiny",
            "engine": "vllm-0.33",
            "replicas": 1,
            "tp": 1,
            "nodes": 2,
            "hosts": ",".join(hosts),
            "port_base": PORT,
            "args": {"max-model-len": 2048},
            "env": {"VLLM_SIM_TIME_SCALE": "0"},
        }
    }
    inv_path = root / "mn.yaml"
    inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    inv = load_inventory(str(inv_path))
    state = root / "state"
    with StateStore(state).update() as st:  # off the GPUs other lab tests use
        st.cordons.update(
            {
                f"{h}:{g}": Cordon("lab: other tests", "test@lab", "2026-12-02T00:00:00Z")
                for h in hosts
                for g in range(GPU)
            }
        )
    try:
        rep = Deploy(inv, [inv.hosts[h] for h in hosts], _fleet, str(state), DeployOptions(gate_timeout_s=60)).run()
        head, worker = StateStore(state).load().placements["mn"]["mn-1"].hosts
        yield inv, rep, head, worker, state
    finally:
        with cf.ThreadPoolExecutor(3) as ex:
            list(
                ex.map(
                    lambda h: (
                        hw_faults.heal(lab.host_dir(h)),
                        remove_deployed(
                            lab,
                            "clusterctl-mn*.service",
                            "/etc/clusterctl/instances/mn*.env /var/lib/clusterctl/deploy/previous/mn* "
                            "/models/mn-tiny /models/.versions/mn-tiny",
                            [h],
                        ),
                    ),
                    hosts,
                )
            )


def _complete(url: str) -> tuple[int, str, int]:
    """One completion: (status, the gateway's ``X-Gateway-Instance``, completion tokens)."""
    req = urllib.request.Request(
        url + "/v1/completions",
        headers={"Content-Type": "application/json"},
        data=json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 2, "ignore_eos": True}).encode(),
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.headers.get("X-Gateway-Instance", ""), json.loads(r.read())["usage"]["completion_tokens"]


def _answered(url: str) -> tuple[int, str, int] | str:
    """:func:`_complete`, or the error (an HTTP error status, a refused connection) as text."""
    try:
        return _complete(url)
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def _units_now(lab: Any, units: dict[str, str]) -> dict[str, tuple[int, str, int]]:
    """host -> (when its unit last started: CLOCK_MONOTONIC µs, which the lab hosts share; the unit's text;
    how many of its journal's start-up lines show the bad version), one call per host, all at once."""

    def one(host: str) -> tuple[int, str, int]:
        unit = units[host]
        out = lab.run(
            host,
            f"systemctl show -p InactiveExitTimestampMonotonic --value {unit}; systemctl cat {unit}; "
            f"journalctl -u {unit} --no-pager -o cat | grep -c 'gpu_memory_utilization.: 1.5'; true",
            check=True,
        ).stdout.strip()
        first, _, rest = out.partition("\n")
        text, _, starts = rest.rpartition("\n")
        return int(first), text, int(starts)

    with cf.ThreadPoolExecutor(len(units)) as ex:
        return dict(zip(units, ex.map(one, units)))


def test_served_through_the_gateway_a_bad_version_goes_to_both_hosts_and_is_rolled_back_as_one(
    lab, replica, capsys
) -> None:
    inv, rep, head, worker, state = replica
    assert rep.result == "ok"
    doc = yaml.safe_load((state.parent / "mn.yaml").read_text())
    gw_host = lab.names[0]
    doc["gateway"] = {"hosts": gw_host, "port": GW_PORT, "auth": "none", "sync_interval_s": 1}
    good = state.parent / "mn-gw.yaml"
    good.write_text(yaml.safe_dump(doc, sort_keys=False))
    doc["templates"]["mn"]["args"]["gpu-memory-utilization"] = 1.5  # the head's engine refuses it at start
    bad = state.parent / "mn-gw-bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    units = {head: "clusterctl-mn-1.service", worker: "clusterctl-mn-1-node1.service"}
    url = f"http://{lab.host(gw_host).address}:{GW_PORT}"
    marks: list[str] = []  # what the gateway state said of mn-1 while the deploy ran
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                mark = json.loads((state / "gateway.json").read_text())["marked_down"].get("mn-1")
            except (OSError, ValueError, KeyError):
                mark = None
            reason = mark["reason"] if mark else "up"
            if not marks or marks[-1] != reason:
                marks.append(reason)
            time.sleep(0.05)

    try:
        assert main(["gateway", "deploy", gw_host, "-i", str(good), "--state-dir", str(state)]) == 0
        assert _complete(url) == (200, "mn-1", 2)  # the gateway knows the head only
        before = _units_now(lab, units)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        capsys.readouterr()
        rc = main(
            ["deploy", "-i", str(bad), "--state-dir", str(state), "--hosts", ",".join(lab.names[:3])]
            + ["--instances", "mn-*", "--force", "--gate-timeout", "60", "--drain-timeout", "5", "--json"]
        )
        done.set()
        watcher.join(5)
        out = json.loads(capsys.readouterr().out)
        assert rc == 2 and out["result"] == "rolled_back", json.dumps(out)[:3000]
        # one batch, the replica's two hosts, both rolled back; the head's gate named the engine's error
        assert sorted(map(sorted, out["batches"])) == [sorted(units)], out["batches"]
        assert {h["host"]: h["status"] for h in out["hosts"] if h["host"] in units} == dict.fromkeys(
            units, "rolled_back"
        ), out["hosts"]
        failed = [g for h in out["hosts"] for g in h["gates"] if not g["ok"]]
        assert failed and failed[0]["instance"] == "mn-1", failed
        assert "GPU memory utilization must be less than 1.0" in failed[0]["reason"], failed
        after = _units_now(lab, units)
        # the bad version reached the worker too (its start-up line), and neither unit keeps it
        assert after[worker][2] > before[worker][2], (before, after)
        assert all("gpu-memory-utilization" not in text for _, text, _ in after.values()), after
        # rolled back in the replica's order: both restarted after the deploy began, the worker first
        assert all(after[h][0] > before[h][0] for h in units), (before, after)
        assert after[worker][0] < after[head][0], after
        # the gateway: drained (marked down) before the change, put back once the restored head passed
        assert marks == ["up", "drain", "up"], marks
        assert out["gateway"] == {"mn-1": "up at the gateway"}, out["gateway"]
        assert json.loads((state / "gateway.json").read_text())["marked_down"] == {}
        # nginx's reload is asynchronous: the first requests after the mark-up may still meet the old workers
        _until("mn-1 answers through the gateway", lambda: _answered(url) == (200, "mn-1", 2), 30, lambda: "")
    finally:
        done.set()
        lab.run(gw_host, "systemctl disable --now nginx.service", timeout=60)


def test_a_replica_across_two_hosts_is_deployed_gated_and_fails_as_one(lab, replica) -> None:
    inv, rep, head, worker, _ = replica
    assert rep.result == "ok", json.dumps(rep.to_dict(), default=str)[:3000]
    # the plan says where the template's replica went: two hosts under one leaf (the lab's first rack), RDMA
    [placed] = rep.plan.placed if rep.plan is not None else []
    assert placed.startswith(
        f"replica mn-1 placed on 2 hosts: {head} GPUs {GPU} (head), {worker} GPUs {GPU} (rank 1); port {PORT}; "
    ) and placed.endswith(", leaf leaf1, RDMA on every host"), placed
    assert sorted(map(sorted, rep.batches))[0] == sorted([head, worker])  # one batch: the replica's hosts
    assert [g.instance for o in rep.hosts.values() for g in o.gates] == ["mn-1"]  # the head's gate covers both
    url = f"http://{inv.hosts[head].address}:{PORT}"
    status, body = http(
        url + "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 2, "ignore_eos": True}, 30
    )
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
    log = lab.run(head, "journalctl -u clusterctl-mn-1.service --no-pager -o cat", check=True).stdout
    assert "DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=" in log and "world_size=2" in log
    wlog = lab.run(worker, "journalctl -u clusterctl-mn-1-node1.service --no-pager -o cat", check=True).stdout
    assert "headless multiproc executor, with head node address" in wlog
    for h, unit in ((head, "clusterctl-mn-1.service"), (worker, "clusterctl-mn-1-node1.service")):
        # the lab NICs' GID tables: link-local at 0/1, the data address at 2 (RoCE v1) and 3 (RoCE v2)
        env = lab.run(h, f"systemctl show -p Environment {unit}", check=True).stdout
        assert "NCCL_IB_GID_INDEX=3" in env.split(), env

    def journal() -> str:
        return lab.run(head, "journalctl -u clusterctl-mn-1.service --no-pager -n 30 -o cat").stdout

    lab.run(worker, "systemctl stop clusterctl-mn-1-node1.service", check=True, timeout=60)
    _until("the head stops being healthy once its worker is gone", lambda: _health(url) != 200, 30, journal)
    assert "Engine client died. Shutting down server." in journal()


def test_a_lost_gpu_on_the_worker_stage_makes_the_replica_unavailable_and_failover_moves_it_whole(lab, replica) -> None:
    inv, rep, head, worker, state = replica
    assert rep.result == "ok"
    before = StateStore(state).load().placements["mn"]["mn-1"]
    # XIDs that earlier tests of the shared lab injected stay in kern.log (as on a real node) and failover's
    # doctor would cordon those hosts too (CI: XID 79 on lab01 left no room): start from clean kernel logs.
    for name in lab.names[:3]:
        lab.run(name, ": > /var/log/kern.log", check=True)
    hw_faults.inject(lab.host_dir(worker), "gpu-lost", gpu=before.workers[0][1][0], log=False)
    out = run_failover(inv, state, _fleet, FailoverOptions(max_share=1.0, gate_timeout_s=60, drain_timeout_s=5))
    assert out.plan.findings["mn-1"].startswith(f"UNAVAILABLE: member {worker}:{GPU}"), out.plan.findings
    assert out.moved == {"mn-1": None}, json.dumps(out.to_json(), default=str)[:4000]
    after = StateStore(state).load()
    new = after.placements["mn"]["mn-1"]
    # the whole replica moved: two stages again, off the lost GPU's host (cordoned: node-level), off the GPUs it left
    assert len(new.stages) == 2 and worker not in new.hosts
    assert not {(h, g) for h, gs in new.stages for g in gs} & {(h, g) for h, gs in before.stages for g in gs}
    assert after.cordons[worker].reason.startswith("failover: gpu.lost")
    url = f"http://{inv.hosts[new.host].address}:{PORT}"
    status, body = http(
        url + "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 2, "ignore_eos": True}, 30
    )
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
    gone = lab.run(worker, "test -e /etc/systemd/system/clusterctl-mn-1-node1.service && echo present || echo gone")
    assert gone.stdout.strip() == "gone"  # the old worker's unit removed from the failed host
    wlog = lab.run(
        new.workers[0][0], "journalctl -u clusterctl-mn-1-node1.service --no-pager -o cat", check=True
    ).stdout
    assert "headless multiproc executor, with head node address" in wlog
