"""Host selection patterns: which hosts a command acts on.

Grammar (spaces around operators are ignored)::

    pattern := item ("," item)*          union of the positive items,
    item    := ["!"] term                then minus every "!" item
    term    := atom ("&" atom)*          intersection
    atom    := ["!"] base                "!" inside a term: every host but base
    base    := "all" | "*" | "@group" | "@failed" | label=value
             | node set (gpu[01-04]) | glob (gpu0*)

A pattern made only of exclusions starts from ``all`` (``!gpu03`` is every
host but gpu03).  Examples: ``@rack1&@canary``, ``gpu[01-08],!gpu03``,
``rack=r1&!@canary``, ``@failed``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection

from clusterctl.errors import SelectionError
from clusterctl.inventory.model import Host, Inventory
from clusterctl.inventory.nodeset import split_top, expand, fold


def select_hosts(inv: Inventory, pattern: str, failed: Collection[str] | None = None) -> list[Host]:
    """Return the hosts ``pattern`` selects, in inventory order.

    ``failed`` is the set of hosts that failed in the previous run (for
    ``@failed``); ``None`` means no run was recorded, and ``@failed`` is then
    an error.  Unknown hosts, groups or labels raise :class:`SelectionError`
    naming them.  An empty result is not an error.
    """
    if not isinstance(pattern, str) or not pattern.strip():
        raise SelectionError("empty host pattern (use 'all' for every host)")
    items = [i.strip() for i in split_top(pattern)]
    if any(not i for i in items):
        raise SelectionError(f"{pattern!r}: empty item between commas")
    everyone = set(inv.hosts)
    positives = [i for i in items if not i.startswith("!")]
    negatives = [i[1:].strip() for i in items if i.startswith("!")]
    chosen: set[str] = set() if positives else set(everyone)
    for item in positives:
        chosen |= _term(inv, item, failed, pattern)
    for item in negatives:
        chosen -= _term(inv, item, failed, pattern)
    return [h for name, h in inv.hosts.items() if name in chosen]


def _term(inv: Inventory, term: str, failed: Collection[str] | None, pattern: str) -> set[str]:
    result: set[str] | None = None
    for atom in term.split("&"):
        atom = atom.strip()
        negate = atom.startswith("!")
        if negate:
            atom = atom[1:].strip()
        if not atom:
            raise SelectionError(f"{pattern!r}: empty name around '&' or '!'")
        names = _atom(inv, atom, failed)
        if negate:
            names = set(inv.hosts) - names
        result = names if result is None else result & names
    return result or set()


def _atom(inv: Inventory, atom: str, failed: Collection[str] | None) -> set[str]:
    if atom in ("all", "*"):
        return set(inv.hosts)
    if atom == "@failed":
        if failed is None:
            raise SelectionError("@failed: no previous run is recorded, so no host failed yet")
        unknown = set(failed) - set(inv.hosts)
        return set(failed) - unknown
    if atom.startswith("@"):
        group = atom[1:]
        if group == "all":
            return set(inv.hosts)
        if group not in inv.groups:
            known = ", ".join(sorted(inv.groups)) or "none defined"
            raise SelectionError(f"unknown group @{group} (groups: {known})")
        return set(inv.groups[group])
    if "=" in atom:
        key, _, value = atom.partition("=")
        key, value = key.strip(), value.strip()
        values = {h.labels[key] for h in inv.hosts.values() if key in h.labels}
        if not values:
            raise SelectionError(f"no host has a label {key!r}")
        if value not in values:
            raise SelectionError(f"no host has label {key}={value} ({key} values: {', '.join(sorted(values))})")
        return {n for n, h in inv.hosts.items() if h.labels.get(key) == value}
    if any(c in atom for c in "*?") and "[" not in atom:
        names = set(fnmatch.filter(inv.hosts, atom))
        if not names:
            raise SelectionError(f"{atom!r} matches no host")
        return names
    names = set(expand(atom))
    unknown = names - set(inv.hosts)
    if unknown:
        raise SelectionError(f"unknown host(s): {fold(unknown)}")
    return names
