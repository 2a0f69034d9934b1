"""A rollback that restores a multi-node replica's members in the replica's order (docs/multinode.md).

A replica across hosts (deploy/units/multinode.py) is started in one order: every
member stopped, then the workers (``NAME-nodeR``, ``--headless``), then the
head, since vLLM's head takes no rank back and waits for every worker.  A
rollback keeps that order instead of restarting the restored units of every
host at once:

1. the node's ``rollback`` job on every host, with ``hold``: the replica's
   members there are stopped before any file is restored and are not started
   by the node (other instances restart as before);
2. the workers the hosts still have (``held`` in the reply) are started;
3. then the heads.

Without multi-node replicas it is the plain parallel rollback
(:func:`clusterctl.deploy.rollout.apply.rollback_hosts`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from clusterctl.deploy import remote
from clusterctl.deploy.remote import NodeReply
from clusterctl.inventory.model import Instance
from clusterctl.inventory.multinode import hosts_in_order, member_name
from clusterctl.fleet.fleet import Fleet

_WORKER = re.compile(r"(.+)-node(\d+)")


def replica_members(todo: Mapping[str, list[str]], instances: Mapping[str, Instance]) -> dict[str, dict[str, str]]:
    """host -> member unit name -> its replica's name, for every multi-node replica that one of ``todo``'s
    names (host -> instances to restore) belongs to: the names being restored, and the replica's members
    that its placement puts on those hosts (unchanged running members must restart too)."""

    def replica(name: str) -> Instance | None:
        m = _WORKER.fullmatch(name)
        inst = instances.get(name) or (instances.get(m.group(1)) if m else None)
        return inst if inst is not None and len(inst.hosts) > 1 else None

    out: dict[str, dict[str, str]] = {}
    for host, names in todo.items():
        for name in names:
            inst = replica(name)
            if inst is None:
                continue
            out.setdefault(host, {})[name] = inst.name
            for rank, h in enumerate(hosts_in_order(inst)):
                if h in todo:
                    out.setdefault(h, {})[member_name(inst.name, rank)] = inst.name
    return out


def _start(run_id: str, names: list[str]) -> dict[str, Any]:
    return {
        "op": "apply",
        "run_id": run_id,
        "write": [],
        "restart": [],
        "start": names,
        "remove": [],
        "stop": [],
        "setup_scripts": [],
    }


def rollback_in_order(
    fleet: Fleet,
    todo: Mapping[str, list[str]],
    instances: Mapping[str, Instance],
    *,
    own_run_id: str,
    only_run_id: str | None = None,
) -> tuple[dict[str, NodeReply], list[str]]:
    """Restore ``todo`` (host -> instances) as :func:`~clusterctl.deploy.rollout.apply.rollback_hosts` does, but a
    multi-node replica's members in order (module doc).  Returns one reply per host (a failed start of a
    member marks its host's reply failed) and one line per replica saying the order it went in."""
    members = replica_members(todo, instances)
    jobs = {
        h: {
            "op": "rollback",
            "instances": names,
            "run_id": only_run_id,
            "own_run_id": own_run_id,
            "restart": True,
            "hold": sorted(members.get(h, {})),
        }
        for h, names in todo.items()
        if names or members.get(h)
    }
    replies = remote.run_jobs(fleet, jobs)
    if not members:
        return replies, []
    held = {h: [n for n in r.data.get("held", []) if n in members.get(h, {})] for h, r in replies.items() if r.ok}
    heads = {n for m in members.values() for n, replica in m.items() if n == replica}
    notes = []
    for replica in sorted({r for m in members.values() for r in m.values()}):
        w = [f"{n} on {h}" for h, ns in held.items() for n in ns if members[h][n] == replica and n not in heads]
        hd = [f"{n} on {h}" for h, ns in held.items() for n in ns if n == replica]
        notes.append(
            f"replica {replica}: rolled back with its units stopped, started the workers "
            f"({', '.join(w) or 'none'}), then the head ({', '.join(hd) or 'none'})"
        )
    for phase in (
        {h: [n for n in ns if n not in heads] for h, ns in held.items()},
        {h: [n for n in ns if n in heads] for h, ns in held.items()},
    ):
        started = remote.run_jobs(fleet, {h: _start(own_run_id, ns) for h, ns in phase.items() if ns})
        for h, r in started.items():
            if not r.ok:
                before = replies[h]
                replies[h] = NodeReply(
                    h, False, before.data, "; ".join(x for x in (before.error, r.error) if x), before.kind or r.kind
                )
    return replies, notes
