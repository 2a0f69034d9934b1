"""One host's facts document, checked, and read through the fact groups (schema in ``docs/facts.md``).

:func:`parse_facts` checks the document (JSON, its schema version, the sections every
collector writes) and returns :class:`Facts`.  Its attributes are the typed fact
groups of :mod:`clusterctl.probe.factgroups`, the one typed view of a host's facts
that the analyzers, bring-up and pre-flight share: ``facts.gpus`` is
:class:`~clusterctl.probe.factgroups.GpuSection`, ``facts.nics`` the
:class:`~clusterctl.probe.factgroups.Nic` entries, and so on; any other group is
``facts.group(SomeFact)``.  Each group is parsed on first use.  The document itself
stays in :attr:`Facts.raw`.  Units follow the document: bytes for memory, watts,
degrees Celsius, Mbit/s for NIC speed, Gbit/s for RDMA rate.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any, TypeVar

from clusterctl.errors import ProbeError
from clusterctl.probe.factgroups import (
    SCHEMA,
    FactGroup,
    GpuSection,
    GpusFact,
    HostFact,
    HostInfo,
    KernelLog,
    KernelLogFact,
    Nic,
    NicsFact,
    Unit,
    UnitsFact,
)

__all__ = ["SCHEMA", "Facts", "parse_facts"]

T = TypeVar("T")

#: Sections every collector of :data:`SCHEMA` writes; a document without one is refused.
REQUIRED = ("collected_at", "host", "gpus", "nics")


class Facts:
    """One node's checked facts document; its sections are the fact groups (module doc)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.raw = doc  # the JSON document, as the collector wrote it
        self.schema = int(doc["schema"])
        self.collected_at = str(doc["collected_at"])

    def group(self, group: type[FactGroup[T]]) -> T:
        """Any fact group of this document (parsed anew on each call)."""
        return group.parse(self.raw)

    @cached_property
    def host(self) -> HostInfo:
        return HostFact.parse(self.raw)

    @cached_property
    def gpus(self) -> GpuSection:
        return GpusFact.parse(self.raw)

    @cached_property
    def nics(self) -> tuple[Nic, ...]:
        return NicsFact.parse(self.raw).nics

    @cached_property
    def units(self) -> tuple[Unit, ...] | None:
        """The ``clusterctl-*`` units; None when systemctl did not answer (the section is null)."""
        units = UnitsFact.parse(self.raw)
        return units.units if units.read else None

    @cached_property
    def kernel_log(self) -> KernelLog:
        return KernelLogFact.parse(self.raw)

    @cached_property
    def errors(self) -> list[dict[str, str]]:
        """What the probe could not read: ``{source, reason}`` entries."""
        return [{str(k): str(v) for k, v in e.items()} for e in self.raw.get("errors") or [] if isinstance(e, dict)]

    @property
    def hostname(self) -> str | None:
        return self.host.hostname

    @property
    def boot_id(self) -> str | None:
        return self.host.boot_id


def parse_facts(doc: str | bytes | dict[str, Any], *, origin: str = "probe output") -> Facts:
    """Check one facts document (JSON text or an already parsed dict) and wrap it.

    Raises :class:`ProbeError` naming ``origin`` when the text is not JSON, has
    no ``schema``, comes from a newer collector (schema > :data:`SCHEMA`) or
    lacks a section of :data:`REQUIRED` (or ``gpus.available``), or holds an
    entry the groups would drop (:func:`_malformed`).  Inside the entries the
    groups read leniently: a field of the wrong type reads as not known (docs
    of :mod:`clusterctl.probe.factgroups`).
    """
    if isinstance(doc, (str, bytes)):
        try:
            doc = json.loads(doc)
        except ValueError as e:
            raise ProbeError(f"{origin}: not a JSON document ({e})") from None
    if not isinstance(doc, dict):
        raise ProbeError(f"{origin}: expected a JSON object, got {type(doc).__name__}")
    schema = doc.get("schema")
    if not isinstance(schema, int):
        raise ProbeError(f"{origin}: no schema version (not a clusterctl facts document)")
    if schema > SCHEMA:
        raise ProbeError(
            f"{origin}: facts schema {schema} is newer than this clusterctl understands ({SCHEMA}); upgrade clusterctl"
        )
    missing = [k for k in REQUIRED if k not in doc]
    gpus = doc.get("gpus")
    if not missing and not (isinstance(gpus, dict) and "available" in gpus):
        missing = ["gpus.available"]
    if not isinstance(doc.get("nics", []), list):
        raise ProbeError(f"{origin}: malformed facts document (schema {schema}): nics is not a list")
    if missing:
        raise ProbeError(f"{origin}: malformed facts document (schema {schema}): KeyError: {missing[0]!r}")
    bad = _malformed(doc)
    if bad:
        raise ProbeError(f"{origin}: malformed facts document (schema {schema}): {bad}")
    return Facts(doc)


def _malformed(doc: dict[str, Any]) -> str | None:
    """The first entry a collector never writes that the typed view would have to drop:
    a GPU without an integer index (or one of its processes without a pid), a NIC or
    unit that is not an object, a unit without a name.  None when there is none."""
    devices, units = doc["gpus"].get("devices") or [], doc.get("units")
    if not isinstance(devices, list):
        return "gpus.devices is not a list"
    if units is not None and not isinstance(units, list):
        return "units is not a list"
    for i, d in enumerate(devices):
        if not isinstance(d, dict) or not isinstance(d.get("index"), int):
            return f"gpus.devices[{i}] has no integer index"
        for j, p in enumerate(d.get("processes") or []):
            if not isinstance(p, dict) or not isinstance(p.get("pid"), int):
                return f"gpus.devices[{i}].processes[{j}] has no integer pid"
    for i, n in enumerate(doc["nics"]):
        if not isinstance(n, dict):
            return f"nics[{i}] is not an object"
    for i, u in enumerate(units or []):
        if not isinstance(u, dict) or not isinstance(u.get("unit"), str):
            return f"units[{i}] has no unit name"
    return None
