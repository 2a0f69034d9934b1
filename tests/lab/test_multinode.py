"""A replica across two lab hosts: deployed as a head and a headless worker unit, gated on the head,
served; stopping the worker takes the whole replica down (the head's /health fails).

The simulator (vllm-0.33) runs vLLM's multiprocessing executor across nodes
(vllm_sim/multinode.py): the head serves only once every rank joined and its
engine dies with a lost rank.  Cheap: the tiny model, time scale 0, one GPU per
host, the two hosts cleaned in parallel.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterctl.deploy.engine import Deploy, DeployOptions
from clusterctl.fleet import Fleet
from clusterctl.inventory.loader import load_inventory
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


@pytest.fixture
def replica(lab, tmp_path: Path):
    head, worker = lab.names[:2]
    doc = yaml.safe_load(Path(lab.inventory).read_text())
    doc["models"] = {"mn-tiny": tiny_entry(tiny_model(tmp_path), "/models/mn-tiny")}
    doc["instances"] = {"mn": {"model": "mn-tiny", "engine": "vllm-0.33", "placement": [f"{head}:{GPU}", f"{worker}:{GPU}"],
                               "port": PORT, "args": {"max-model-len": 2048}, "env": {"VLLM_SIM_TIME_SCALE": "0"}}}
    inv_path = tmp_path / "mn.yaml"
    inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    inv = load_inventory(str(inv_path))
    try:
        rep = Deploy(inv, [inv.hosts[head], inv.hosts[worker]],
                     lambda hs: Fleet(list(hs), connect_timeout=10, command_timeout=120),
                     str(tmp_path / "state"), DeployOptions(gate_timeout_s=60)).run()
        yield inv, rep, head, worker
    finally:
        with cf.ThreadPoolExecutor(2) as ex:
            list(ex.map(lambda h: remove_deployed(
                lab, "clusterctl-mn*.service", "/etc/clusterctl/instances/mn*.env /var/lib/clusterctl/deploy/previous/mn* "
                "/models/mn-tiny /models/.versions/mn-tiny", [h]), [head, worker]))


def test_a_replica_across_two_hosts_is_deployed_gated_and_fails_as_one(lab, replica) -> None:
    inv, rep, head, worker = replica
    assert rep.result == "ok", json.dumps(rep.to_dict(), default=str)[:3000]
    assert [sorted(b) for b in rep.batches] == [sorted([head, worker])]  # one batch: the replica's hosts
    assert [g.instance for o in rep.hosts.values() for g in o.gates] == ["mn"]  # the head's gate covers both
    url = f"http://{inv.hosts[head].address}:{PORT}"
    status, body = http(url + "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 2}, 30)
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
    log = lab.run(head, "journalctl -u clusterctl-mn.service --no-pager -o cat", check=True).stdout
    assert "DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=" in log and "world_size=2" in log
    wlog = lab.run(worker, "journalctl -u clusterctl-mn-node1.service --no-pager -o cat", check=True).stdout
    assert "headless multiproc executor, with head node address" in wlog
    for h, unit in ((head, "clusterctl-mn.service"), (worker, "clusterctl-mn-node1.service")):
        # the lab NICs' GID tables: link-local at 0/1, the data address at 2 (RoCE v1) and 3 (RoCE v2)
        env = lab.run(h, f"systemctl show -p Environment {unit}", check=True).stdout
        assert "NCCL_IB_GID_INDEX=3" in env.split(), env

    def journal() -> str:
        return lab.run(head, "journalctl -u clusterctl-mn.service --no-pager -n 30 -o cat").stdout

    lab.run(worker, "systemctl stop clusterctl-mn-node1.service", check=True, timeout=60)
    _until("the head stops being healthy once its worker is gone", lambda: _health(url) != 200, 30, journal)
    assert "Engine client died. Shutting down server." in journal()
