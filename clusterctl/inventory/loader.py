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
import difflib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clusterctl.errors import InventoryError, Problem, SelectionError
from clusterctl.inventory import sshconfig
from clusterctl.inventory.checks import check_instances, check_templates
from clusterctl.inventory.fields import NAME, Ctx
from clusterctl.inventory.model import (
    Engine, FabricProfile, GpuRef, GpuSpec, Host, Instance, InstanceTemplate, Inventory,
    Location, Model, ModelArch, NicSpec, SSHSettings,
)
from clusterctl.inventory.nodeset import NodeSetError, expand, fold
from clusterctl.inventory.yamlnodes import Y, parse

SCHEMA_VERSION = 1
TOP_KEYS = ("version", "defaults", "fabric", "groups", "hosts", "engines", "models",
            "instances", "templates")
SSH_KEYS = ("user", "port", "identity_file", "proxy_jump", "known_hosts", "host_key_policy",
            "become", "become_method", "connect_timeout")
LAYER_KEYS = ("ssh", "vars", "labels", "gpus", "nics")
GPU_KEYS = ("count", "model", "memory_gib", "interconnect")
NIC_KEYS = ("netdev", "role", "rdma_device", "port", "speed_gbps", "address")
ARCH_KEYS = ("layers", "hidden_size", "attention_heads", "kv_heads", "head_dim", "vocab",
             "params", "dtype", "quantization")
RESERVED_GROUPS = ("all", "failed")
DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")


@dataclass
class Layer:
    """One level of settings (defaults, a group or a host entry), unmerged."""

    ssh: SSHSettings = field(default_factory=SSHSettings)
    vars: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    gpus: dict[str, Any] = field(default_factory=dict)
    nics: list[NicSpec] | None = None


_GroupEntry = tuple[str, Layer, list[tuple[str, int]], int]


