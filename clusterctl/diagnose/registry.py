"""Declaring and running analyzers.

An analyzer is a pure function ``(ctx: AnalysisContext) -> list[Finding]``
registered under a check name with :func:`analyzer`.  ``run_analyzers``
runs the selected ones; an analyzer that raises becomes one UNKNOWN finding
(a bug in one check never hides the others).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.sources import name_gpus
from clusterctl.inventory.model import Inventory
from clusterctl.probe.factgroups import FactGroup, FactsDoc

T = TypeVar("T")

Analyzer = Callable[["AnalysisContext"], list[Finding]]


@dataclass
class AnalysisContext:
    """What analyzers read.

    ``facts``: host -> facts document (dict, schema of docs/facts.md), one per
    host that answered; ``missing``: host -> why no facts came back;
    ``samples``: host -> a later facts document (or partial document) for
    rate-based checks, taken ``interval_s`` after ``facts``; ``raw``: host ->
    {name: text} raw outputs (vLLM logs, metrics) from a run or a bundle;
    ``thresholds``: the loaded ``checks/*.yaml`` data.

    :meth:`fact` gives a fact group typed (``ctx.fact(host, GpusFact)``,
    ``clusterctl/probe/factgroups.py``); analyzers read those where a group exists.
    """

    inventory: Inventory | None
    facts: Mapping[str, FactsDoc]
    missing: Mapping[str, str] = field(default_factory=dict)
    samples: Mapping[str, FactsDoc] = field(default_factory=dict)
    interval_s: float = 0.0
    raw: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    thresholds: Mapping[str, Any] = field(default_factory=dict)
    typed: dict[tuple[str, str, str], object] = field(default_factory=dict, repr=False, compare=False)

    def fact(self, host: str, group: type[FactGroup[T]], *, sample: bool = False) -> T | None:
        """``group`` of the host's facts (of its later sample with ``sample=True``), typed and kept;
        None when the host has no such document."""
        key = (host, group.section, "sample" if sample else "facts")
        if key not in self.typed:
            doc = (self.samples if sample else self.facts).get(host)
            self.typed[key] = None if doc is None else group.parse(doc)
        return cast("T | None", self.typed[key])


_REGISTRY: dict[str, Analyzer] = {}


def analyzer(name: str) -> Callable[[Analyzer], Analyzer]:
    """Register the decorated function as the analyzer for check ``name``."""

    def register(fn: Analyzer) -> Analyzer:
        if name in _REGISTRY:
            raise ValueError(f"analyzer {name!r} registered twice")
        _REGISTRY[name] = fn
        return fn

    return register


def registered() -> dict[str, Analyzer]:
    """Every registered analyzer, importing the analyzer modules first."""
    import clusterctl.diagnose.analyzers  # noqa: F401  (registers on import)

    return dict(_REGISTRY)


def run_analyzers(ctx: AnalysisContext, only: Iterable[str] | None = None) -> list[Finding]:
    """Run the analyzers whose name or prefix (``gpu`` selects ``gpu.*``) is in ``only``."""
    wanted = list(only) if only is not None else None
    out: list[Finding] = []
    for name, fn in sorted(registered().items()):
        if wanted is not None and not any(name == w or name.startswith(w + ".") for w in wanted):
            continue
        try:
            out.extend(name_gpus(ctx, fn(ctx)))
        except Exception as e:  # noqa: BLE001 - one broken check must not hide the others
            out.append(
                Finding(
                    name,
                    Severity.UNKNOWN,
                    None,
                    "check",
                    f"the {name} check failed: {type(e).__name__}: {e}",
                    "report this as a clusterctl bug, with the bundle",
                )
            )
    return out
