"""What makes a placement across hosts a runnable multi-node replica (pure; docs/multinode.md).

The inventory checks it with ``file:line`` errors; deploy/units/multinode.py renders
the head and worker units.  vLLM's multiprocessing executor across nodes
(``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``,
``--headless``) came with vLLM 0.11.1 (vllm-project/vllm#23691).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from clusterctl.inventory.model import Host, Instance, InstanceTemplate, Inventory

#: The torch.distributed master port of a replica: its HTTP port plus this (vLLM's default 29501 would
#: collide between two replicas whose heads share a host).
MASTER_PORT_OFFSET = 20000
#: The first vLLM release with ``--nnodes`` for the multiprocessing executor (vllm-project/vllm#23691).
MIN_VERSION = (0, 11, 1)
#: Flags clusterctl sets on every member; ``args`` must not.
OWN_FLAGS = (
    "pipeline-parallel-size",
    "nnodes",
    "node-rank",
    "master-addr",
    "master-port",
    "headless",
    "distributed-executor-backend",
)


def member_name(inst_name: str, rank: int) -> str:
    """The unit name of rank ``rank``: the instance's own for the head, ``NAME-nodeR`` for a worker."""
    return inst_name if rank == 0 else f"{inst_name}-node{rank}"


def hosts_in_order(inst: Instance) -> list[str]:
    """The replica's hosts by rank: the host of its first GPU is the head (rank 0)."""
    return list(dict.fromkeys(g.host for g in inst.placement))


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def engine_problem(inv: Inventory, inst: Instance | InstanceTemplate) -> str | None:
    """Why ``inst``'s engine cannot run it across hosts without Ray (None: it can).  Deploy refuses; the
    inventory accepts it (a group across hosts may run on Ray outside clusterctl, and doctor judges it)."""
    eng = inv.engines.get(inst.engine)
    if eng is None:
        return None
    if eng.device == "cpu":
        return f"engine {eng.name} runs on CPUs: a multi-node replica needs GPUs"
    if _version(eng.version) < MIN_VERSION:
        return (
            f"engine {eng.name} is vLLM {eng.version}: --nnodes (multi-node without Ray) needs "
            f">= {'.'.join(map(str, MIN_VERSION))}"
        )
    return None


def problems(inv: Inventory, inst: Instance) -> list[str]:
    """Why ``inst`` cannot run across its hosts (empty: it can), the engine's problem aside."""
    out = []
    hosts = hosts_in_order(inst)
    per = {h: [g for g in inst.placement if g.host == h] for h in hosts}
    counts = {h: len(gs) for h, gs in per.items()}
    if len(set(counts.values())) > 1:
        out.append(
            "every host of a multi-node replica holds the same number of its GPUs (one pipeline stage "
            "per host, tensor parallel within it); placement has " + ", ".join(f"{h}: {n}" for h, n in counts.items())
        )
    models = {h: inv.hosts[h].gpus.model for h in hosts if h in inv.hosts}
    if len(set(models.values())) > 1:
        out.append("its hosts have different GPU models (" + ", ".join(f"{h}: {m}" for h, m in models.items()) + ")")
    return out + _run_problems(inst, inst.port, "port")


def _run_problems(what: Instance | InstanceTemplate, port: int, port_key: str) -> list[str]:
    """The role, args and port of a replica across hosts (an instance's ``port``, a template's ``port_base``)."""
    out = []
    if what.role != "mixed":
        out.append(f"role {what.role}: prefill/decode members run on one host each")
    own = [f for f in OWN_FLAGS if f in what.args]
    if own:
        out.append(f"args set {', '.join(own)}: clusterctl sets them for a multi-node replica")
    if port + MASTER_PORT_OFFSET > 65535:
        out.append(f"{port_key} {port} leaves no master port (port + {MASTER_PORT_OFFSET} > 65535)")
    return out


def stage_slots(
    inv: Inventory, tpl: InstanceTemplate, hosts: Iterable[Host], used: Mapping[str, int] | None = None
) -> dict[str, dict[str, int]]:
    """GPU model -> host -> how many stages of ``tpl.tp`` GPUs the host holds (GPUs ``used`` by explicit
    instances left out); hosts with room for none are left out."""
    out: dict[str, dict[str, int]] = {}
    for h in hosts:
        n = max(h.gpus.count - (used or {}).get(h.name, 0), 0) // tpl.tp
        if n:
            out.setdefault(h.gpus.model or "?", {})[h.name] = n
    return out


def replicas_that_fit(slots: Mapping[str, int], nodes: int) -> int:
    """How many replicas of ``nodes`` stages on distinct hosts fit in ``slots`` (host -> stages it
    holds): the largest k with sum(min(slots, k)) >= nodes x k (a host gives each replica one stage)."""
    if nodes < 1:
        return 0
    k = sum(slots.values()) // nodes
    while k and sum(min(n, k) for n in slots.values()) < nodes * k:
        k -= 1
    return k


def template_problems(
    inv: Inventory, tpl: InstanceTemplate, hosts: Sequence[Host], used: Mapping[str, int] | None = None
) -> list[str]:
    """Why a ``nodes: N`` (N > 1) template cannot be placed and run across hosts (empty: it can):
    the engine, the role, flags clusterctl sets, the port, and N hosts of one GPU model with ``tp`` free
    GPUs each among ``hosts`` for every replica."""
    out = [p for p in [engine_problem(inv, tpl)] if p] + _run_problems(tpl, tpl.port_base, "port_base")
    if out:
        return out
    by_model = stage_slots(inv, tpl, hosts, used)
    fit = {m: replicas_that_fit(s, tpl.nodes) for m, s in by_model.items()}
    if sum(fit.values()) < tpl.replicas:
        have = (
            "; ".join(
                f"{m}: {len(s)} host(s) ({', '.join(f'{h} {n}' for h, n in s.items())})" for m, s in by_model.items()
            )
            or "none"
        )
        out.append(
            f"{tpl.replicas} replica(s) of {tpl.nodes} hosts x TP {tpl.tp} do not fit: each needs "
            f"{tpl.nodes} distinct hosts of one GPU model with {tpl.tp} free GPUs each; room for "
            f"{sum(fit.values())} (stages of TP {tpl.tp} per host by GPU model: {have})"
        )
    return out
