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
NIC for NCCL_SOCKET_IFNAME, VLLM_HOST_IP, NCCL_IB_HCA, NCCL_IB_TC) and, on
RoCE, ``NCCL_IB_GID_INDEX`` from the host's GID table read at deploy time
(:func:`gid_index`).  Deploy
gates only the head (its ``/health`` answers only with every rank up) and
puts all the replica's hosts in one batch.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from dataclasses import replace

from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.probe.gid import ipv4_of_gid
from clusterctl.inventory.multinode import MASTER_PORT_OFFSET, engine_problem, hosts_in_order, member_name, problems

__all__ = [
    "MASTER_PORT_OFFSET",
    "engine_problem",
    "hosts_in_order",
    "problems",
    "is_multinode",
    "member_name",
    "master_addr",
    "members",
    "units",
    "workers",
    "replica_of",
    "together",
    "phased",
    "gid_index",
    "rdma_ports",
    "GidTables",
]

#: host -> ``DEV:PORT`` -> that RDMA port's populated GID table ``[{index, gid, type}]`` (None: no such
#: port), as ``remote.HostState.gids`` reads it.
GidTables = Mapping[str, Mapping[str, "list[dict[str, Any]] | None"]]


def is_multinode(inst: Instance) -> bool:
    return len(inst.hosts) > 1


def master_addr(inv: Inventory, inst: Instance) -> str:
    """The head's address for torch.distributed: its data NIC's address, else its inventory address."""
    head = inv.hosts[hosts_in_order(inst)[0]]
    return next((n.address for n in head.nics_with_role("data") if n.address), head.address)


def rdma_ports(inv: Inventory, host: str) -> list[str]:
    """The ``DEV:PORT`` RDMA ports of ``host``'s data NICs whose GID NCCL needs (RoCE fabrics only)."""
    if inv.fabric.kind != "roce":
        return []
    return [f"{n.rdma_device}:{n.port}" for n in inv.hosts[host].nics_with_role("data") if n.rdma_device]


def gid_index(inv: Inventory, host: str, tables: Mapping[str, "list[dict[str, Any]] | None"]) -> int | None:
    """NCCL_IB_GID_INDEX for ``host``: the index of the RoCE v2 GID that carries its data NIC's IPv4
    address (GIDs follow the netdev's addresses and their indexes move when addresses change:
    ../shared/research/roce.md 3.5, 4.4), the same on every RDMA data port (NCCL takes one index for
    all of them).  A NIC without an ``address`` in the inventory takes its port's only IPv4 RoCE v2 GID.
    None where NCCL needs none (not RoCE, no RDMA data NIC).  Raises :class:`ClusterctlError` naming
    the host and device when a port has no such GID or the ports disagree: never a guess."""
    ports = rdma_ports(inv, host)
    nics = [n for n in inv.hosts[host].nics_with_role("data") if n.rdma_device]
    found: dict[str, int] = {}
    for port, nic in zip(ports, nics):
        table = tables.get(port)
        if table is None:
            raise ClusterctlError(
                f"{host}: RDMA device {port} of data NIC {nic.netdev} not found on the host "
                "(/sys/class/infiniband); cannot set NCCL_IB_GID_INDEX"
            )
        v2 = [(int(g["index"]), ipv4_of_gid(g.get("gid", ""))) for g in table if g.get("type") == "RoCE v2"]
        try:
            want = ipaddress.IPv4Address(nic.address) if nic.address else None
        except ValueError:
            raise ClusterctlError(
                f"{host}: data NIC {nic.netdev} address {nic.address!r} is not an IPv4 "
                "address; NCCL_IB_GID_INDEX is chosen by the NIC's IPv4 address"
            ) from None
        hits = [i for i, a in v2 if a is not None and (want is None or a == want)]
        if len(hits) != 1:
            what = f"with {nic.address}" if want else "with an IPv4 address"
            why = "several" if hits else "no"
            raise ClusterctlError(
                f"{host}: {why} RoCE v2 GID {what} on {port} ({nic.netdev}); cannot set NCCL_IB_GID_INDEX "
                f"(GIDs follow the netdev's addresses: check `ip addr show {nic.netdev}` and the GID table "
                f"under /sys/class/infiniband/{port.rpartition(':')[0]}/ports/{port.rpartition(':')[2]}/gids"
                + ("" if want else ", or give the NIC's address in the inventory")
                + ")"
            )
        found[port] = hits[0]
    if len(set(found.values())) > 1:
        raise ClusterctlError(
            f"{host}: the RoCE v2 GIDs of its data NICs have different indexes "
            f"({', '.join(f'{p}: {i}' for p, i in found.items())}); NCCL_IB_GID_INDEX is one "
            "index for every port"
        )
    return next(iter(found.values()), None)


