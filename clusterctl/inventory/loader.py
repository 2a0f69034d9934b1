"""Reading an inventory file into a validated :class:`~clusterctl.inventory.model.Inventory`.

The schema is documented in ``docs/inventory.md``.  Loading never stops at
the first problem: every problem found is collected with its ``file:line``
and raised together as one :class:`~clusterctl.errors.InventoryError`.
Problems of severity ``warning`` (TP > 2 on a PCIe-only host) are accepted
with ``force=True`` and then listed in ``Inventory.warnings``.

Precedence: ``defaults`` < each group the host is in, in the order the groups
are defined < the host's own entry.  ``ssh``, ``gpus``, ``labels`` and
``vars`` merge key by key; ``nics`` is replaced as a whole.
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from clusterctl.errors import InventoryError, Problem
from clusterctl.inventory import sshconfig
from clusterctl.inventory.checks import check_instances, check_templates
from clusterctl.inventory.fields import NAME, Ctx, suggest
from clusterctl.inventory.files import ReadRefused, read_config_text
from clusterctl.inventory.gateway import GatewayReader
from clusterctl.inventory.pdpools import PdPoolReader
from clusterctl.inventory.model import GpuSpec, Host, Inventory, Location
from clusterctl.inventory.nodeset import NodeSetError, expand, fold
from clusterctl.inventory.settings import Layer, SettingsReader
from clusterctl.inventory.workloads import WorkloadReader
from clusterctl.inventory.yamlnodes import Y, parse
from clusterctl.clusterstate import NAME as CLUSTER_NAME

SCHEMA_VERSION = 1
TOP_KEYS = (
    "version",
    "cluster",
    "defaults",
    "fabric",
    "groups",
    "hosts",
    "engines",
    "models",
    "instances",
    "templates",
    "gateway",
    "pd_pools",
)
RESERVED_GROUPS = ("all", "failed")


_GroupEntry = tuple[str, Layer, list[tuple[str, int]], int]


def load_inventory(path: str | os.PathLike[str], force: bool = False) -> Inventory:
    """Read and validate the inventory at ``path``.

    Raises :class:`InventoryError` (every problem, ``file:line: message``),
    also for a file that cannot be read.
    """
    p = Path(path)
    try:
        text = read_config_text(p)
    except ReadRefused as e:
        raise InventoryError([Problem(str(p), 0, f"cannot read the inventory: {e}")]) from None
    return load_inventory_text(text, str(p), force=force)


def load_inventory_text(text: str, filename: str = "<string>", force: bool = False) -> Inventory:
    """Parse and validate inventory YAML ``text``; ``filename`` is used in messages.

    Relative paths (identity files, known_hosts) are resolved against the
    directory of ``filename``.
    """
    return _Loader(filename).load(text, force)


class _Loader:
    """One load of one file: readers share the problem list of ``ctx``."""

    def __init__(self, filename: str):
        self.ctx = Ctx(filename)
        self.base_dir = Path(filename).resolve().parent if not filename.startswith("<") else Path.cwd()
        self.settings = SettingsReader(self.ctx, self.base_dir)
        self.workloads = WorkloadReader(self.ctx)
        # host name -> extra groups named in its own entry (``groups: [...]``), with lines
        self._extra_groups: dict[str, list[tuple[str, int]]] = {}

    # ------------------------------------------------------------------ top

    def load(self, text: str, force: bool) -> Inventory:
        ctx = self.ctx
        root = parse(text, ctx.filename, ctx.problems, text_only=True)
        inv = Inventory(path=ctx.filename)
        if root is not None:
            top = ctx.mapping(root, "inventory")
            if top is not None:
                self._document(root, inv)
        errors = [p for p in ctx.problems if p.severity == "error"]
        warnings = [p for p in ctx.problems if p.severity == "warning"]
        if errors or (warnings and not force):
            problems = sorted(ctx.problems, key=lambda p: p.line)
            if warnings and not force:
                problems = [_forceable(p) for p in problems]
            raise InventoryError(problems)
        inv.warnings.extend(str(p) for p in warnings)
        return inv

    def _document(self, root: Y, inv: Inventory) -> None:
        ctx = self.ctx
        top = ctx.keys(root, TOP_KEYS, "inventory")
        version = top.get("version")
        if version is None:
            ctx.error(root.line, f"missing 'version: {SCHEMA_VERSION}' (the schema version)")
        elif ctx.integer(version, "version") not in (None, SCHEMA_VERSION):
            ctx.error(version.line, f"version: this clusterctl reads schema {SCHEMA_VERSION}, not {version.value}")
        if "cluster" in top:
            inv.cluster = self._cluster(top["cluster"])
        defaults = self.settings.layer(top.get("defaults"), "defaults", allow_use_ssh_config=True)
        if "fabric" in top:
            inv.fabric = self.settings.fabric(top["fabric"])
        host_entries = self._host_entries(top.get("hosts"))
        groups = self._groups(top.get("groups"))
        self._resolve_hosts(inv, defaults, groups, host_entries)
        inv.engines = self.workloads.engines(top.get("engines"))
        inv.models = self.workloads.models(top.get("models"))
        inv.instances = self.workloads.instances(top.get("instances"), inv)
        inv.templates = self.workloads.templates(top.get("templates"), inv)
        check_instances(ctx, inv)
        check_templates(ctx, inv)
        inv.gateway = GatewayReader(ctx).gateway(top.get("gateway"), inv)
        inv.pd_pools = PdPoolReader(ctx).pools(top.get("pd_pools"), inv)

    def _cluster(self, y: Y) -> str:
        """``cluster:``: the name the state is kept under (clusterctl.clusterstate)."""
        name = self.ctx.string(y, "cluster")
        if name is None:
            return ""
        if not CLUSTER_NAME.match(name):
            self.ctx.error(
                y.line,
                f"cluster: {name!r} is not a cluster name (letters, digits, '.', '_', '-'; "
                "at most 63; starts with a letter or digit)",
            )
            return ""
        return name

    def _host_entries(self, y: Y | None) -> dict[str, tuple[Layer, int, str | None]]:
        """Expand ``hosts:`` keys; return name -> (layer, line, explicit address)."""
        ctx = self.ctx
        out: dict[str, tuple[Layer, int, str | None]] = {}
        if y is None:
            return out
        m = ctx.mapping(y, "hosts")
        for key, entry in (m or {}).items():
            line = y.key_lines[key]
            try:
                names = expand(key, sort=False)
            except NodeSetError as e:
                ctx.error(line, f"hosts: {e}")
                continue
            bad = [n for n in names if not NAME.match(n)]
            if bad:
                ctx.error(line, f"hosts: {bad[0]!r} is not a valid host name")
                continue
            layer = self.settings.layer(entry, f"hosts.{key}", extra=("address", "groups"))
            em = entry.value if entry.kind == "map" else {}
            addresses: list[str | None] = [None] * len(names)
            if "address" in em:
                addresses = self._addresses(em["address"], names, key)
            if "groups" in em:
                extra = ctx.string_list(em["groups"], f"hosts.{key}.groups") or []
                for n in names:
                    self._extra_groups[n] = extra
            for name, addr in zip(names, addresses):
                if name in out:
                    ctx.error(line, f"host {name} is defined twice (first at line {out[name][1]})")
                    continue
                out[name] = (layer, line, addr)
        return out

    def _addresses(self, y: Y, names: list[str], key: str) -> list[str | None]:
        ctx = self.ctx
        none: list[str | None] = [None] * len(names)
        value = ctx.string(y, f"hosts.{key}.address")
        if value is None:
            return none
        try:
            addrs = expand(value, sort=False)
        except NodeSetError as e:
            ctx.error(y.line, f"hosts.{key}.address: {e}")
            return none
        if len(addrs) != len(names):
            ctx.error(
                y.line,
                f"hosts.{key}.address: {value!r} gives {len(addrs)} address(es) "
                f"for {len(names)} host(s); a range must have the same length as the names",
            )
            return none
        if not all(ctx.address(a, y.line, f"hosts.{key}.address") for a in addrs):
            return none
        return list(addrs)

    def _groups(self, y: Y | None) -> list[_GroupEntry]:
        """Read ``groups:``; return (name, layer, member patterns with lines, line) in file order."""
        ctx = self.ctx
        out: list[_GroupEntry] = []
        if y is None:
            return out
        m = ctx.mapping(y, "groups")
        for name, gy in (m or {}).items():
            line = y.key_lines[name]
            if name in RESERVED_GROUPS:
                ctx.error(line, f"groups: {name!r} is reserved (it selects hosts by itself)")
                continue
            if not NAME.match(name):
                ctx.error(line, f"groups: {name!r} may hold only letters, digits, '_', '.', '-'")
                continue
            layer = self.settings.layer(gy, f"groups.{name}", extra=("hosts", "description"))
            members: list[tuple[str, int]] = []
            gm = gy.value if gy.kind == "map" else {}
            if "hosts" in gm:
                members = ctx.string_list(gm["hosts"], f"groups.{name}.hosts") or []
            if "description" in gm:
                ctx.string(gm["description"], f"groups.{name}.description")
            out.append((name, layer, members, line))
        return out

    def _resolve_hosts(
        self,
        inv: Inventory,
        defaults: Layer,
        groups: list[_GroupEntry],
        entries: dict[str, tuple[Layer, int, str | None]],
    ) -> None:
        ctx = self.ctx
        members: dict[str, list[str]] = {}
        for name, _layer, patterns, _line in groups:
            names: list[str] = []
            seen: set[str] = set()
            for pattern, pline in patterns:
                try:
                    expanded = expand(pattern)
                except NodeSetError as e:
                    ctx.error(pline, f"groups.{name}.hosts: {e}")
                    continue
                unknown = [n for n in expanded if n not in entries]
                if unknown:
                    ctx.error(pline, f"groups.{name}.hosts: {fold(unknown)} not defined in 'hosts'")
                for n in expanded:
                    if n in entries and n not in seen:
                        seen.add(n)
                        names.append(n)
            members[name] = names
        group_names = [g[0] for g in groups]
        member_sets = {g: set(members.get(g, [])) for g in group_names}
        for member, extra in self._extra_groups.items():
            for gname, gline in extra:
                if gname not in members:
                    ctx.error(
                        gline,
                        f"hosts: group {gname!r} of host {member} is not defined in 'groups'"
                        + suggest(gname, group_names),
                    )
                elif member not in member_sets[gname]:
                    member_sets[gname].add(member)
                    members[gname].append(member)
        layers = {g[0]: g[1] for g in groups}
        explicit: set[str] = set()
        for hname, (hlayer, line, addr) in entries.items():
            in_groups = [g for g in group_names if hname in member_sets[g]]
            stack = [defaults] + [layers[g] for g in in_groups] + [hlayer]
            host = Host(
                name=hname, address=addr or hname, groups=tuple(in_groups), location=Location(ctx.filename, line)
            )
            gpu: dict[str, Any] = {}
            for layer in stack:
                host.ssh = host.ssh.merged(layer.ssh)
                host.vars.update(copy.deepcopy(layer.vars))
                host.labels.update(layer.labels)
                gpu.update(layer.gpus)
                if layer.nics is not None:
                    host.nics = [replace(n) for n in layer.nics]
            host.gpus = GpuSpec(**gpu)
            if addr:
                explicit.add(hname)
            inv.hosts[hname] = host
        order = {name: i for i, name in enumerate(entries)}
        inv.groups = {g: sorted(members.get(g, []), key=order.__getitem__) for g in group_names}
        if self.settings.use_ssh_config:
            sshconfig.apply_ssh_config(list(inv.hosts.values()), explicit, sshconfig.config_file(), inv.warnings)
        for host in inv.hosts.values():
            s = host.ssh
            s.port = s.port or 22
            s.host_key_policy = s.host_key_policy or "accept-new"
            s.become = bool(s.become)
            if s.become and not s.become_method:
                s.become_method = "sudo"


def _forceable(p: Problem) -> Problem:
    if p.severity != "warning":
        return p
    return Problem(p.file, p.line, p.message + " (use --force to accept)", "warning")
