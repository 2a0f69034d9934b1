"""Prefill/decode disaggregation in units: the KV-transfer flag, its environment, the router (pure).

Facts (sources in docs/disaggregation.md):

* A prefill or decode instance runs ``vllm serve ... --kv-transfer-config JSON``
  with the pool's connector and the ``kv_role`` of its side
  (:data:`clusterctl.inventory.model.CONNECTOR_ROLES`).
* NixlConnector moves KV over UCX: ``UCX_NET_DEVICES`` names the data NICs'
  RDMA ports (``mlx5_0:1,...``; NCCL's variables do not apply to it), and on
  RoCE ``UCX_IB_TRAFFIC_CLASS`` carries the fabric's DSCP as NCCL_IB_TC does.
  Its handshake listens on ``VLLM_NIXL_SIDE_CHANNEL_HOST``:``VLLM_NIXL_SIDE_CHANNEL_PORT``
  (vLLM's defaults ``localhost``:5600): the host's data address and a port per
  instance (its HTTP port + :data:`SIDE_CHANNEL_OFFSET`), so instances on one
  host do not collide.
* The router is vllm-router (``vllm-router --vllm-pd-disaggregation --prefill URL
  ... --decode URL ... --policy P --host H --port N --prometheus-host H --prometheus-port M``;
  its ``/metrics`` are on the Prometheus port, ``router.metrics_port``, by default N + 10000;
  vllm-router's own default is 127.0.0.1:29000); it answers ``/health``
  and proxies ``/v1/completions`` and ``/v1/chat/completions``: prefill with
  ``max_tokens: 1`` and ``kv_transfer_params.do_remote_decode``, then decode
  with the params the prefill returned.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from clusterctl.deploy.units.sdquote import command_line
from clusterctl.deploy.units.render import nccl_ib_tc
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import Host, Instance, Inventory, PdPool

#: The NIXL side-channel port of an instance: its HTTP port plus this.
SIDE_CHANNEL_OFFSET = 10000
#: Where scripts/install-vllm-router puts vllm-router (a venv on the lab hosts' Python).
ROUTER_BIN = "/var/cache/clusterctl-vllm-router/venv/bin/vllm-router"


def pool_for(inv: Inventory, inst: Instance) -> PdPool | None:
    """The pool ``inst`` serves in (None for a mixed instance)."""
    if inst.role not in ("prefill", "decode"):
        return None
    return next((p for p in inv.pd_pools.values() if p.model == inst.model), None)


def kv_transfer_config(pool: PdPool, role: str) -> str:
    """The ``--kv-transfer-config`` value for ``role`` (compact JSON, stable key order)."""
    return json.dumps({"kv_connector": pool.connector, "kv_role": pool.kv_role(role)}, separators=(",", ":"))


def kv_args(inv: Inventory, inst: Instance) -> list[str]:
    """``["--kv-transfer-config", JSON]`` for a pool member unless its ``args`` set one; else []."""
    pool = pool_for(inv, inst)
    if pool is None:
        if inst.role in ("prefill", "decode"):
            raise ClusterctlError(
                f"instances.{inst.name}: role {inst.role} but no pd_pools entry for model {inst.model!r}"
            )
        return []
    if "kv-transfer-config" in inst.args:
        return []
    return ["--kv-transfer-config", kv_transfer_config(pool, inst.role)]


def kv_env(inv: Inventory, inst: Instance, host: Host) -> dict[str, str]:
    """The KV-transfer environment of a pool member on ``host`` (empty for a mixed instance)."""
    pool = pool_for(inv, inst)
    if pool is None:
        return {}
    env: dict[str, str] = {}
    data = host.nics_with_role("data")
    if pool.connector in ("NixlConnector", "MooncakeConnector"):
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = next((n.address for n in data if n.address), host.address)
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_channel_port(inst))
        ports = [f"{n.rdma_device}:{n.port}" for n in data if n.rdma_device]
        if ports:
            env["UCX_NET_DEVICES"] = ",".join(ports)
            if inv.fabric.kind == "roce":
                env["UCX_IB_TRAFFIC_CLASS"] = str(nccl_ib_tc(inv.fabric))
    return env


def side_channel_port(inst: Instance) -> int:
    port = inst.port + SIDE_CHANNEL_OFFSET
    if port > 65535:
        raise ClusterctlError(
            f"instances.{inst.name}: port {inst.port} leaves no NIXL side-channel port "
            f"(port + {SIDE_CHANNEL_OFFSET} > 65535)"
        )
    return port


def instance_url(inv: Inventory, inst: Instance) -> str:
    """How the router reaches ``inst``: its host's address (the data address first) and port."""
    host = inv.hosts[inst.hosts[0]]
    addr = host.address
    return f"http://{addr}:{inst.port}"


def router_argv(
    inv: Inventory, pool: PdPool, instances: Iterable[Instance], binary: str = ROUTER_BIN, extra: Sequence[str] = ()
) -> list[str]:
    """The vllm-router command line for ``pool`` over the placed ``instances`` (sorted by name),
    ``extra`` flags before the workers."""
    mine = sorted((i for i in instances if pool_for(inv, i) is pool), key=lambda i: i.name)
    pre = [i for i in mine if i.role == "prefill"]
    dec = [i for i in mine if i.role == "decode"]
    if not pre or not dec:
        raise ClusterctlError(
            f"pd_pools.{pool.name}: needs placed prefill and decode instances "
            f"(has {len(pre)} prefill, {len(dec)} decode)"
        )
    host = inv.hosts[pool.router.host]
    # its Prometheus endpoint on the host's address and a port of its own (vllm-router's default is
    # 127.0.0.1:29000: two routers of one host would collide, and status could not scrape it)
    argv = [
        binary,
        "--vllm-pd-disaggregation",
        "--host",
        host.address,
        "--port",
        str(pool.router.port),
        "--policy",
        pool.router.policy,
        "--prometheus-host",
        host.address,
        "--prometheus-port",
        str(pool.router.prometheus_port),
        *extra,
    ]
    if pool.connector == "NixlConnector":
        argv += ["--kv-connector", "nixl"]
    elif pool.connector == "MooncakeConnector":
        argv += ["--kv-connector", "mooncake"]
    for i in pre:
        argv += ["--prefill", instance_url(inv, i)]
    for i in dec:
        argv += ["--decode", instance_url(inv, i)]
    return argv


def router_unit(
    inv: Inventory, pool: PdPool, instances: Iterable[Instance], binary: str = ROUTER_BIN, extra: Sequence[str] = ()
) -> str:
    """The systemd unit of ``pool``'s router (``clusterctl-router-<pool>.service``)."""
    argv = router_argv(inv, pool, instances, binary, extra)
    desc = f"vllm-router {pool.name}: {pool.model} prefill/decode on port {pool.router.port}".replace("%", "%%")
    return (
        f"# clusterctl: vllm-router of prefill/decode pool {pool.name}\n"
        "[Unit]\n"
        f"Description={' '.join(desc.split())}\n"
        "After=network-online.target\nWants=network-online.target\n\n"
        "[Service]\nType=simple\nUser=vllm\n"
        f"ExecStart={command_line(argv)}\n"
        "Restart=always\nRestartSec=5\n"
        f"SyslogIdentifier=vllm-router-{pool.name}\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
