"""Apply one batch's plan to its hosts, and undo it (the node program does the writes).

Per host, in order: create the service users and install ``verify-model``
(:mod:`clusterctl.deploy.units.nodesetup`),
save the previous unit/env/model-link of every instance touched, write units
and env files (temp + rename in the same directory; env 0600 root),
``daemon-reload``, enable (or disable, by policy), stop+disable+remove units
no longer desired, then restart changed and start new ones.  Instances that
run and are restarted or removed are drained first (:mod:`clusterctl.deploy.rollout.drain`).
Unchanged instances are not touched, so a deploy with nothing changed
restarts nothing.  Model paths that do not point at a verified staged
version are staged first (``clusterctl/stage``) for the hosts that need it.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
from typing import Any, Callable, Mapping, Sequence

from clusterctl.deploy import remote, spec
from clusterctl.deploy.rollout import routerdrain
from clusterctl.deploy.rollout.plan import HostPlan
from clusterctl.deploy.units import pdrouter
from clusterctl.deploy.remote import HostState, NodeReply
from clusterctl.inventory.model import Instance, Inventory, PdPool
from clusterctl.deploy.rollout import drain as dr
from clusterctl.deploy.units.nodesetup import check_gpus_install_script, ensure_user_script, verify_model_install_script
from clusterctl.fleet.fleet import Fleet

_USER = re.compile(r"^User=(\S+)\s*$", re.MULTILINE)
_PORT = re.compile(r"--port[= ]'?(\d+)")


def unit_user(unit_text: str) -> str | None:
    """The ``User=`` of a unit (``None``: root)."""
    m = _USER.search(unit_text)
    return m.group(1) if m else None


def unit_port(unit_text: str) -> int | None:
    """The ``--port`` on a unit's command line."""
    m = _PORT.search(unit_text)
    return int(m.group(1)) if m else None


def setup_scripts(users: Sequence[str]) -> list[str]:
    """The node set-up the units need: each service user, and ``verify-model`` (their ExecStartPre)."""
    return [ensure_user_script(u) for u in users] + [verify_model_install_script(), check_gpus_install_script()]


