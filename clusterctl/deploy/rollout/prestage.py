"""What a deploy stages, and ``deploy --prestage``: the next version on every target host first.

:func:`unstaged` says which models the instances about to start lack on which
hosts (a model with a ``source`` whose path on the host is not the verified
version the inventory asks for).  A batch stages exactly that on its own hosts
(``Deploy._stage``); with ``--prestage`` the deploy first stages it on every
target host at once, without switching the model path (``stage --no-switch``)
and reading up to a page-cache budget of it per host (``stage --warm-budget``),
before the first batch stops anything.  A batch then runs no staging run on a
host where the pre-stage verified the version: its apply job switches the link
(``relink``, which the node refuses before touching anything when the target is
missing or not that verified version), so the window holds switches, restarts and
loads from memory, not the transfer (docs/release.md).

A host whose pre-staging failed is not refused here: its batch stages it again
(and refuses the host if that fails too), as without ``--prestage``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterctl.deploy import remote, spec
from clusterctl.inventory.model import Inventory
from clusterctl.stage import plan as sp
from clusterctl.stage import run as sr


def needs_staging(inv: Inventory, r: spec.RenderedInstance, st: remote.HostState) -> bool:
    """True when ``r``'s model has a source and its path on the host is not the verified version."""
    model = inv.models.get(r.model)
    if model is None or not model.source:
        return False
    m = st.models.get(r.model_path) or {}
    return not m.get("verified") or bool(model.version and m.get("version") != model.version)


def unstaged(
    inv: Inventory,
    rendered: Iterable[spec.RenderedInstance],
    hosts: Iterable[str],
    starting: set[str],
    states: Mapping[str, remote.HostState],
) -> dict[str, list[str]]:
    """Model name -> the hosts of ``hosts`` (in order) where an instance of ``starting`` needs it staged."""
    chosen = set(hosts)
    need: dict[str, list[str]] = {}
    for r in rendered:
        if r.host in chosen and r.instance in starting and needs_staging(inv, r, states[r.host]):
            on = need.setdefault(r.model, [])
            if r.host not in on:
                on.append(r.host)
    return need


@dataclass
class Prestaged:
    """``hosts``: host -> model -> ``staged``, ``present`` or why not (the row's error or status);
    ``seconds``: model -> the staging run's wall time; ``resident``: host -> model -> the
    fraction of the version in the host's page cache after the warm-up (the node's own
    ``mincore`` count; hosts whose node did not report it are absent); ``versions``: host ->
    model -> the version its node staged and verified (what a batch's apply switches to)."""

    hosts: dict[str, dict[str, str]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    resident: dict[str, dict[str, float]] = field(default_factory=dict)
    versions: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def failed(self) -> dict[str, dict[str, str]]:
        return {
            h: {m: s for m, s in ms.items() if s not in ("staged", "present")}
            for h, ms in self.hosts.items()
            if any(s not in ("staged", "present") for s in ms.values())
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "hosts": self.hosts,
            "seconds": {m: round(s, 3) for m, s in self.seconds.items()},
            "resident": self.resident,
        }


def prestage(
    inv: Inventory,
    need: Mapping[str, list[str]],
    make_fleet: Callable[[Any], Any],
    *,
    warm_budget: int | None = None,
    on_phase: Callable[[str], None] = lambda m: None,
    on_host: Callable[[str, str, bool], None] = lambda h, m, ok: None,
    on_progress: sr.OnProgress | None = None,
) -> Prestaged:
    """Stage each model of ``need`` on its hosts without switching, and warm it.

    One relay chain per model over all its hosts (the source is read once);
    ``warm_budget``: bytes of the version read into the page cache per host
    (None: the whole version).  Never raises for a host's failure: the
    result says which hosts lack what.
    """
    out = Prestaged()
    for name, hosts in need.items():
        model = inv.models[name]
        on_phase(
            f"pre-staging {name} {model.version or ''} on {len(hosts)} hosts without switching; warming "
            + ("the whole version" if warm_budget is None else f"up to {warm_budget} bytes")
            + " per host"
        )
        src = sp.parse_source(model.source or "", f"{inv.path}: models.{name}.source")
        man = sp.load_manifest(src, name, model.version)
        targets = [inv.hosts[h] for h in hosts]
        out.seconds[name] = 0.0
        with make_fleet(targets) as fleet:
            # A chain needs all its hosts at once: more hosts than the fleet runs together are
            # staged as consecutive chains of at most that many (the source is read once per chain).
            size = max(1, int(getattr(fleet, "fanout", len(targets)) or len(targets)))
            for i in range(0, len(targets), size):
                rep = sr.stage_model(
                    fleet,
                    targets[i : i + size],
                    model,
                    src,
                    man,
                    relay="chain",
                    switch=False,
                    warm=True,
                    warm_budget=warm_budget,
                    on_progress=on_progress,
                )
                out.seconds[name] += rep.seconds
                for row in rep.rows:
                    what = row.status if row.ok else f"{row.status}: {row.error or row.kind}"
                    out.hosts.setdefault(row.host, {})[name] = what
                    if row.ok and row.data.get("version"):
                        out.versions.setdefault(row.host, {})[name] = str(row.data["version"])
                    warmed = row.data.get("warm") or {}
                    if row.ok and warmed.get("bytes"):
                        share = min(1.0, int(warmed.get("resident") or 0) / int(warmed["bytes"]))
                        out.resident.setdefault(row.host, {})[name] = round(share, 3)
                    on_host(row.host, f"pre-stage {name}: {what}", row.ok)
    return out