def members(inv: Inventory, inst: Instance, gids: GidTables | None = None) -> list[Instance]:
    """One single-host Instance per rank, ready for ``units.render_instance``: the host's GPUs of the
    placement, the multi-node flags (the head first).  ``gids`` (the hosts' GID tables): each member's
    env gets its host's ``NCCL_IB_GID_INDEX`` (:func:`gid_index`; the inventory's ``env`` wins;
    a host missing from ``gids`` was not read and gets nothing applied); None: not read yet (a render
    only to learn the model paths)."""
    where = f"instances.{inst.name}"
    bad = problems(inv, inst) + [p for p in [engine_problem(inv, inst)] if p]
    if bad:
        raise ClusterctlError(f"{where}: cannot run across {', '.join(inst.hosts)}: {'; '.join(bad)}")
    hosts = hosts_in_order(inst)
    out = []
    for rank, h in enumerate(hosts):
        args = {
            **inst.args,
            "pipeline-parallel-size": len(hosts),
            "nnodes": len(hosts),
            "node-rank": rank,
            "master-addr": master_addr(inv, inst),
            "master-port": inst.port + MASTER_PORT_OFFSET,
        }
        if rank:
            args["headless"] = True
        env = dict(inst.env)
        # a host not read (not selected, unreadable) gets no unit from this deploy: nothing to choose
        if gids is not None and h in gids and "NCCL_IB_GID_INDEX" not in env:
            index = gid_index(inv, h, gids[h])
            if index is not None:
                env["NCCL_IB_GID_INDEX"] = str(index)
        out.append(
            replace(
                inst,
                name=member_name(inst.name, rank),
                placement=tuple(g for g in inst.placement if g.host == h),
                args=args,
                env=env,
            )
        )
    return out


def units(inst: Instance) -> list[tuple[Instance, str]]:
    """The replica's units as ``(instance of the unit, host)`` per rank, the head first: the member's
    unit name, the host's GPUs of the placement, the inventory's args and env (no multi-node flags)."""
    return [
        (replace(inst, name=member_name(inst.name, r), placement=tuple(g for g in inst.placement if g.host == h)), h)
        for r, h in enumerate(hosts_in_order(inst))
    ]


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


def phased(
    jobs: Mapping[str, Mapping[str, Any]], instances: Iterable[Instance]
) -> tuple[list[dict[str, dict[str, Any]]], list[str]]:
    """One batch's apply jobs (host -> job) in the order a multi-node replica needs: **stop all its
    members, start the workers, then the head**.  For every replica one of whose units the jobs start
    or restart, each member on a host of ``jobs`` leaves the first phase's ``start``/``restart`` and
    goes to its ``stop`` (an unchanged running member too: the head takes no rank back), then comes
    back in a second phase (the workers' ``start``) or a third (the head's).  Returns the phases
    (empty ones left out) and one line per replica saying the order.  Jobs without such a replica
    come back as one phase, unchanged."""
    first = {
        h: {
            **j,
            "start": list(j.get("start", [])),
            "restart": list(j.get("restart", [])),
            "stop": list(j.get("stop", [])),
        }
        for h, j in jobs.items()
    }
    later: list[dict[str, list[str]]] = [{}, {}]  # workers, heads: host -> units to start
    notes: list[str] = []
    for inst in instances:
        if not is_multinode(inst):
            continue
        ranks = [(member_name(inst.name, r), h) for r, h in enumerate(hosts_in_order(inst)) if h in first]
        if not any(n in first[h]["start"] or n in first[h]["restart"] for n, h in ranks):
            continue
        for n, h in ranks:
            job = first[h]
            if n not in job["start"]:  # running: restarted or unchanged (a new or stopped one has nothing to stop)
                job["stop"].append(n)
            job["start"] = [x for x in job["start"] if x != n]
            job["restart"] = [x for x in job["restart"] if x != n]
            later[0 if n != inst.name else 1].setdefault(h, []).append(n)
        workers_ = [f"{n} on {h}" for n, h in ranks if n != inst.name]
        head = [f"{n} on {h}" for n, h in ranks if n == inst.name]
        notes.append(
            f"replica {inst.name}: stop its units, start the workers ({', '.join(workers_) or 'none here'}), "
            f"then the head ({', '.join(head) or 'not here'})"
        )
    run_id = next((j.get("run_id", "") for j in jobs.values()), "")
    phases = [first] + [
        {
            h: {
                "op": "apply",
                "run_id": run_id,
                "write": [],
                "restart": [],
                "start": names,
                "remove": [],
                "stop": [],
                "setup_scripts": [],
            }
            for h, names in step.items()
        }
        for step in later
    ]
    return [p for p in phases if p], notes