def load_inventory(path: str | os.PathLike[str], force: bool = False) -> Inventory:
    """Read and validate the inventory at ``path``.

    Raises :class:`InventoryError` (every problem, ``file:line: message``),
    also for a file that cannot be read.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise InventoryError([Problem(str(p), 0, f"cannot read the inventory: {reason}")]) from None
    return load_inventory_text(text, str(p), force=force)


def load_inventory_text(text: str, filename: str = "<string>", force: bool = False) -> Inventory:
    """Parse and validate inventory YAML ``text``; ``filename`` is used in messages.

    Relative paths (identity files, known_hosts) are resolved against the
    directory of ``filename``.
    """
    return _Loader(filename).load(text, force)


class _Loader:
    def __init__(self, filename: str):
        self.ctx = Ctx(filename)
        self.base_dir = Path(filename).resolve().parent if not filename.startswith("<") else Path.cwd()
        self.use_ssh_config = True
        # host name -> extra groups named in its own entry (``groups: [...]``), with lines
        self._extra_groups: dict[str, list[tuple[str, int]]] = {}

    # ------------------------------------------------------------------ top

    def load(self, text: str, force: bool) -> Inventory:
        ctx = self.ctx
        root = parse(text, ctx.filename, ctx.problems)
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
            ctx.error(version.line, f"version: this clusterctl reads schema {SCHEMA_VERSION}, "
                                    f"not {version.value}")
        defaults = self._layer(top.get("defaults"), "defaults", allow_use_ssh_config=True)
        if "fabric" in top:
            inv.fabric = self._fabric(top["fabric"])
        host_entries = self._host_entries(top.get("hosts"))
        groups = self._groups(top.get("groups"))
        self._resolve_hosts(inv, defaults, groups, host_entries)
        inv.engines = self._engines(top.get("engines"))
        inv.models = self._models(top.get("models"))
        inv.instances = self._instances(top.get("instances"), inv)
        inv.templates = self._templates(top.get("templates"), inv)
        check_instances(ctx, inv)
        check_templates(ctx, inv)

    # --------------------------------------------------------------- layers

    def _layer(self, y: Y | None, what: str, extra: tuple[str, ...] = (),
               allow_use_ssh_config: bool = False) -> Layer:
        """Read the keys shared by defaults, groups and hosts."""
        layer = Layer()
        m = self.ctx.mapping(y, what)
        if m is None:
            return layer
        assert y is not None
        known = self.ctx.keys(y, LAYER_KEYS + extra, what)
        if "ssh" in known:
            layer.ssh = self._ssh(known["ssh"], f"{what}.ssh", allow_use_ssh_config)
        if "vars" in known:
            vm = self.ctx.mapping(known["vars"], f"{what}.vars")
            if vm is not None:
                layer.vars = {k: v.plain() for k, v in vm.items()}
        if "labels" in known:
            layer.labels = self._labels(known["labels"], f"{what}.labels")
        if "gpus" in known:
            layer.gpus = self._gpus(known["gpus"], f"{what}.gpus")
        if "nics" in known:
            layer.nics = self._nics(known["nics"], f"{what}.nics")
        return layer

    def _ssh(self, y: Y, what: str, allow_use_ssh_config: bool) -> SSHSettings:
        ctx = self.ctx
        s = SSHSettings()
        if ctx.mapping(y, what) is None:
            return s
        allowed = SSH_KEYS + (("use_ssh_config",) if allow_use_ssh_config else ())
        known = ctx.keys(y, allowed, what)
        for key, v in known.items():
            w = f"{what}.{key}"
            if key in ("user", "proxy_jump", "become_method"):
                setattr(s, key, ctx.string(v, w))
            elif key in ("identity_file", "known_hosts"):
                path = ctx.string(v, w)
                setattr(s, key, self._path(path) if path else None)
            elif key == "port":
                s.port = ctx.integer(v, w, 1, 65535)
            elif key == "host_key_policy":
                s.host_key_policy = ctx.string(v, w, ("accept-new", "strict", "off"))  # type: ignore[assignment]
            elif key == "become":
                s.become = ctx.boolean(v, w)
            elif key == "connect_timeout":
                s.connect_timeout = ctx.number(v, w, positive=True)
            elif key == "use_ssh_config":
                flag = ctx.boolean(v, w)
                if flag is not None:
                    self.use_ssh_config = flag
        if y.kind == "map" and "use_ssh_config" in y.value and not allow_use_ssh_config:
            ctx.error(y.key_lines["use_ssh_config"], f"{what}: use_ssh_config is only allowed in defaults.ssh")
        return s

    def _path(self, value: str) -> str:
        p = Path(os.path.expanduser(value))
        return str(p if p.is_absolute() else self.base_dir / p)

    def _labels(self, y: Y, what: str) -> dict[str, str]:
        ctx = self.ctx
        m = ctx.mapping(y, what)
        out: dict[str, str] = {}
        for key, v in (m or {}).items():
            line = y.key_lines[key]
            if not NAME.match(key):
                ctx.error(line, f"{what}: label name {key!r} may hold only letters, digits, '_', '.', '-'")
                continue
            if v.kind != "scalar" or v.value is None or isinstance(v.value, bool):
                ctx.error(v.line, f"{what}.{key}: a label value must be a string or number")
                continue
            out[key] = str(v.value)
        return out

    def _gpus(self, y: Y, what: str) -> dict[str, Any]:
        ctx = self.ctx
        out: dict[str, Any] = {}
        if ctx.mapping(y, what) is None:
            return out
        for key, v in ctx.keys(y, GPU_KEYS, what).items():
            w = f"{what}.{key}"
            if key == "count":
                val: Any = ctx.integer(v, w, 0, 1024)
            elif key == "model":
                val = ctx.string(v, w)
            elif key == "memory_gib":
                val = ctx.number(v, w, positive=True)
            else:
                val = ctx.string(v, w, ("nvlink", "pcie"))
            if val is not None:
                out[key] = val
        return out

    def _nics(self, y: Y, what: str) -> list[NicSpec] | None:
        ctx = self.ctx
        if y.kind != "seq":
            ctx.error(y.line, f"{what}: expected a list of NICs")
            return None
        nics = []
        seen: dict[str, int] = {}
        for i, item in enumerate(y.value):
            w = f"{what}[{i}]"
            if ctx.mapping(item, w) is None:
                continue
            known = ctx.keys(item, NIC_KEYS, w)
            if "netdev" not in known:
                ctx.error(item.line, f"{w}: missing 'netdev' (the interface name, e.g. eth0)")
                continue
            netdev = ctx.string(known["netdev"], f"{w}.netdev")
            if netdev is None:
                continue
            if netdev in seen:
                ctx.error(item.line, f"{w}: netdev {netdev!r} listed twice (first at line {seen[netdev]})")
            seen[netdev] = item.line
            nic = NicSpec(netdev=netdev)
            if "role" in known:
                nic.role = ctx.string(known["role"], f"{w}.role", ("management", "data", "storage")) or "data"  # type: ignore[assignment]
            if "rdma_device" in known:
                nic.rdma_device = ctx.string(known["rdma_device"], f"{w}.rdma_device")
            if "port" in known:
                nic.port = ctx.integer(known["port"], f"{w}.port", 1, 255) or 1
            if "speed_gbps" in known:
                nic.speed_gbps = ctx.number(known["speed_gbps"], f"{w}.speed_gbps", positive=True)
            if "address" in known:
                addr = ctx.string(known["address"], f"{w}.address")
                if addr is not None and ctx.address(addr.split("/")[0], known["address"].line, f"{w}.address"):
                    nic.address = addr
            nics.append(nic)
        return nics

    # ------------------------------------------------------------ sections

    def _fabric(self, y: Y) -> FabricProfile:
        ctx = self.ctx
        f = FabricProfile()
        if ctx.mapping(y, "fabric") is None:
            return f
        ranges = {"pfc_priority": (0, 7), "roce_dscp": (0, 63), "cnp_dscp": (0, 63), "mtu": (576, 9216)}
        for key, v in ctx.keys(y, ("kind", "trust", "pfc_priority", "roce_dscp", "cnp_dscp", "mtu"),
                               "fabric").items():
            w = f"fabric.{key}"
            if key == "kind":
                f.kind = ctx.string(v, w, ("roce", "ib", "ethernet")) or f.kind  # type: ignore[assignment]
            elif key == "trust":
                f.trust = ctx.string(v, w, ("dscp", "pcp")) or f.trust  # type: ignore[assignment]
            else:
                val = ctx.integer(v, w, *ranges[key])
                if val is not None:
                    setattr(f, key, val)
        return f

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
            layer = self._layer(entry, f"hosts.{key}", extra=("address", "groups"))
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
            ctx.error(y.line, f"hosts.{key}.address: {value!r} gives {len(addrs)} address(es) "
                              f"for {len(names)} host(s); a range must have the same length as the names")
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
            layer = self._layer(gy, f"groups.{name}", extra=("hosts", "description"))
            members: list[tuple[str, int]] = []
            gm = gy.value if gy.kind == "map" else {}
            if "hosts" in gm:
                members = ctx.string_list(gm["hosts"], f"groups.{name}.hosts") or []
            if "description" in gm:
                ctx.string(gm["description"], f"groups.{name}.description")
            out.append((name, layer, members, line))
        return out

    def _resolve_hosts(self, inv: Inventory, defaults: Layer,
                       groups: list[_GroupEntry],
                       entries: dict[str, tuple[Layer, int, str | None]]) -> None:
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
        for member, extra in self._extra_groups.items():
            for gname, gline in extra:
                if gname not in members:
                    ctx.error(gline, f"hosts: group {gname!r} of host {member} is not defined in 'groups'"
                              + _suggest(gname, group_names))
                elif member not in members[gname]:
                    members[gname].append(member)
        layers = {g[0]: g[1] for g in groups}
        member_sets = {g: set(members.get(g, [])) for g in group_names}
        explicit: set[str] = set()
        for hname, (hlayer, line, addr) in entries.items():
            in_groups = [g for g in group_names if hname in member_sets[g]]
            stack = [defaults] + [layers[g] for g in in_groups] + [hlayer]
            host = Host(name=hname, address=addr or hname, groups=tuple(in_groups),
                        location=Location(ctx.filename, line))
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
        if self.use_ssh_config:
            sshconfig.apply_ssh_config(list(inv.hosts.values()), explicit, sshconfig.config_file(),
                                       inv.warnings)
        for host in inv.hosts.values():
            s = host.ssh
            s.port = s.port or 22
            s.host_key_policy = s.host_key_policy or "accept-new"
            s.become = bool(s.become)
            if s.become and not s.become_method:
                s.become_method = "sudo"

    def _engines(self, y: Y | None) -> dict[str, Engine]:
        ctx = self.ctx
        out: dict[str, Engine] = {}
        for name, ey, line in self._named(y, "engines"):
            known = ctx.keys(ey, ("path", "version"), f"engines.{name}")
            vals = {}
            for key in ("path", "version"):
                if key not in known:
                    ctx.error(ey.line if ey.kind == "map" else line, f"engines.{name}: missing '{key}'")
                else:
                    vals[key] = ctx.string(known[key], f"engines.{name}.{key}")
            # Registered even when invalid, so references to it do not cascade.
            out[name] = Engine(name, vals.get("path") or "", vals.get("version") or "",
                               Location(ctx.filename, line))
        return out

    def _models(self, y: Y | None) -> dict[str, Model]:
        ctx = self.ctx
        out: dict[str, Model] = {}
        for name, my, line in self._named(y, "models"):
            w = f"models.{name}"
            known = ctx.keys(my, ("path", "source", "version", "served_name", "arch"), w)
            model = Model(name=name, path="", location=Location(ctx.filename, line))
            if "path" not in known:
                ctx.error(line, f"{w}: missing 'path' (where vLLM reads the model on the node)")
            for key in ("path", "source", "version", "served_name"):
                if key in known:
                    setattr(model, key, ctx.string(known[key], f"{w}.{key}") or "")
            if "arch" in known:
                model.arch = self._arch(known["arch"], f"{w}.arch")
            out[name] = model
        return out

    def _arch(self, y: Y, what: str) -> ModelArch:
        ctx = self.ctx
        arch = ModelArch()
        if ctx.mapping(y, what) is None:
            return arch
        for key, v in ctx.keys(y, ARCH_KEYS, what).items():
            w = f"{what}.{key}"
            if key == "params":
                val: Any = ctx.number(v, w, positive=True)
            elif key == "dtype":
                val = ctx.string(v, w, DTYPES)
            elif key == "quantization":
                val = None if v.value is None else ctx.string(v, w)
            else:
                val = ctx.integer(v, w, 1)
            if val is not None:
                setattr(arch, key, val)
        if arch.attention_heads and arch.kv_heads and arch.attention_heads % arch.kv_heads:
            ctx.error(y.line, f"{what}: attention_heads ({arch.attention_heads}) must be a multiple "
                              f"of kv_heads ({arch.kv_heads})")
        return arch

    def _named(self, y: Y | None, what: str) -> list[tuple[str, Y, int]]:
        """The entries of a name -> mapping section, with valid names only."""
        ctx = self.ctx
        m = ctx.mapping(y, what)
        out = []
        for name, v in (m or {}).items():
            assert y is not None
            line = y.key_lines[name]
            if not NAME.match(name):
                ctx.error(line, f"{what}: {name!r} may hold only letters, digits, '_', '.', '-'")
                continue
            if ctx.mapping(v, f"{what}.{name}") is None:
                continue
            if v.kind != "map":
                v = Y({}, line, "map")
            out.append((name, v, line))
        return out

    def _instances(self, y: Y | None, inv: Inventory) -> dict[str, Instance]:
        ctx = self.ctx
        out: dict[str, Instance] = {}
        keys = ("model", "engine", "placement", "port", "tp", "args", "env", "role")
        for name, iy, line in self._named(y, "instances"):
            w = f"instances.{name}"
            known = ctx.keys(iy, keys, w)
            common = self._run_settings(known, w, line, inv)
            if "placement" not in known:
                ctx.error(line, f"{w}: missing 'placement' (the TP group, e.g. [gpu01:0, gpu01:1])")
                continue
            placement = self._placement(known["placement"], w, inv)
            if "port" not in known:
                ctx.error(line, f"{w}: missing 'port'")
                continue
            port = ctx.integer(known["port"], f"{w}.port", 1, 65535)
            if placement is None or port is None:
                continue
            if "tp" in known:
                tp = ctx.integer(known["tp"], f"{w}.tp", 1)
                if tp is not None and tp != len(placement):
                    ctx.error(known["tp"].line, f"{w}: tp is {tp} but placement lists {len(placement)} GPU(s)")
            out[name] = Instance(name=name, placement=placement, port=port,
                                 location=Location(ctx.filename, line), **common)
        return out

    def _run_settings(self, known: dict[str, Y], w: str, line: int,
                      inv: Inventory) -> dict[str, Any]:
        """model, engine, args, env and role, shared by instances and templates."""
        ctx = self.ctx
        out: dict[str, Any] = {}
        for key, table in (("model", inv.models), ("engine", inv.engines)):
            out[key] = ""
            if key not in known:
                ctx.error(line, f"{w}: missing '{key}'")
                continue
            ref = ctx.string(known[key], f"{w}.{key}")
            if ref is not None and ref not in table:
                ctx.error(known[key].line, f"{w}: {key} {ref!r} is not defined in '{key}s'"
                          + _suggest(ref, list(table)))
            out[key] = ref or ""
        out["args"] = {}
        if "args" in known:
            am = ctx.mapping(known["args"], f"{w}.args")
            for k, v in (am or {}).items():
                flag = k[2:] if k.startswith("--") else k
                if flag in ("port", "tensor-parallel-size", "tp", "model"):
                    ctx.error(known["args"].key_lines[k], f"{w}.args: {k!r} is set by clusterctl "
                              "from port/placement/model; remove it")
                    continue
                if v.kind == "map":
                    ctx.error(v.line, f"{w}.args.{k}: expected a value or a list, not a mapping")
                    continue
                out["args"][flag] = v.plain()
        out["env"] = {}
        if "env" in known:
            em = ctx.mapping(known["env"], f"{w}.env")
            for k, v in (em or {}).items():
                if v.kind != "scalar" or not isinstance(v.value, str):
                    ctx.error(v.line, f"{w}.env.{k}: environment values must be strings; quote it "
                              f"({k}: \"{v.plain()}\")" if v.kind == "scalar" else
                              f"{w}.env.{k}: environment values must be strings")
                    continue
                out["env"][k] = v.value
        if "role" in known:
            role = ctx.string(known["role"], f"{w}.role", ("mixed", "prefill", "decode"))
            if role is not None:
                out["role"] = role
        return out

    def _placement(self, y: Y, w: str, inv: Inventory) -> tuple[GpuRef, ...] | None:
        ctx = self.ctx
        items = ctx.string_list(y, f"{w}.placement")
        if items is None:
            return None
        refs: list[GpuRef] = []
        seen: set[GpuRef] = set()
        ok = True
        for text, line in items:
            try:
                pairs = expand(text, sort=False)
            except NodeSetError as e:
                ctx.error(line, f"{w}.placement: {e}")
                ok = False
                continue
            for pair in pairs:
                host, sep, idx = pair.rpartition(":")
                if not sep or not idx.isdigit():
                    ctx.error(line, f"{w}.placement: {pair!r} is not host:GPU (e.g. gpu01:0)")
                    ok = False
                    continue
                if host not in inv.hosts:
                    ctx.error(line, f"{w}.placement: host {host!r} is not defined in 'hosts'"
                              + _suggest(host, list(inv.hosts)))
                    ok = False
                    continue
                ref = GpuRef(host, int(idx))
                count = inv.hosts[host].gpus.count
                if ref.index >= count:
                    have = f"GPUs 0-{count - 1}" if count else "no GPUs"
                    ctx.error(line, f"{w}.placement: {ref} does not exist ({host} has {have})")
                    ok = False
                    continue
                if ref in seen:
                    ctx.error(line, f"{w}.placement: {ref} is listed twice")
                    ok = False
                    continue
                seen.add(ref)
                refs.append(ref)
        if ok and not refs:
            ctx.error(y.line, f"{w}.placement: no GPUs listed")
            return None
        return tuple(refs) if ok else None

    def _templates(self, y: Y | None, inv: Inventory) -> dict[str, InstanceTemplate]:
        ctx = self.ctx
        out: dict[str, InstanceTemplate] = {}
        keys = ("model", "engine", "replicas", "tp", "hosts", "port_base", "args", "env", "role")
        from clusterctl.inventory.select import select_hosts
        for name, ty, line in self._named(y, "templates"):
            w = f"templates.{name}"
            known = ctx.keys(ty, keys, w)
            common = self._run_settings(known, w, line, inv)
            vals: dict[str, Any] = {}
            for key, lo in (("replicas", 1), ("tp", 1), ("port_base", 1)):
                if key in known:
                    vals[key] = ctx.integer(known[key], f"{w}.{key}", lo, 65535)
                elif key != "port_base":
                    ctx.error(line, f"{w}: missing '{key}'")
            if "hosts" not in known:
                ctx.error(line, f"{w}: missing 'hosts' (a host pattern, e.g. @rack1)")
                continue
            pattern = ctx.string(known["hosts"], f"{w}.hosts")
            if pattern is None:
                continue
            try:
                if not select_hosts(inv, pattern):
                    ctx.error(known["hosts"].line, f"{w}.hosts: {pattern!r} matches no host")
                    continue
            except SelectionError as e:
                ctx.error(known["hosts"].line, f"{w}.hosts: {e}")
                continue
            if None in vals.values() or "replicas" not in vals or "tp" not in vals:
                continue
            out[name] = InstanceTemplate(name=name, hosts=pattern, location=Location(ctx.filename, line),
                                         **vals, **common)
        return out


def _suggest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _forceable(p: Problem) -> Problem:
    if p.severity != "warning":
        return p
    return Problem(p.file, p.line, p.message + " (use --force to accept)", "warning")
