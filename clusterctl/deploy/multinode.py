"""Multi-node replicas: one instance whose placement spans hosts (pure; docs/multinode.md).

vLLM runs such a replica with its multiprocessing executor across nodes
(vLLM >= 0.11.1, PR vllm-project/vllm#23691; the flags as in the 0.32 wheel's
``vllm/engine/arg_utils.py`` and ``vllm/config/parallel.py``): every node runs
``vllm serve`` with ``--nnodes N --node-rank R --master-addr HEAD --master-port P``;
rank 0 (the head) serves the API, the others add ``--headless`` (no API
server: ``run_headless`` in ``vllm/entrypoints/cli/serve.py``).  The world
size is ``--tensor-parallel-size`` x ``--pipeline-parallel-size`` and each node
holds ``world / nnodes`` ranks: here tensor parallel within a host (its GPUs
of the placement) and one pipeline stage per host, as vLLM recommends.

So an instance ``big`` placed on ``gpu01:[0-3]`` and ``gpu02:[0-3]`` is two
units: ``clusterctl-big.service`` on gpu01 (the head, rank 0: the host of its
first GPU) and ``clusterctl-big-node1.service`` on gpu02 (``--headless``).
Each unit gets its host's NCCL environment (``units.instance_env``: the data
NIC for NCCL_SOCKET_IFNAME, VLLM_HOST_IP, NCCL_IB_HCA, NCCL_IB_TC).  Deploy
gates only the head (its ``/health`` answers only with every rank up) and
puts all the replica's hosts in one batch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.inventory.multinode import MASTER_PORT_OFFSET, engine_problem, hosts_in_order, problems

__all__ = ["MASTER_PORT_OFFSET", "engine_problem", "hosts_in_order", "problems", "is_multinode", "member_name", "master_addr",
           "members", "workers", "replica_of", "together"]

def is_multinode(inst: Instance) -> bool:
    return len(inst.hosts) > 1


def member_name(inst_name: str, rank: int) -> str:
    """The unit name of rank ``rank``: the instance's own for the head, ``NAME-nodeR`` for a worker."""
    return inst_name if rank == 0 else f"{inst_name}-node{rank}"


def master_addr(inv: Inventory, inst: Instance) -> str:
    """The head's address for torch.distributed: its data NIC's address, else its inventory address."""
    head = inv.hosts[hosts_in_order(inst)[0]]
    return next((n.address for n in head.nics_with_role("data") if n.address), head.address)


def members(inv: Inventory, inst: Instance) -> list[Instance]:
    """One single-host Instance per rank, ready for ``units.render_instance``: the host's GPUs of the
    placement, the multi-node flags (the head first)."""
    where = f"instances.{inst.name}"
    bad = problems(inv, inst) + [p for p in [engine_problem(inv, inst)] if p]
    if bad:
        raise ClusterctlError(f"{where}: cannot run across {', '.join(inst.hosts)}: {'; '.join(bad)}")
    hosts = hosts_in_order(inst)
    out = []
    for rank, h in enumerate(hosts):
        args = {**inst.args, "pipeline-parallel-size": len(hosts), "nnodes": len(hosts), "node-rank": rank,
                "master-addr": master_addr(inv, inst), "master-port": inst.port + MASTER_PORT_OFFSET}
        if rank:
            args["headless"] = True
        out.append(replace(inst, name=member_name(inst.name, rank),
                           placement=tuple(g for g in inst.placement if g.host == h), args=args))
    return out


def workers(instances: Iterable[Instance]) -> set[str]:
    """The worker (headless) unit names of the multi-node replicas among ``instances``."""
    return {member_name(i.name, r) for i in instances if is_multinode(i) for r in range(1, len(i.hosts))}


def replica_of(instances: Mapping[str, Instance], name: str) -> Instance | None:
    """The multi-node replica a unit name (head or worker) belongs to."""
    inst = instances.get(name)
    if inst is not None:
        return inst if is_multinode(inst) else None
    m = re.fullmatch(r"(.+)-node(\d+)", name)
    inst = instances.get(m.group(1)) if m else None
    return inst if inst is not None and is_multinode(inst) else None


def together(batches: Sequence[Sequence[str]], instances: Iterable[Instance]) -> list[list[str]]:
    """``batches`` with every multi-node replica's hosts moved into the earliest batch holding one of them
    (a replica is stopped, started and gated as one); empty batches dropped."""
    out = [list(b) for b in batches]
    for inst in instances:
        if not is_multinode(inst):
            continue
        where = [i for i, b in enumerate(out) if any(h in b for h in inst.hosts)]
        if len(where) < 2:
            continue
        first = where[0]
        for i in where[1:]:
            moving = [h for h in out[i] if h in inst.hosts]
            out[i] = [h for h in out[i] if h not in inst.hosts]
            out[first] += moving
    return [b for b in out if b]
