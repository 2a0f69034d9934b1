"""A replica across nodes in the simulator (0.33): the head serves only once every rank joined, and a
rank that goes away kills the head's engine as in real vLLM (vllm_sim/multinode.py)."""

from __future__ import annotations

import time
from pathlib import Path

from clusterctl.lab.hardware import provision_host
from clusterctl.lab.hardware.host import hw_dir
from clusterctl.lab.vllm_sim.serve import free_port

from .conftest import READY


def _state(tmp: Path, name: str) -> Path:
    provision_host(tmp / name, name, 0, 2, "H100-SXM5-80GB", "mlnx")
    return hw_dir(tmp / name) / "nvml.json"


def _flags(rank: int, master: int) -> list[str]:
    return [
        "--tensor-parallel-size",
        "1",
        "--pipeline-parallel-size",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master),
        *(["--headless"] if rank else []),
    ]


def test_the_head_serves_once_its_worker_joined_and_dies_with_it(start_sim, models, tmp_path: Path) -> None:
    master = free_port()
    head = start_sim(_state(tmp_path, "lab01"), models["tiny"], *_flags(0, master), version="0.33", scale="0")
    time.sleep(1.0)
    assert READY not in head.log  # no API server before every rank joined
    worker = start_sim(_state(tmp_path, "lab02"), models["tiny"], *_flags(1, master), version="0.33", scale="0")
    assert worker.wait_for(
        f"Launching vLLM (v0.33.0) headless multiproc executor, with head node address "
        f"127.0.0.1:{master} for torch.distributed process group."
    ), worker.log
    assert head.wait_for(READY), head.log
    assert (
        "DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, "
        "mq_connect_ip=127.0.0.1 (local), world_size=2, local_world_size=1"
    ) in head.log
    assert head.get("/health")[0] == 200
    assert "Started server process" not in worker.log  # headless: no API server
    worker.proc.kill()
    # the engine dies (/health 503), then the head's server exits as after any engine death
    assert head.wait(20) == 0
    assert "Engine core proc" in head.log or "engine core exited unexpectedly" in head.log, head.log
    assert "Engine client died. Shutting down server." in head.log


def test_a_worker_whose_head_goes_away_fails(start_sim, models, tmp_path: Path) -> None:
    master = free_port()
    head = start_sim(_state(tmp_path, "lab01"), models["tiny"], *_flags(0, master), version="0.33", scale="0")
    worker = start_sim(_state(tmp_path, "lab02"), models["tiny"], *_flags(1, master), version="0.33", scale="0")
    assert head.wait_for(READY), head.log + worker.log
    head.proc.kill()
    assert worker.wait(20) == 1
    assert "went away" in worker.log


def test_bad_launch_options_are_vllms_errors(start_sim, host, models) -> None:
    sim = start_sim(host, models["tiny"], "--tensor-parallel-size", "1", "--nnodes", "3", version="0.33")
    assert sim.wait(30) == 1
    assert "`--nnodes 3` must evenly divide the total world size (1)" in sim.log
    old = start_sim(host, models["tiny"], "--nnodes", "2", version="0.11")
    assert old.wait(30) == 2 and "unrecognized arguments: --nnodes" in old.log  # 0.11.0 has no --nnodes
