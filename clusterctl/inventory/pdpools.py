"""Reading ``pd_pools:``: prefill/decode disaggregation pools (docs/disaggregation.md).

A pool groups the instances and template replicas of one model whose
``role`` is ``prefill`` or ``decode``; its P:D ratio is the count of each.
The pool names the KV connector vLLM uses between them and where its
router (vllm-router in ``--vllm-pd-disaggregation`` mode) runs::

    pd_pools:
      qwen-pd:
        model: qwen3-8b
        connector: NixlConnector     # default
        router: {host: gw01, port: 8300, policy: round_robin}

Every problem is a ``file:line``: an unknown model or router host, a pool
without prefill or without decode members, two pools of one model, and
prefill/decode instances of a model that has no pool (nothing would route
to them).
"""

from __future__ import annotations

from clusterctl.inventory.fields import Ctx, suggest
from clusterctl.inventory.model import CONNECTOR_ROLES, ROUTER_METRICS_OFFSET, Inventory, Location, PdPool, PdRouter
from clusterctl.inventory.yamlnodes import Y

KEYS = ("model", "connector", "router")
ROUTER_KEYS = ("host", "port", "policy", "metrics_port")
#: vllm-router's --policy choices (vllm-router 0.1.17 --help).
POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "consistent_hash")


def members(inv: Inventory, model: str) -> dict[str, list[tuple[str, int]]]:
    """``{"prefill": [(name, replicas)], "decode": [...]}`` of ``model``'s instances and templates."""
    out: dict[str, list[tuple[str, int]]] = {"prefill": [], "decode": []}
    for i in inv.instances.values():
        if i.model == model and i.role in out and i.template is None:
            out[i.role].append((i.name, 1))
    for t in inv.templates.values():
        if t.model == model and t.role in out:
            out[t.role].append((t.name, t.replicas))
    return out


def ratio(inv: Inventory, pool: PdPool) -> tuple[int, int]:
    """The pool's P:D ratio as (prefill replicas, decode replicas)."""
    m = members(inv, pool.model)
    return sum(n for _x, n in m["prefill"]), sum(n for _x, n in m["decode"])


def pool_of(inv: Inventory, model: str) -> PdPool | None:
    return next((p for p in inv.pd_pools.values() if p.model == model), None)


class PdPoolReader:
    """Reads ``pd_pools:`` after hosts, models, instances and templates are known."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def pools(self, y: Y | None, inv: Inventory) -> dict[str, PdPool]:
        ctx = self.ctx
        out: dict[str, PdPool] = {}
        m = ctx.mapping(y, "pd_pools") if y is not None else None
        named = {
            e.value
            for e in (v.value.get("model") for v in (m or {}).values() if v.kind == "map")
            if e is not None and isinstance(e.value, str)
        }
        for name, entry in (m or {}).items():
            pool = self._pool(name, entry, inv)
            if pool is None:
                continue
            other = next((p for p in out.values() if p.model == pool.model), None)
            if other is not None:
                ctx.error(entry.line, f"pd_pools.{name}: model {pool.model!r} already has pool {other.name!r}")
                continue
            out[name] = pool
        self._orphans(inv, named)
        return out

    def _pool(self, name: str, y: Y, inv: Inventory) -> PdPool | None:
        ctx = self.ctx
        w = f"pd_pools.{name}"
        if ctx.mapping(y, w) is None:
            return None
        known = ctx.keys(y, KEYS, w)
        model = ctx.string(known["model"], f"{w}.model") if "model" in known else None
        if model is None:
            ctx.error(y.line, f"{w}: missing 'model'") if "model" not in known else None
            return None
        if model not in inv.models:
            ctx.error(
                known["model"].line,
                f"{w}.model: {model!r} is not defined under models" + suggest(model, list(inv.models)),
            )
            return None
        connector = "NixlConnector"
        if "connector" in known:
            connector = ctx.string(known["connector"], f"{w}.connector", tuple(CONNECTOR_ROLES)) or connector
        if "router" not in known:
            ctx.error(y.line, f"{w}: missing 'router' ({{host: NAME, port: N}}: where vllm-router runs)")
            return None
        router = self._router(known["router"], w, inv)
        if router is None:
            return None
        pool = PdPool(
            name=name, model=model, router=router, connector=connector, location=Location(ctx.filename, y.line)
        )
        mem = members(inv, model)
        pool.prefill = [n for n, _r in mem["prefill"]]
        pool.decode = [n for n, _r in mem["decode"]]
        for role in ("prefill", "decode"):
            if not mem[role]:
                ctx.error(
                    y.line,
                    f"{w}: model {model!r} has no {role} instances or templates (set role: {role} on at least one)",
                )
        return pool

    def _router(self, y: Y, w: str, inv: Inventory) -> PdRouter | None:
        ctx = self.ctx
        if ctx.mapping(y, f"{w}.router") is None:
            return None
        known = ctx.keys(y, ROUTER_KEYS, f"{w}.router")
        host = ctx.string(known["host"], f"{w}.router.host") if "host" in known else None
        if host is None:
            ctx.error(y.line, f"{w}.router: missing 'host'") if "host" not in known else None
            return None
        if host not in inv.hosts:
            ctx.error(
                known["host"].line,
                f"{w}.router.host: {host!r} is not defined under hosts" + suggest(host, list(inv.hosts)),
            )
            return None
        r = PdRouter(host=host)
        if "port" in known:
            r.port = ctx.integer(known["port"], f"{w}.router.port", 1, 65535) or r.port
        if "policy" in known:
            r.policy = ctx.string(known["policy"], f"{w}.router.policy", POLICIES) or r.policy
        if "metrics_port" in known:
            r.metrics_port = ctx.integer(known["metrics_port"], f"{w}.router.metrics_port", 1, 65535) or None
        clash = [i.name for i in inv.instances.values() if host in i.hosts and i.port == r.port]
        if clash:
            ctx.error(
                known.get("port", y).line, f"{w}.router.port: {r.port} is also instance {clash[0]}'s port on {host}"
            )
        mp, at = r.prometheus_port, known.get("metrics_port", known.get("port", y)).line
        used = [i.name for i in inv.instances.values() if host in i.hosts and i.port == mp]
        if mp > 65535:
            ctx.error(
                at,
                f"{w}.router: port {r.port} leaves no metrics port (port + {ROUTER_METRICS_OFFSET} > "
                "65535): set router.metrics_port",
            )
        elif mp == r.port or used:
            ctx.error(
                at,
                f"{w}.router.metrics_port: {mp} is also "
                + (f"instance {used[0]}'s port on {host}" if used else "the router's port"),
            )
        return r

    def _orphans(self, inv: Inventory, models: set[str]) -> None:
        """Prefill/decode members of models that no pool names (a pool's own errors are reported there)."""
        for kind, items in (
            ("instances", [i for i in inv.instances.values() if i.template is None]),
            ("templates", list(inv.templates.values())),
        ):
            for item in items:
                if item.role in ("prefill", "decode") and item.model not in models:
                    line = item.location.line if item.location else 0
                    self.ctx.error(
                        line,
                        f"{kind}.{item.name}: role {item.role} needs a pd_pools entry for "
                        f"model {item.model!r} (its router sends requests to prefill, then "
                        "decode)",
                    )