def apply_job(
    hp: HostPlan,
    rendered: Mapping[str, spec.RenderedInstance],
    st: HostState,
    run_id: str,
    links_before: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """The node job for one host's plan (it holds env files with secrets: stdin only).

    ``links_before``: model path -> the symlink target the host had before
    this deploy staged anything (what rollback restores); default: ``st``'s.
    """
    write: list[dict[str, Any]] = []
    restart: list[str] = []
    start: list[str] = []
    remove: list[str] = []
    users: set[str] = set()
    for item in hp.items:
        if item.action == "remove":
            remove.append(item.instance)
            continue
        if item.action == "unchanged":
            continue
        r = rendered[item.instance]
        if item.action == "start":
            start.append(r.instance)
            continue
        user = unit_user(r.unit_text)
        if user:
            users.add(user)
        model_before = (
            links_before.get(r.model_path)
            if links_before is not None
            else (st.models.get(r.model_path) or {}).get("target")
        )
        write.append(
            {
                "instance": r.instance,
                "unit_text": r.unit_text,
                "env_text": r.env_text,
                "model_path": r.model_path,
                "model_before": model_before,
                "enable": r.enable_at_boot,
            }
        )
        (restart if item.action == "changed" else start).append(r.instance)
    return {
        "op": "apply",
        "run_id": run_id,
        "write": write,
        "restart": restart,
        "start": start,
        "remove": remove,
        "setup_scripts": setup_scripts(sorted(users)) if write else [],
    }


def touched(hp: HostPlan) -> list[str]:
    """Instances whose files this host's apply writes or removes (what a rollback restores)."""
    return [i.instance for i in hp.items if i.action in ("new", "changed", "remove")]


def apply_hosts(
    fleet: Fleet, jobs: Mapping[str, dict[str, Any]], on_reply: Callable[[NodeReply], None] | None = None
) -> dict[str, NodeReply]:
    """Run each host's apply job (in parallel); one reply per host."""
    return remote.run_jobs(fleet, jobs, on_reply=on_reply)


def rollback_hosts(
    fleet: Fleet,
    instances: Mapping[str, list[str]],
    *,
    own_run_id: str,
    only_run_id: str | None = None,
    restart: bool = True,
) -> dict[str, NodeReply]:
    """Restore the previous unit, env and model link of ``instances[host]`` on each host.

    ``only_run_id``: restore only copies that run saved; ``own_run_id``
    marks the copies this rollback leaves (the current files it replaces);
    ``restart=False`` puts files back without restarting (they were written
    but never started, so what runs is already the previous version).
    """
    jobs = {
        h: {"op": "rollback", "instances": names, "run_id": only_run_id, "own_run_id": own_run_id, "restart": restart}
        for h, names in instances.items()
        if names
    }
    return remote.run_jobs(fleet, jobs)


def is_headless(unit_text: str) -> bool:
    """A multi-node replica's worker unit (``--headless``): no API server, the gateway never sends it
    traffic; its head's drain and gate cover the replica (docs/multinode.md)."""
    return "--headless" in unit_text


def instance_for_drain(inv: Inventory, host: str, name: str, unit_text: str) -> Instance | None:
    """The inventory's instance, or one built from the host's unit (a removed instance)."""
    inst = inv.instances.get(name)
    if inst is not None:
        return inst
    port = unit_port(unit_text)
    if port is None:
        return None
    return Instance(name=name, model="", engine="", placement=(), port=port, args={"host": inv.hosts[host].address})


def drain_targets(
    inv: Inventory, hp: HostPlan, st: HostState, instances: Mapping[str, Instance]
) -> tuple[list[Instance], list[PdPool]]:
    """What :func:`drain_before` drains on this host: the running instances its apply restarts or
    removes (a multi-node replica's workers left out: drained through their head), and the PD pools
    whose router it restarts or removes (drained through the pool's members)."""
    todo: list[Instance] = []
    pools: list[PdPool] = []
    for item in hp.items:
        have = st.instances.get(item.instance)
        if item.action not in ("changed", "remove") or have is None or have.active != "active":
            continue
        if is_headless(have.unit_text):  # drained through its head (a mark-down would stay behind)
            continue
        if have.x.get("Role") == "router":  # drained through its pool's members (deploy/rollout/routerdrain.py)
            pool = pdrouter.pool_of(inv, item.instance)
            if pool is not None:
                pools.append(pool)
            continue
        inst = instances.get(item.instance) or instance_for_drain(inv, hp.host, item.instance, have.unit_text)
        if inst is not None:
            todo.append(inst)
    return todo, pools


def drain_before(
    inv: Inventory,
    hp: HostPlan,
    st: HostState,
    instances: Mapping[str, Instance],
    timeout: float,
    gateway: dr.GatewayHook | None = None,
) -> dict[str, str]:
    """Drain the running instances this host's apply restarts or removes; instance -> note.

    ``gateway``: the drain hook the caller gave (``ops.deploy.drain_hook``) that marks them down first; ``None``: none.
    """
    todo, pools = drain_targets(inv, hp, st, instances)
    if not todo and not pools:
        return {}

    def one(what: Instance | PdPool) -> dr.DrainResult:
        if isinstance(what, PdPool):
            return routerdrain.drain_router(inv, what, instances, timeout=timeout, gateway=gateway)
        return dr.drain(inv, what, timeout=timeout, gateway=gateway)

    with cf.ThreadPoolExecutor(max_workers=min(16, len(todo) + len(pools))) as ex:
        results = list(ex.map(one, [*todo, *pools]))
    return {r.instance: ("drained" if r.drained else f"drain timed out, {r.remaining} in flight") for r in results}
