"""A prefill/decode pool's router as a deployed unit (pure; docs/disaggregation.md).

``clusterctl deploy`` treats the router of pool ``P`` as one more unit,
``clusterctl-router-P.service`` on ``pd_pools.P.router.host``, rendered here
into the same :class:`~clusterctl.deploy.spec.RenderedInstance` the
instances use, so plan, lock, apply, gates, rollback and audit handle it as
they handle an instance:

* it is rendered once every prefill and decode member of the pool is placed
  (a change of the members' addresses or ports changes its command line, so
  the router is restarted with them);
* its host comes last in the rollout (:func:`routers_last`): its gate sends
  a completion through the router, which needs the members it names;
* its gate is the instances' gate against the router's port (``/health``,
  ``/v1/models``, a one-token completion through prefill then decode);
* the gateway routes the pool's model to the router, never to the members
  (:func:`gateway_servers`).

The router has no model files and no GPU: ``model`` and ``model_path`` are
empty, so staging, pre-flight and the KV check leave it alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from clusterctl.deploy.units import pd
from clusterctl.deploy import spec
from clusterctl.inventory.model import CPU_SLOT, GpuRef, Instance, Inventory, PdPool

#: The router of pool P is the unit ``clusterctl-router-P.service``.
PREFIX = "router-"
#: vllm-router checks its workers every 30 s by default while it starts (``--worker-startup-check-interval``);
#: deployed together with its members, it should see them up within seconds of their gates.
STARTUP_CHECK_S = 2
#: ``[X-Clusterctl] Engine=`` of a router unit.
ENGINE = "vllm-router"


def router_name(pool: PdPool) -> str:
    return pool.router_name


def pool_of(inv: Inventory, name: str) -> PdPool | None:
    """The pool whose router unit is named ``name`` (None: an instance)."""
    if not name.startswith(PREFIX):
        return None
    return inv.pd_pools.get(name[len(PREFIX) :])


def members(inv: Inventory, pool: PdPool, instances: Iterable[Instance]) -> list[Instance]:
    """The placed prefill and decode instances of ``pool``, sorted by name."""
    return sorted((i for i in instances if i.placement and pd.pool_for(inv, i) is pool), key=lambda i: i.name)


def ready(inv: Inventory, pool: PdPool, instances: Iterable[Instance]) -> bool:
    """True when ``pool`` has at least one placed prefill and one placed decode instance."""
    roles = {i.role for i in members(inv, pool, instances)}
    return {"prefill", "decode"} <= roles


def router_unit(inv: Inventory, pool: PdPool, instances: Iterable[Instance]) -> str:
    """The router's unit with its ``[X-Clusterctl]`` record (what a host runs, readable from the host)."""
    mine = members(inv, pool, instances)
    text = pd.router_unit(inv, pool, mine, extra=["--worker-startup-check-interval", str(STARTUP_CHECK_S)])
    return text + (
        "\n[X-Clusterctl]\n"
        f"Instance={router_name(pool)}\nRole=router\nPool={pool.name}\nEngine={ENGINE}\n"
        f"Port={pool.router.port}\nMembers={','.join(i.name for i in mine)}\n"
    )


def render_routers(inv: Inventory, instances: Mapping[str, Instance]) -> list[spec.RenderedInstance]:
    """One rendered router per pool of ``inv`` whose members among ``instances`` are placed."""
    out = []
    for pool in inv.pd_pools.values():
        if not ready(inv, pool, instances.values()):
            continue
        out.append(
            spec.RenderedInstance(
                instance=router_name(pool),
                host=pool.router.host,
                unit_text=router_unit(inv, pool, instances.values()),
                env_text="",
                port=pool.router.port,
                gpus=(),
                model="",
                model_path="",
                model_version=None,
                engine=ENGINE,
                engine_version="",
            )
        )
    return out


def routers_last(hosts: Sequence[str], inv: Inventory, rendered: Iterable[spec.RenderedInstance]) -> list[str]:
    """``hosts`` in order, those that run a rendered router moved to the end (after its members)."""
    at = {r.host for r in rendered if pool_of(inv, r.instance) is not None}
    return [h for h in hosts if h not in at] + [h for h in hosts if h in at]


def served_model(inv: Inventory, pool: PdPool) -> str:
    """The name the router answers for: the pool model's served name."""
    m = inv.models.get(pool.model)
    return m.served_name if m is not None and m.served_name else pool.model


def router_instance(inv: Inventory, pool: PdPool) -> Instance:
    """The router as an Instance: ``router-P``, the pool's model, at the router's host and port."""
    return Instance(
        name=router_name(pool),
        model=pool.model,
        engine=ENGINE,
        placement=(GpuRef(inv.hosts[pool.router.host].name, CPU_SLOT),),
        port=pool.router.port,
    )


def gateway_servers(inv: Inventory, instances: Mapping[str, Instance]) -> dict[str, Instance]:
    """What the gateway sends traffic to: ``instances`` with each ready pool's members replaced by its
    router (:func:`router_instance`)."""
    out = dict(instances)
    for pool in inv.pd_pools.values():
        if not ready(inv, pool, instances.values()):
            continue
        for i in members(inv, pool, instances.values()):
            out.pop(i.name, None)
        out[router_name(pool)] = router_instance(inv, pool)
    return out
