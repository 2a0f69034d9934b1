"""Control side of the node program (:mod:`clusterctl.node.deploy`): run jobs, read hosts.

Every call is one SSH command per host: the node program run the one way node
programs are (:mod:`clusterctl.fleet.ship`: from the node cache; shipped on stdin
only to a host without a verified copy, a second round trip there) with the JSON
job on stdin (it may hold env files with secrets, so never on a command line).  Each host answers one JSON line; a host that could not be
reached, timed out or crashed is a :class:`NodeReply` with ``ok=False`` and
the reason, never an exception.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import secrets
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

from clusterctl.fleet import ship
from clusterctl.fleet.results import HostResult
from clusterctl.deploy.units.nodesetup import check_gpus_source

#: Seconds one node job may take (``apply`` waits for systemctl start/restart).
DEFAULT_TIMEOUT_S = 300.0


@dataclass
class NodeReply:
    """One host's answer.  ``data`` is the node's JSON result; ``error`` explains ``ok=False``."""

    host: str
    ok: bool
    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    kind: str | None = None


@dataclass
class InstanceState:
    """One ``clusterctl-NAME.service`` as a host has it (no env contents: only hashes)."""

    instance: str
    unit_text: str
    digest: str
    env_hashes: dict[str, str]
    env_present: bool
    active: str
    sub: str
    restarts: int
    main_pid: int
    enabled: str
    started_mono: int
    x: dict[str, str]
    #: systemd's ``Result=`` and ``ExecMainStatus=`` and, for a unit not running, its journal's last lines.
    result: str = ""
    exit_status: str = ""
    journal_tail: str = ""


@dataclass
class HostState:
    """What one host has: its instances, lock, previous copies and model paths.

    ``error`` is set (and the rest empty) when the host could not be read.
    """

    host: str
    instances: dict[str, InstanceState] = field(default_factory=dict)
    lock: dict[str, Any] | None = None
    previous: list[str] = field(default_factory=list)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    users: dict[str, bool] = field(default_factory=dict)
    error: str | None = None
    salt: str = ""
    #: ``systemctl --version``'s number (None: not known); picks the unit directives the host has.
    systemd_version: int | None = None
    #: NVML index -> GPU UUID (read only when asked, ``read_hosts(gpu_uuids=True)``; None: not known).
    gpu_uuids: dict[int, str] | None = None
    #: ``DEV:PORT`` -> its populated RoCE GID table ``[{index, gid, type}]`` (None: no such port), for the
    #: ports asked for (``read_hosts(rdma_ports=...)``; multi-node replicas' NCCL_IB_GID_INDEX).
    gids: dict[str, list[dict[str, Any]] | None] = field(default_factory=dict)


@lru_cache(maxsize=1)
def node_program() -> ship.Program:
    """The node program as shipped (:func:`clusterctl.fleet.ship.build`)."""
    return ship.build("deploy")


def node_reply(r: HostResult) -> NodeReply:
    """The node program's JSON answer in ``r`` (its last JSON line), or why there is none."""
    for line in reversed((r.stdout or "").strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return NodeReply(r.host, bool(data.get("ok")), data, data.get("error"), data.get("kind"))
    if r.status.value in ("ok", "failed"):
        tail = (r.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return NodeReply(r.host, False, {}, f"the node program exited {r.rc}: {tail[0]}", "node")
    return NodeReply(r.host, False, {}, r.error or r.status.value, r.status.value)


def run_job(
    fleet: Any, job: Mapping[str, Any], *, hosts: list[str] | None = None, timeout: float = DEFAULT_TIMEOUT_S
) -> dict[str, NodeReply]:
    """Run the same ``job`` on ``hosts`` (default: every host of ``fleet``), as root."""
    names = hosts if hosts is not None else [h.name for h in fleet.hosts]
    if not names:
        return {}
    res = ship.run(
        fleet,
        node_program(),
        {h: [] for h in names},
        stdin=json.dumps(job).encode() + b"\n",
        sudo=True,
        timeout=timeout,
    )
    return {r.host: node_reply(r) for r in res}


def run_jobs(
    fleet: Any,
    jobs: Mapping[str, Mapping[str, Any]],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    on_reply: Callable[[NodeReply], None] | None = None,
) -> dict[str, NodeReply]:
    """Run one job per host (each host sees only its own job: env files hold secrets).

    Hosts run in parallel, at most the fleet's fanout at a time;
    ``on_reply`` is called (in worker threads) as each host finishes.
    """

    def one(host: str) -> NodeReply:
        reply = run_job(fleet, jobs[host], hosts=[host], timeout=timeout)[host]
        if on_reply:
            on_reply(reply)
        return reply

    if not jobs:
        return {}
    with cf.ThreadPoolExecutor(max_workers=max(1, min(len(jobs), getattr(fleet, "fanout", 8)))) as ex:
        return dict(zip(jobs, ex.map(one, list(jobs))))


def read_hosts(
    fleet: Any,
    *,
    model_paths: list[str] | None = None,
    users: list[str] | None = None,
    hosts: list[str] | None = None,
    timeout: float = 60.0,
    gpu_uuids: bool = False,
    rdma_ports: Sequence[str] = (),
) -> dict[str, HostState]:
    """Read ``hosts`` (default: every host of ``fleet``) in one SSH command each.

    Env files come back only as a digest and per-key hashes salted with a
    value fresh for this call (``HostState.salt``; :func:`clusterctl.node.deploy.env_hashes`
    computes the same here).  ``gpu_uuids``: also each GPU's UUID by NVML index
    (``check-gpus --list`` run on the node).  ``rdma_ports``: also the GID table of each of these
    ``DEV:PORT`` RDMA ports (``HostState.gids``).
    """
    salt = secrets.token_hex(16)
    job: dict[str, Any] = {
        "op": "read",
        "salt": salt,
        "model_paths": sorted(set(model_paths or [])),
        "users": sorted(set(users or [])),
    }
    if rdma_ports:
        job["rdma_ports"] = sorted(set(rdma_ports))
    if gpu_uuids:
        job["gpu_lister"] = check_gpus_source()
    replies = run_job(fleet, job, hosts=hosts, timeout=timeout)
    out: dict[str, HostState] = {}
    for host, rep in replies.items():
        if not rep.ok:
            out[host] = HostState(host, error=rep.error or "could not read the host")
            continue
        d = rep.data
        insts = {
            name: InstanceState(
                instance=name,
                unit_text=i["unit_text"],
                digest=i["digest"],
                env_hashes=i["env_hashes"],
                env_present=i["env_present"],
                active=i["active"],
                sub=i["sub"],
                restarts=i["restarts"],
                main_pid=i["main_pid"],
                enabled=i["enabled"],
                started_mono=i["started_mono"],
                x=i["x"],
                result=i.get("result", ""),
                exit_status=i.get("exit_status", ""),
                journal_tail=i.get("journal_tail", ""),
            )
            for name, i in d.get("instances", {}).items()
        }
        version = d.get("systemd_version")
        uuids = d.get("gpu_uuids")
        gids = d.get("gids")
        out[host] = HostState(
            host,
            insts,
            d.get("lock"),
            d.get("previous", []),
            d.get("models", {}),
            d.get("users", {}),
            salt=salt,
            systemd_version=version if isinstance(version, int) else None,
            gpu_uuids={int(k): str(v) for k, v in uuids.items()} if isinstance(uuids, dict) else None,
            gids={str(k): v if isinstance(v, list) else None for k, v in gids.items()}
            if isinstance(gids, dict)
            else {},
        )
    return out
