"""The staging workflows of ``clusterctl stage``: a model version onto the nodes (:func:`prepare`
then :func:`run`), ``status | warm | evict`` (:func:`node_verb`), ``pin | unpin`` (:func:`pin`)
and ``manifest`` (:func:`manifest`).

A :class:`StageRequest` (the inventory loaded, the hosts selected, how their fleets are built)
goes in; the feature's rows and reports (:class:`~clusterctl.stage.run.NodeRow`,
:class:`~clusterctl.stage.run.StageReport`) come out.  Everything that can be refused (the source,
the relay plan, the manifest, the sizes) is checked by :func:`prepare` before any host is reached,
as a :class:`~clusterctl.errors.ClusterctlError`; a host that fails is a row (docs/staging.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from clusterctl.config import UserConfig
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.factory import make_fleet
from clusterctl.fleet.fleet import Fleet
from clusterctl.inventory.model import Host, Inventory, Model
from clusterctl.node.stage import manifest as mf
from clusterctl.stage import plan as pl
from clusterctl.stage import run as rn
from clusterctl.stage.run import NodeRow, OnProgress, StageReport


@dataclass(frozen=True)
class StageRequest:
    """``models`` of ``inventory`` (one for staging, pin, warm, evict; any number for status) on
    ``hosts``, reached with ``cfg`` and the command's SSH options; ``become_password`` read."""

    inventory: Inventory
    hosts: Sequence[Host]
    models: Sequence[Model]
    cfg: UserConfig
    timeout: float = 3600
    connect_timeout: Optional[float] = None
    host_key_policy: Optional[str] = None
    become_password: Optional[str] = field(default=None, repr=False)  # never in a repr or log

    def fleet(self, fanout: int) -> Fleet:
        """A fleet over the hosts, ``fanout`` at once, a host's command bounded by ``timeout``."""
        return make_fleet(
            self.hosts,
            self.cfg,
            fanout=fanout,
            connect_timeout=self.connect_timeout,
            command_timeout=self.timeout,
            become_password=self.become_password,
            host_key_policy=self.host_key_policy,
        )


@dataclass(frozen=True)
class StageOptions:
    """``clusterctl stage MODEL``'s options (see its ``--help``)."""

    source: Optional[str] = None
    version: Optional[str] = None
    relay: str = "chain"
    chains: int = 1
    tree_fanout: int = 2
    per_rack: bool = False
    relay_network: str = "auto"
    max_readers: int = 8
    port: int = pl.DEFAULT_PORT
    workers: int = 8
    keep: int = 2
    warm: bool = False
    warm_budget: Optional[str] = None
    switch: bool = True


@dataclass(frozen=True)
class StagePlan:
    """What :func:`run` does, checked: the source, the manifest, each host's relay address, how
    many hosts at once (``fanout``) and the warm-up budget in bytes (None: all, or no warm-up)."""

    request: StageRequest
    options: StageOptions
    model: Model
    source: pl.Source
    manifest: mf.Manifest
    addresses: dict[str, str]
    fanout: int
    warm_bytes: Optional[int]


def prepare(request: StageRequest, options: StageOptions) -> StagePlan:
    """Check the source, the relay plan and the sizes, and read the manifest; nothing on the hosts."""
    model, hosts, o = request.models[0], request.hosts, options
    src = pl.parse_source(
        o.source or model.source or "",
        "--source" if o.source else f"{request.inventory.path}: models.{model.name}.source",
    )
    addresses = {h.name: rn.relay_address(h, o.relay_network) for h in hosts}
    pl.plan_chains([(h.name, addresses[h.name]) for h in hosts], o.relay, o.chains, o.port, fanout=o.tree_fanout)
    man = pl.load_manifest(src, model.name, o.version or model.version)
    fanout = len(hosts) if o.relay != "none" else min(o.max_readers, len(hosts))
    warm_bytes = rn.parse_size(o.warm_budget, "--warm-budget") if o.warm_budget else None
    return StagePlan(request, options, model, src, man, addresses, fanout, warm_bytes)


def run(
    plan: StagePlan,
    on_result: Optional[Callable[[Any], None]] = None,
    on_progress: Optional[OnProgress] = None,
) -> StageReport:
    """Stage the planned version on every host (fetch or relay, verify, switch, prune, warm)."""
    o, request = plan.options, plan.request
    with request.fleet(plan.fanout) as fleet:
        return rn.stage_model(
            fleet,
            request.hosts,
            plan.model,
            plan.source,
            plan.manifest,
            relay=o.relay,
            chains=o.chains,
            tree_fanout=o.tree_fanout,
            per_rack=o.per_rack,
            port=o.port,
            address_of=lambda h: plan.addresses[h.name],
            workers=o.workers,
            keep=o.keep,
            warm=o.warm or plan.warm_bytes is not None,
            switch=o.switch,
            timeout=request.timeout,
            warm_budget=plan.warm_bytes,
            on_result=on_result,
            on_progress=on_progress,
        )


def node_verb(request: StageRequest, verb: str, workers: int = 8) -> list[NodeRow]:
    """``status``, ``warm`` or ``evict`` of the request's models on every host; one row per host."""
    with request.fleet(min(64, len(request.hosts))) as fleet:
        return rn.node_op(fleet, verb, request.models, workers=workers, timeout=request.timeout)


def pin(request: StageRequest, budget: Optional[str]) -> list[NodeRow]:
    """``pin`` (``budget``: bytes to keep resident, e.g. ``16G``) or ``unpin`` (``budget`` None)."""
    nbytes = rn.parse_size(budget) if budget else None
    with request.fleet(min(64, len(request.hosts))) as fleet:
        return rn.pin_models(fleet, request.models, nbytes, timeout=request.timeout)


def failed(rows: Sequence[NodeRow]) -> list[NodeRow]:
    """The rows of a node verb or pin that failed (the host, or one of its models)."""
    return [r for r in rows if not r.ok or any("error" in m for m in r.data.get("models", []))]


@dataclass(frozen=True)
class Manifest:
    """``stage manifest``'s result: the manifest written at ``path``."""

    path: str
    manifest: mf.Manifest


def manifest(directory: str, name: str, version: Optional[str], chunk_size: int) -> Manifest:
    """Compute the manifest of ``directory`` and write it there (ClusterctlError when it cannot)."""
    try:
        man = mf.compute(directory, name, version, chunk_size)
        return Manifest(pl.write_manifest(directory, man), man)
    except (mf.ManifestError, OSError) as e:
        raise ClusterctlError(str(e)) from e
