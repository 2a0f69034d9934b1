"""A replica across hosts: inventory checks (file:line), the head and headless worker units, and a rollout
that takes the replica's hosts as one batch and gates only its head."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Sequence

import pytest

from clusterctl.deploy.units import multinode
from clusterctl.deploy.rollout.engine import Deploy, DeployOptions, render_all
from clusterctl.deploy.rollout.gates import GateResult
from clusterctl.deploy.rollout.batches import parse_serial
from clusterctl.errors import ClusterctlError, InventoryError
from clusterctl.fleet import Fleet
from clusterctl.fleet.transport import FakeReply, FakeTransport
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Host
from clusterctl.node import deploy as node

#: A RoCE node's /sys/class (tests/fixtures/probe/README.md): mlx5_0 port 1 has link-local GIDs at 0/1 and
#: 10.77.0.11 at 2 (RoCE v1) and 3 (RoCE v2), an all-zero (unpopulated) entry at 4.
SYSROOT = str(Path(__file__).resolve().parents[2] / "fixtures" / "probe" / "sysroot_roce")

INV = """\
version: 1
defaults:
  ssh: {user: root}
  gpus: {count: 2, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}
  nics:
    - {netdev: eth0, role: management}
    - {netdev: eth2, role: data, rdma_device: mlx5_0, port: 1}
fabric: {kind: roce, roce_dscp: 26}
hosts:
  gpu01: {address: 10.0.0.11, nics: [{netdev: eth2, role: data, rdma_device: mlx5_0, port: 1, address: 10.77.0.11}]}
  gpu02: {address: 10.0.0.12}
  gpu03: {address: 10.0.0.13}
engines:
  v33: {path: /opt/vllm-0.33/bin/vllm, version: "0.33.0"}
  v11: {path: /opt/vllm-0.11/bin/vllm, version: "0.11.0"}
models:
  m: {path: /models/m}
instances:
  big: {model: m, engine: v33, placement: [gpu01:0, gpu01:1, gpu02:0, gpu02:1], port: 8000}
  one: {model: m, engine: v33, placement: "gpu03:0", port: 8000}
