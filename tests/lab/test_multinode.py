"""A replica across lab hosts (a ``nodes: 2`` template): deployed as a head and a headless worker unit,
gated on the head, served; stopping the worker takes the whole replica down (the head's /health fails);
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
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

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
