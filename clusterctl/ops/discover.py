"""The workflows of ``inventory discover`` and ``inventory diff``: the hosts' facts (over SSH, or a
saved ``clusterctl facts --json`` file), then an inventory written from them or the places where an
inventory and the hosts disagree (core: :mod:`clusterctl.inventory.discover`).

:func:`discover` takes a :class:`DiscoverRequest` (the hosts as the command line named them, or an
Ansible inventory) and returns a :class:`Discovered` (the YAML text, validated, with its notes);
:func:`diff` takes the loaded inventory and its selected hosts and returns a :class:`Diffed` with
its exit code.  Probe progress goes to ``on_event`` as :class:`ProbeEvent`, warnings to
``on_warning``; bad input is a :class:`~clusterctl.errors.ClusterctlError` naming the option or file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import yaml

from clusterctl.config import UserConfig
from clusterctl.errors import ClusterctlError
from clusterctl.files import write_atomic
from clusterctl.fleet.factory import make_fleet
from clusterctl.fleet.results import HostResult
from clusterctl.inventory.ansible import import_ansible
from clusterctl.inventory.discover import ENGINE_PROBE, Difference, diff as differences, discover as discovered
from clusterctl.inventory.discover import parse_engines
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Host, Inventory
from clusterctl.inventory.nodeset import expand
from clusterctl.ops.doctor import host_row
from clusterctl.probe.run import collect_facts


@dataclass(frozen=True)
class ProbeEvent:
    """``probe-start`` (``count`` hosts), ``host`` (``result``: the host's progress row), ``probe-end``."""

    kind: str
    count: int = 0
    result: Optional[HostResult] = None


OnEvent = Callable[[ProbeEvent], None]


def _ignore(_e: object) -> None:
    pass


@dataclass(frozen=True)
class Probed:
    """The hosts' facts (host -> document), the hosts without facts (host -> why) and the engines
    found (host -> [(path, version)]; None: not searched, as with a facts file)."""

    facts: dict[str, Any]
    missing: dict[str, str]
    engines: Optional[dict[str, Any]] = None


@dataclass(frozen=True)
class Reach:
    """How hosts are reached: the user config and the command line's SSH options (the host-key
    policy already checked; None: each host's own)."""

    cfg: UserConfig
    fanout: Optional[int] = None
    connect_timeout: Optional[float] = None
    host_key_policy: Optional[str] = None


def probe(hosts: Sequence[Host], reach: Reach, on_event: OnEvent = _ignore) -> Probed:
    """The facts of ``hosts`` over SSH (one probe per host, progress as events), then the engine search."""
    fleet = make_fleet(
        list(hosts),
        reach.cfg,
        fanout=reach.fanout,
        connect_timeout=reach.connect_timeout,
        host_key_policy=reach.host_key_policy,
    )
    with fleet:
        on_event(ProbeEvent("probe-start", count=len(hosts)))
        try:
            results = collect_facts(fleet, on_result=lambda r: on_event(ProbeEvent("host", result=host_row(r))))
        finally:
            on_event(ProbeEvent("probe-end"))
        found = fleet.run(ENGINE_PROBE, sudo=False)
    facts = {h: r.facts.raw for h, r in results.items() if r.ok and r.facts is not None}
    missing = {h: str(r.reason) for h, r in results.items() if not (r.ok and r.facts is not None)}
    engines = {r.host: parse_engines(r.stdout) for r in found if r.ok}
    return Probed(facts, missing, engines)


def read_facts(path: str, names: Sequence[str]) -> Probed:
    """The facts of the hosts ``names`` from a file ``clusterctl facts PATTERN --json`` printed; a host
    the file lacks is missing ("not in the facts file")."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise ClusterctlError(f"{path}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise ClusterctlError(f"{path}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ClusterctlError(f"{path}: expected an object of host -> facts (clusterctl facts PATTERN --json)")
    wanted = set(names)
    facts = {h: d for h, d in doc.items() if isinstance(d, dict) and "status" not in d and h in wanted}
    missing = {h: str(d.get("reason")) for h, d in doc.items() if isinstance(d, dict) and "status" in d and h in wanted}
    missing.update({h: "not in the facts file" for h in names if h not in facts and h not in missing})
    return Probed(facts, missing)


@dataclass(frozen=True)
class DiscoverRequest:
    """``inventory discover``: ``hosts`` as given (names, addresses, node sets) with the SSH login
    (``user``, ``port``, ``identity``), or ``ansible`` (an Ansible inventory); ``rack_rule`` a regular
    expression with the named groups rack and/or leaf; ``facts_file`` instead of reaching the hosts."""

    reach: Reach
    hosts: tuple[str, ...] = ()
    ansible: Optional[Path] = None
    user: Optional[str] = None
    port: int = 22
    identity: Optional[str] = None
    rack_rule: Optional[str] = None
    facts_file: Optional[str] = None


@dataclass(frozen=True)
class Discovered:
    """The inventory written from the facts: ``text`` (YAML with the notes as comments, validated),
    ``data`` and ``notes``; ``missing``: hosts not reached (host -> why); ``reached``: hosts with facts."""

    text: str
    data: dict[str, Any]
    notes: list[str]
    missing: dict[str, str]
    reached: int

    @property
    def exit_code(self) -> int:
        """3 when no host gave facts, else 0."""
        return 3 if self.missing and not self.reached else 0


def _rule(text: Optional[str]) -> Optional[re.Pattern[str]]:
    try:
        rule = re.compile(text) if text else None
    except re.error as e:
        raise ClusterctlError(f"--rack-rule {text!r} is not a regular expression: {e}") from None
    if rule is not None and not set(rule.groupindex) & {"rack", "leaf"}:
        raise ClusterctlError("--rack-rule needs a named group rack or leaf, e.g. 'r(?P<rack>\\d+)n'")
    return rule


def _base(request: DiscoverRequest, on_warning: Callable[[str], None]) -> dict[str, Any]:
    """The inventory the hosts start from: the Ansible inventory's, or the named hosts with their SSH login."""
    if request.ansible is not None:
        imported = import_ansible(request.ansible)
        for w in imported.warnings:
            on_warning(w)
        return imported.data
    if not request.hosts:
        raise ClusterctlError("give HOSTS or --ansible FILE")
    names = [n for h in request.hosts for n in expand(h)]
    login = (("user", request.user), ("port", request.port if request.port != 22 else None))
    ssh = {k: v for k, v in login + (("identity_file", request.identity),) if v is not None}
    return {"version": 1, **({"defaults": {"ssh": ssh}} if ssh else {}), "hosts": {n: {"address": n} for n in names}}


def discover(
    request: DiscoverRequest,
    *,
    on_event: OnEvent = _ignore,
    on_warning: Callable[[str], None] = _ignore,
    output: Optional[Path] = None,
) -> Discovered:
    """An inventory from the hosts' facts (``output``: the name its validation errors give)."""
    rule = _rule(request.rack_rule)
    base = _base(request, on_warning)
    inv = load_inventory_text(yaml.safe_dump(base, sort_keys=False), str(request.ansible or "<hosts>"), force=True)
    if request.facts_file:
        got = read_facts(request.facts_file, list(inv.hosts))
    else:
        got = probe(list(inv.hosts.values()), request.reach, on_event)
    result = discovered(got.facts, base, engines=got.engines, rack_rule=rule, missing=got.missing)
    text = (
        "# Written by `clusterctl inventory discover`: review it before use.\n"
        + "".join(f"# - {n}\n" for n in result.notes)
        + yaml.safe_dump(result.data, sort_keys=False, width=110)
    )
    try:
        load_inventory_text(text, str(output or "<output>"), force=True)
    except ClusterctlError as e:
        raise ClusterctlError(f"the discovered inventory does not validate (a bug; please report it):\n{e}") from None
    return Discovered(text, result.data, result.notes, dict(got.missing), len(got.facts))


def save(done: Discovered, output: Path) -> None:
    """Write the discovered inventory to ``output`` atomically."""
    try:
        write_atomic(output, done.text)
    except OSError as e:
        raise ClusterctlError(f"{output}: cannot write: {e.strerror}") from None


@dataclass(frozen=True)
class Diffed:
    """``inventory diff``'s differences over ``hosts`` hosts."""

    differences: list[Difference] = field(default_factory=list)
    hosts: int = 0

    @property
    def exit_code(self) -> int:
        """0 they agree, 1 some difference, 3 only hosts that could not be read."""
        diffs = self.differences
        return 1 if any(d.severity == "WARN" for d in diffs) else 3 if diffs else 0


def diff(
    inventory: Inventory,
    hosts: Sequence[Host],
    reach: Reach,
    *,
    facts_file: Optional[str] = None,
    on_event: OnEvent = _ignore,
) -> Diffed:
    """Where ``inventory`` and the facts of ``hosts`` (over SSH, or from ``facts_file``) disagree."""
    if facts_file:
        got = read_facts(facts_file, [h.name for h in hosts])
    else:
        got = probe(hosts, reach, on_event)
    return Diffed(differences(inventory, got.facts, missing=got.missing, engines=got.engines), len(hosts))