"""


def _inv(text: str = INV) -> Any:
    return load_inventory_text(text, "site.yaml")


def _argv(unit: str) -> list[str]:
    line = next(ln for ln in unit.replace("\\\n", " ").splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line[len("ExecStart=") :])


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_a_replica_across_two_hosts_is_a_head_and_a_headless_worker_unit() -> None:
    inv = _inv()
    r = {x.instance: x for x in render_all(inv, {"big": inv.instances["big"]})}
    assert set(r) == {"big", "big-node1"}
    head, worker = r["big"], r["big-node1"]
    assert (head.host, head.gpus, worker.host, worker.gpus) == ("gpu01", (0, 1), "gpu02", (0, 1))
    for rank, x in enumerate((head, worker)):
        a = _argv(x.unit_text)
        assert _flag(a, "--tensor-parallel-size") == "2" and _flag(a, "--pipeline-parallel-size") == "2"
        assert _flag(a, "--nnodes") == "2" and _flag(a, "--node-rank") == str(rank)
        assert _flag(a, "--master-addr") == "10.77.0.11"  # the head's data address
        assert _flag(a, "--master-port") == str(8000 + multinode.MASTER_PORT_OFFSET)
        assert ("--headless" in a) == (rank == 1)
    # each host's own NCCL environment: its data NIC and HCA, the fabric's traffic class
    assert "NCCL_SOCKET_IFNAME=eth2" in worker.unit_text + worker.env_text
    assert "NCCL_IB_HCA==mlx5_0:1" in worker.unit_text + worker.env_text
    assert "NCCL_IB_TC=106" in worker.unit_text + worker.env_text


@pytest.mark.parametrize(
    "placement, engine, args, message",
    [
        ("[gpu01:0, gpu01:1, gpu02:0]", "v33", "{}", "same number of its GPUs"),
        ("[gpu01:0, gpu02:0]", "v33", "{nnodes: 2}", "args set nnodes: clusterctl sets them"),
    ],
)
def test_a_replica_that_cannot_span_its_hosts_is_an_error_naming_the_line(
    placement: str, engine: str, args: str, message: str
) -> None:
    text = INV.replace(
        "placement: [gpu01:0, gpu01:1, gpu02:0, gpu02:1], port: 8000}",
        f"placement: {placement}, port: 8000, args: {args}}}",
    ).replace("engine: v33, placement: [", f"engine: {engine}, placement: [")
    with pytest.raises(InventoryError) as e:
        _inv(text)
    assert "site.yaml:19: instances.big.placement: across 2 hosts:" in str(e.value) and message in str(e.value)


def test_deploy_refuses_an_engine_without_nnodes() -> None:
    inv = _inv(INV.replace("engine: v33, placement: [", "engine: v11, placement: ["))  # the inventory: a group
    with pytest.raises(
        ClusterctlError, match="instances.big: cannot run across gpu01, gpu02: engine v11 is vLLM 0.11.0: --nnodes"
    ):
        render_all(inv, {"big": inv.instances["big"]})


def test_a_gpu_model_mismatch_is_an_error() -> None:
    text = INV.replace(
        "gpu02: {address: 10.0.0.12}", "gpu02: {address: 10.0.0.12, gpus: {count: 2, model: A100-SXM4-80GB}}"
    )
    with pytest.raises(InventoryError, match="different GPU models"):
        _inv(text)


def test_batches_keep_a_replicas_hosts_together() -> None:
    inv = _inv()
    assert multinode.together([["gpu01"], ["gpu03"], ["gpu02"]], inv.instances.values()) == [
        ["gpu01", "gpu02"],
        ["gpu03"],
    ]
    assert multinode.workers(inv.instances.values()) == {"big-node1"}
    assert multinode.replica_of(inv.instances, "big-node1") is inv.instances["big"]
    assert multinode.replica_of(inv.instances, "one") is None


class Cluster:
    def __init__(self) -> None:
        self.jobs: list[tuple[str, dict[str, Any]]] = []
        self.transport = FakeTransport(self.handle)

    def handle(self, host: Host, command: str, stdin: bytes | None) -> FakeReply:
        job = json.loads((stdin or b"{}").decode().splitlines()[0])
        self.jobs.append((host.name, job))
        out: dict[str, Any] = (
            {
                "ok": True,
                "instances": {},
                "lock": None,
                "previous": [],
                "models": {},
                "gids": {p: node._gids(p, SYSROOT) for p in job.get("rdma_ports", [])},
            }
            if job["op"] == "read"
            else {"ok": True, "recovered": None}
        )
        return FakeReply(0, json.dumps(out) + "\n")


class Scripted(Deploy):
    gated: list[str] = []

    def preflight(self, fleet: Any, plan: Any) -> Any:
        return None

    def gate(self, fleet: Any, names: Sequence[str]) -> list[GateResult]:
        self.gated += list(names)
        return [GateResult(n, self.rendered[n].host, True, "completion", "scripted", 0.0) for n in names]


def test_deploy_rolls_the_replica_out_as_one_batch_and_gates_its_head(tmp_path: Path) -> None:
    inv = _inv()
    cluster = Cluster()
    d = Scripted(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=cluster.transport),
        str(tmp_path),
        DeployOptions(serial=parse_serial("1")),
    )
    rep = d.run()
    assert rep.result == "ok", rep.to_dict()
    assert sorted(map(sorted, rep.batches)) == [["gpu01", "gpu02"], ["gpu03"]]
    applied = {h: j for h, j in cluster.jobs if j["op"] == "apply"}
    assert applied["gpu02"]["start"] == ["big-node1"] and applied["gpu01"]["start"] == ["big"]
    assert sorted(d.gated) == ["big", "one"]
    # the plan says the order (deploy --plan prints it, --json has it)
    assert rep.plan is not None and rep.plan.to_dict()["order"] == [
        "replica big: stop its units, start the workers (big-node1 on gpu02), then the head (big on gpu01)"
    ]
    # the order: every running member stopped first, then the worker started, then the head
    applies = [(h, j) for h, j in cluster.jobs if j["op"] == "apply" and h in ("gpu01", "gpu02")]
    assert sorted((h, j["stop"], j["start"], j["restart"]) for h, j in applies[:2]) == [
        ("gpu01", [], [], []),
        ("gpu02", [], [], []),
    ]  # new units: nothing to stop
    assert [(h, j["start"]) for h, j in applies[2:]] == [("gpu02", ["big-node1"]), ("gpu01", ["big"])]
    assert [w for h, w in applies[:2] if w["write"]]  # the first phase writes the units
    # the GID tables of the replica's data ports were read, and each unit carries its host's RoCE v2 index
    reads = [j for h, j in cluster.jobs if j["op"] == "read" and h == "gpu02"]
    assert reads[0]["rdma_ports"] == ["mlx5_0:1"]
    for name in ("big", "big-node1"):
        assert "NCCL_IB_GID_INDEX=3" in d.rendered[name].unit_text + d.rendered[name].env_text
    assert "NCCL_IB_GID_INDEX" not in d.rendered["one"].unit_text + d.rendered["one"].env_text


def test_deploy_of_the_replica_by_name_takes_its_worker_units_too(tmp_path: Path) -> None:
    inv = _inv()
    cluster = Cluster()
    d = Scripted(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=cluster.transport),
        str(tmp_path),
        DeployOptions(instances="big"),
    )
    assert d.run().result == "ok"
    applied = {h: j for h, j in cluster.jobs if j["op"] == "apply"}
    assert applied["gpu02"]["start"] == ["big-node1"] and applied["gpu01"]["start"] == ["big"]
    assert "gpu03" not in applied


def test_the_phases_stop_every_member_then_start_workers_then_the_head() -> None:
    inv = _inv(
        INV.replace("gpu02:0, gpu02:1]", "gpu02:0, gpu02:1, gpu03:0, gpu03:1]")
        .replace('placement: "gpu03:0", port: 8000', 'placement: "gpu03:2", port: 8001')
        .replace("gpus: {count: 2", "gpus: {count: 4")
    )
    jobs = {
        "gpu01": {"op": "apply", "run_id": "r", "restart": ["big"], "start": []},
        "gpu02": {"op": "apply", "run_id": "r", "restart": [], "start": ["big-node1"]},
        "gpu03": {"op": "apply", "run_id": "r", "restart": [], "start": ["one"]},
    }  # big-node2 unchanged
    phases, notes = multinode.phased(jobs, inv.instances.values())
    assert [{h: (j["stop"], j["restart"], j["start"]) for h, j in p.items()} for p in phases] == [
        # restarted and unchanged-running members stopped; a stopped one (start) has nothing to stop
        {"gpu01": (["big"], [], []), "gpu02": ([], [], []), "gpu03": (["big-node2"], [], ["one"])},
        {"gpu02": ([], [], ["big-node1"]), "gpu03": ([], [], ["big-node2"])},
        {"gpu01": ([], [], ["big"])},
    ]
    assert notes == [
        "replica big: stop its units, start the workers (big-node1 on gpu02, big-node2 on gpu03), "
        "then the head (big on gpu01)"
    ]
    # nothing of a replica changes: one phase, as given
    quiet = {"gpu03": {"op": "apply", "run_id": "r", "restart": [], "start": ["one"]}}
    assert multinode.phased(quiet, inv.instances.values()) == ([{"gpu03": {**quiet["gpu03"], "stop": []}}], [])


def test_the_node_reads_a_ports_gid_table_as_the_probe_does() -> None:
    table = node._gids("mlx5_0:1", SYSROOT)
    assert table is not None
    assert [(g["index"], g["type"]) for g in table] == [
        (0, "IB/RoCE v1"),
        (1, "RoCE v2"),
        (2, "IB/RoCE v1"),
        (3, "RoCE v2"),
    ]  # the all-zero entry 4 left out
    assert table[3]["gid"] == "0000:0000:0000:0000:0000:ffff:0a4d:000b"
    assert node._gids("mlx5_7:1", SYSROOT) is None and node._gids("../x:1", SYSROOT) is None


def _tables(port: str = "mlx5_0:1") -> dict[str, dict[str, Any]]:
    return {h: {"mlx5_0:1": node._gids(port, SYSROOT)} for h in ("gpu01", "gpu02")}


def test_each_unit_gets_the_index_of_the_roce_v2_gid_with_its_data_address() -> None:
    inv = _inv()
    assert multinode.gid_index(inv, "gpu01", _tables()["gpu01"]) == 3  # 10.77.0.11 given: matched exactly
    assert multinode.gid_index(inv, "gpu02", _tables()["gpu02"]) == 3  # no address: the port's only IPv4 v2 GID
    r = {x.instance: x for x in render_all(inv, {"big": inv.instances["big"]}, gids=_tables())}
    assert all("NCCL_IB_GID_INDEX=3" in x.unit_text + x.env_text for x in r.values())
    # the inventory's own env wins; an IB fabric needs no GID index
    own = _inv(INV.replace("port: 8000}\n  one:", "port: 8000, env: {NCCL_IB_GID_INDEX: '5'}}\n  one:"))
    r = {x.instance: x for x in render_all(own, {"big": own.instances["big"]}, gids=_tables())}
    assert all("NCCL_IB_GID_INDEX=5" in x.unit_text + x.env_text for x in r.values())
    ib = _inv(INV.replace("fabric: {kind: roce, roce_dscp: 26}", "fabric: {kind: ib}"))
    assert multinode.gid_index(ib, "gpu01", {}) is None


@pytest.mark.parametrize(
    "tables, message",
    [
        ({"mlx5_0:1": None}, "gpu01: RDMA device mlx5_0:1 of data NIC eth2 not found on the host"),
        # the NIC lost its address: only the link-local GIDs are left
        (
            {"mlx5_0:1": [g for g in node._gids("mlx5_0:1", SYSROOT) or [] if g["index"] < 2]},
            "gpu01: no RoCE v2 GID with 10.77.0.11 on mlx5_0:1 (eth2)",
        ),
        (
            {"mlx5_0:1": [{"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:0a4d:000b", "type": "IB/RoCE v1"}]},
            "gpu01: no RoCE v2 GID with 10.77.0.11 on mlx5_0:1",
        ),
        (
            {"mlx5_0:1": [{"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:0a4d:000c", "type": "RoCE v2"}]},
            "gpu01: no RoCE v2 GID with 10.77.0.11 on mlx5_0:1",
        ),
    ],
)
def test_no_gid_for_the_data_address_refuses_the_deploy_naming_host_and_device(tables: Any, message: str) -> None:
    inv = _inv()
    with pytest.raises(ClusterctlError, match=message.replace("(", r"\(").replace(")", r"\)")):
        render_all(inv, {"big": inv.instances["big"]}, gids={"gpu01": tables, "gpu02": _tables()["gpu02"]})


def test_a_port_with_several_ipv4_gids_and_no_address_in_the_inventory_is_refused() -> None:
    two = [
        {"index": 3, "gid": "::ffff:10.77.0.12", "type": "RoCE v2"},
        {"index": 5, "gid": "::ffff:10.78.0.12", "type": "RoCE v2"},
    ]
    with pytest.raises(ClusterctlError, match="gpu02: several RoCE v2 GID with an IPv4 address on mlx5_0:1"):
        multinode.gid_index(_inv(), "gpu02", {"mlx5_0:1": two})
