"""Converting an Ansible inventory (INI or YAML) into a clusterctl inventory.

What is read: groups, ``[group:children]`` / ``children:``, ``[group:vars]`` /
``vars:``, inline host variables, host ranges (``www[01:50]``, strides
``[01:50:2]``, letters ``[a:f]``), ``host:port``, and the ``group_vars/`` and
``host_vars/`` directories next to the file (``NAME``, ``NAME.yml``,
``NAME.yaml``, ``NAME.json`` or a directory ``NAME/`` of such files).

INI values are read as Ansible does: a Python literal when it parses as one
(``80`` is a number, ``[1, 2]`` a list), else a string.

How variables map:

===============================================  ==========================
Ansible                                          clusterctl
===============================================  ==========================
``ansible_host`` (``ansible_ssh_host``)          host ``address``
``ansible_port`` (``ansible_ssh_port``)          ``ssh.port``
``ansible_user`` (``ansible_ssh_user``)          ``ssh.user``
``ansible_ssh_private_key_file``                 ``ssh.identity_file``
``ansible_become`` / ``ansible_become_method``   ``ssh.become`` / ``ssh.become_method``
passwords (``ansible_password``, ...)            dropped, with a warning
anything else                                    ``vars``
===============================================  ==========================

Precedence is kept: Ansible applies group variables from shallow to deep
groups (children override parents; equal depth by ``ansible_group_priority``
then name), so groups are written in that order and clusterctl's
"groups in definition order" reproduces it.  Child groups are flattened: a
group lists every host of its descendants.
"""

from __future__ import annotations

import ast
import re
import shlex
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clusterctl.errors import ConfigError, Problem
from clusterctl.inventory.fields import NAME
from clusterctl.inventory.files import ReadRefused, read_config_text
from clusterctl.inventory.nodeset import MAX_NAMES, fold, natural_key, split_top
from clusterctl.inventory.yamlnodes import MAX_NODES

SSH_VARS = {
    "ansible_port": "port",
    "ansible_ssh_port": "port",
    "ansible_user": "user",
    "ansible_ssh_user": "user",
    "ansible_ssh_private_key_file": "identity_file",
    "ansible_become": "become",
    "ansible_become_method": "become_method",
}
ADDRESS_VARS = ("ansible_host", "ansible_ssh_host")
SECRET_VARS = (
    "ansible_password",
    "ansible_ssh_pass",
    "ansible_ssh_password",
    "ansible_become_password",
    "ansible_become_pass",
    "ansible_sudo_pass",
)
_RANGE = re.compile(r"\[([^\]\[]*?):([^\]\[]*?)(?::([^\]\[]*))?\]")
_TRUE = {"true", "yes", "on", "1", "y"}
_FALSE = {"false", "no", "off", "0", "n"}


@dataclass
class AnsibleImport:
    """The converted inventory as plain data (ready for YAML) and what was dropped."""

    data: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Group:
    name: str
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)


class _Inv:
    """Ansible's model: groups (with ``all``), hosts with their own variables."""

    def __init__(self, filename: str):
        self.filename = filename
        self.groups: dict[str, _Group] = {"all": _Group("all")}
        self.hosts: dict[str, dict[str, Any]] = {}
        self.problems: list[Problem] = []
        self.too_many = False

    def group(self, name: str, line: int = 0) -> _Group:
        if name not in self.groups:
            if not NAME.match(name) or name == "failed":
                self.error(
                    line,
                    f"group name {name!r} cannot be used in clusterctl (letters, digits, '_', '.', '-'; not 'failed')",
                )
            self.groups[name] = _Group(name)
        return self.groups[name]

    def add_host(self, group: str, name: str, hvars: dict[str, Any]) -> None:
        if name not in self.hosts and len(self.hosts) >= MAX_NAMES:
            if not self.too_many:
                self.too_many = True
                self.error(0, f"more than {MAX_NAMES} hosts (the YAML inventory's limit); the rest is not read")
            return
        self.hosts.setdefault(name, {}).update(hvars)
        g = self.group(group)
        if name not in g.hosts:
            g.hosts.append(name)

    def error(self, line: int, message: str) -> None:
        self.problems.append(Problem(self.filename, line, message))


# ------------------------------------------------------------------ ranges


def expand_ansible_range(pattern: str) -> list[str]:
    """Expand Ansible host ranges: ``www[01:50:2].example.com``, ``db-[a:f]``.

    A numeric range whose start has a leading zero is zero-padded to the
    start's width.  Several ranges in one name expand as a product.
    Raises ``ValueError`` for a malformed range, or one that gives more than
    :data:`~clusterctl.inventory.nodeset.MAX_NAMES` names (the YAML
    inventory's limit), counted before anything is expanded.
    """
    total = 1
    for r in _RANGE.finditer(pattern):
        total *= _range_size(r.group(1) or "0", r.group(2), r.group(3))
        if total > MAX_NAMES:
            raise ValueError(f"{pattern!r}: more than {MAX_NAMES} names")
    return _expand(pattern)


def _range_size(beg: str, end: str, step_s: str | None) -> int:
    """How many names ``[beg:end:step]`` gives (1 for what :func:`_expand` will refuse anyway)."""
    try:
        step = max(1, int(step_s)) if step_s else 1
        if beg.isdigit() and end.isdigit():
            return max(1, (int(end) - int(beg)) // step + 1)
    except ValueError:
        return 1
    if len(beg) == 1 and len(end) == 1 and beg in string.ascii_letters and end in string.ascii_letters:
        return max(1, (string.ascii_letters.index(end) - string.ascii_letters.index(beg)) // step + 1)
    return 1


def _expand(pattern: str) -> list[str]:
    m = _RANGE.search(pattern)
    if not m:
        if "[" in pattern or "]" in pattern:
            raise ValueError(f"{pattern!r}: malformed host range (expected [START:END] or [START:END:STEP])")
        return [pattern]
    beg, end, step_s = m.group(1) or "0", m.group(2), m.group(3)
    if not end:
        raise ValueError(f"{pattern!r}: a range needs an end ([START:END])")
    try:
        step = int(step_s) if step_s else 1
    except ValueError:
        raise ValueError(f"{pattern!r}: step {step_s!r} is not a number") from None
    if step < 1:
        raise ValueError(f"{pattern!r}: step must be at least 1")
    if beg.isdigit() and end.isdigit():
        width = len(beg) if beg.startswith("0") and len(beg) > 1 else 0
        if int(end) < int(beg):
            raise ValueError(f"{pattern!r}: range goes backwards")
        items = [str(n).zfill(width) for n in range(int(beg), int(end) + 1, step)]
    elif len(beg) == 1 and len(end) == 1 and beg in string.ascii_letters and end in string.ascii_letters:
        lo, hi = string.ascii_letters.index(beg), string.ascii_letters.index(end)
        if hi < lo:
            raise ValueError(f"{pattern!r}: range goes backwards")
        items = list(string.ascii_letters[lo : hi + 1 : step])
    else:
        raise ValueError(f"{pattern!r}: range [{beg}:{end}] mixes numbers and letters or uses words")
    head, tail = pattern[: m.start()], pattern[m.end() :]
    out = []
    for item in items:
        out.extend(_expand(head + item + tail))
    return out


def _split_port(entry: str) -> tuple[str, int | None]:
    """``host:22`` -> (``host``, 22); IPv6 addresses and bare names pass through."""
    if entry.count(":") == 1:
        host, port = entry.split(":")
        if port.isdigit():
            return host, int(port)
    return entry, None


def _parse_value(text: str) -> Any:
    """An INI value: a Python literal when it is one, else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


# -------------------------------------------------------------------- INI

_SECTION = re.compile(r"^\[([^\]:\s]+)(?::([A-Za-z]+))?\]$")


def _read_ini(text: str, inv: _Inv) -> None:
    group, kind = "ungrouped", "hosts"
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            m = _SECTION.match(re.sub(r"\s*[#;].*$", "", line))
            if not m or (m.group(2) or "hosts") not in ("hosts", "vars", "children"):
                inv.error(lineno, f"bad section header {line!r} (expected [group], [group:vars] or [group:children])")
                group, kind = "", "skip"
                continue
            group, kind = m.group(1), m.group(2) or "hosts"
            inv.group(group, lineno)
            continue
        if kind == "skip":
            continue
        if kind == "vars":
            if "=" not in line:
                inv.error(lineno, f"expected key=value in [{group}:vars], got {line!r}")
                continue
            key, value = (s.strip() for s in line.split("=", 1))
            inv.group(group).vars[key] = _parse_value(value)
        elif kind == "children":
            child = line.split()[0]
            inv.group(child, lineno)
            if child not in inv.group(group).children:
                inv.group(group).children.append(child)
        else:
            _ini_host_line(line, lineno, group, inv)


def _ini_host_line(line: str, lineno: int, group: str, inv: _Inv) -> None:
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as e:
        inv.error(lineno, f"cannot parse host line {line!r}: {e}")
        return
    if not tokens:
        return
    hvars: dict[str, Any] = {}
    for tok in tokens[1:]:
        if "=" not in tok:
            inv.error(lineno, f"expected key=value after the host name, got {tok!r}")
            return
        key, value = tok.split("=", 1)
        hvars[key] = _parse_value(value)
    _add_pattern(tokens[0], hvars, group, inv, lineno)


def _add_pattern(pattern: str, hvars: dict[str, Any], group: str, inv: _Inv, line: int) -> None:
    name, port = _split_port(pattern)
    try:
        names = expand_ansible_range(name)
    except ValueError as e:
        inv.error(line, str(e))
        return
    if port is not None:
        hvars = dict(hvars, ansible_port=hvars.get("ansible_port", port))
    for n in names:
        if not NAME.match(n):
            inv.error(line, f"host name {n!r} cannot be used (letters, digits, '_', '.', '-' only)")
            return
        inv.add_host(group, n, dict(hvars))


# ------------------------------------------------------------------- YAML


def _read_yaml(data: Any, inv: _Inv) -> None:
    if not isinstance(data, dict):
        inv.error(0, "a YAML inventory must be a mapping of group names")
        return
    for name, body in data.items():
        _yaml_group(str(name), body, inv, 0)


def _yaml_group(name: str, body: Any, inv: _Inv, depth: int) -> None:
    if depth > 100:
        inv.error(0, f"group {name}: children nested too deep")
        return
    g = inv.group(name)
    if body is None:
        return
    if not isinstance(body, dict):
        inv.error(0, f"group {name}: expected a mapping with hosts/vars/children")
        return
    for key in body:
        if key not in ("hosts", "vars", "children"):
            inv.error(0, f"group {name}: unknown key {key!r} (expected hosts, vars, children)")
    hosts = body.get("hosts") or {}
    if not isinstance(hosts, dict):
        inv.error(0, f"group {name}: hosts must be a mapping of host names")
        hosts = {}
    for pattern, hvars in hosts.items():
        if hvars is not None and not isinstance(hvars, dict):
            inv.error(0, f"host {pattern}: variables must be a mapping")
            continue
        _add_pattern(str(pattern), dict(hvars or {}), name, inv, 0)
    gvars = body.get("vars") or {}
    if isinstance(gvars, dict):
        g.vars.update(gvars)
    else:
        inv.error(0, f"group {name}: vars must be a mapping")
    children = body.get("children") or {}
    if not isinstance(children, dict):
        inv.error(0, f"group {name}: children must be a mapping of group names")
        children = {}
    for child, cbody in children.items():
        child = str(child)
        if child not in g.children:
            g.children.append(child)
        _yaml_group(child, cbody, inv, depth + 1)


# ----------------------------------------------------- group_vars/host_vars


def _vars_files(directory: Path, name: str) -> list[Path]:
    out = []
    for ext in ("", ".yml", ".yaml", ".json"):
        p = directory / f"{name}{ext}"
        if p.is_file():
            out.append(p)
    d = directory / name
    if d.is_dir():
        out.extend(
            sorted(
                p
                for p in d.rglob("*")
                if p.is_file() and p.suffix in ("", ".yml", ".yaml", ".json") and not p.name.startswith(".")
            )
        )
    return out


def _read_vars_file(path: Path, problems: list[Problem]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(read_config_text(path))
        if _expands_past(data):
            problems.append(Problem(str(path), 0, f"expands to more than {MAX_NODES} values (alias bomb?)"))
            return {}
    except ReadRefused as e:
        problems.append(Problem(str(path), 0, f"cannot read it: {e}"))
        return {}
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        problems.append(Problem(str(path), mark.line + 1 if mark else 0, f"YAML syntax error: {e.problem}"))
        return {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError) as e:
        # ValueError: PyYAML's int/float constructors raise it for scalars like 0b_
        problems.append(Problem(str(path), 0, f"cannot read it: {e}"))
        return {}
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.append(Problem(str(path), 1, "expected a mapping of variables"))
        return {}
    return data


# --------------------------------------------------------------- convert


def import_ansible(path: str | Path) -> AnsibleImport:
    """Read an Ansible inventory file and return the clusterctl inventory data.

    The format is YAML when the file parses as a YAML mapping whose values are
    groups, INI otherwise.  Raises :class:`ConfigError` listing every problem
    (``file:line``) when the file cannot be converted.
    """
    path = Path(path)
    try:
        text = read_config_text(path)
    except ReadRefused as e:
        raise ConfigError([Problem(str(path), 0, f"cannot read it: {e}")]) from None
    inv = _Inv(str(path))
    data = _yaml_inventory(text)
    if data is not None and _expands_past(data):
        raise ConfigError([Problem(str(path), 0, f"expands to more than {MAX_NODES} values (alias bomb?)")])
    if data is not None:
        _read_yaml(data, inv)
    else:
        _read_ini(text, inv)
    for sub in ("group_vars", "host_vars"):
        directory = path.parent / sub
        if not directory.is_dir():
            continue
        names = list(inv.groups) if sub == "group_vars" else list(inv.hosts)
        for name in names:
            for f in _vars_files(directory, name):
                values = _read_vars_file(f, inv.problems)
                if sub == "group_vars":
                    inv.groups[name].vars.update(values)
                else:
                    inv.hosts[name].update(values)
    if inv.problems:
        raise ConfigError(inv.problems)
    return _convert(inv)


def _expands_past(data: Any, limit: int = MAX_NODES) -> bool:
    """True when walking ``data`` as a tree (aliases expanded, as the import does) visits more than ``limit`` values."""
    stack, seen = [data], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _yaml_inventory(text: str) -> dict[str, Any] | None:
    """The YAML data when ``text`` is a YAML inventory, else None (INI)."""
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError):  # ValueError: PyYAML on scalars like 0b_
        return None
    if not isinstance(data, dict) or not data:
        return None
    if all(v is None or (isinstance(v, dict) and set(v) <= {"hosts", "vars", "children"}) for v in data.values()):
        return data
    return None


def _group_order(inv: _Inv) -> list[str]:
    """Groups from shallow to deep, as Ansible applies their variables."""
    parents: dict[str, set[str]] = {g: set() for g in inv.groups}
    for g in inv.groups.values():
        for c in g.children:
            parents[c].add(g.name)
    depth: dict[str, int] = {}

    def depth_of(name: str, seen: frozenset[str]) -> int:
        if name in depth:
            return depth[name]
        if name in seen:  # a cycle: Ansible refuses it; treat as top level
            return 1
        ps = [p for p in parents[name] if p != "all"]
        d = 1 + max((depth_of(p, seen | {name}) for p in ps), default=0)
        depth[name] = d
        return d

    def priority(name: str) -> int:
        value = inv.groups[name].vars.get("ansible_group_priority", 1)
        return value if isinstance(value, int) else 1

    names = [g for g in inv.groups if g != "all"]
    return sorted(names, key=lambda g: (depth_of(g, frozenset()), priority(g), g))


def _members(inv: _Inv, name: str, seen: set[str] | None = None) -> list[str]:
    seen = set() if seen is None else seen
    if name in seen:
        return []
    seen.add(name)
    out = list(inv.groups[name].hosts)
    for c in inv.groups[name].children:
        out.extend(h for h in _members(inv, c, seen) if h not in out)
    return out


def _split_vars(
    values: dict[str, Any], where: str, warnings: list[str], host_level: bool
) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """Split Ansible variables into (ssh settings, other vars, address)."""
    ssh: dict[str, Any] = {}
    other: dict[str, Any] = {}
    address = None
    for key, value in values.items():
        if key in SECRET_VARS:
            warnings.append(
                f"{where}: {key} dropped (secrets are not stored in the inventory; "
                "clusterctl asks for the sudo password at run time)"
            )
            continue
        if key == "ansible_group_priority":
            continue
        if key in ADDRESS_VARS:
            if host_level:
                address = str(value)
            else:
                warnings.append(f"{where}: {key} on a group kept under vars (an address is per host)")
                other[key] = value
            continue
        target = SSH_VARS.get(key)
        if target is None:
            other[key] = value
            continue
        converted = _ssh_value(target, value)
        if converted is None:
            warnings.append(f"{where}: {key}={value!r} is not a valid {target}; kept under vars")
            other[key] = value
        else:
            ssh[target] = converted
    return ssh, other, address


def _ssh_value(target: str, value: Any) -> Any:
    if target == "port":
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536:
            return value
        if isinstance(value, str) and value.isdigit() and 0 < int(value) < 65536:
            return int(value)
        return None
    if target == "become":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        return True if text in _TRUE else False if text in _FALSE else None
    return str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None


def _level(ssh: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if ssh:
        out["ssh"] = ssh
    if other:
        out["vars"] = other
    return out


def _convert(inv: _Inv) -> AnsibleImport:
    warnings: list[str] = []
    data: dict[str, Any] = {"version": 1}
    ssh, other, _ = _split_vars(inv.groups["all"].vars, "all", warnings, host_level=False)
    if ssh or other:
        data["defaults"] = _level(ssh, other)
    grouped = {h for g in inv.groups.values() if g.name not in ("all", "ungrouped") for h in _members(inv, g.name)}
    ungrouped = [h for h in inv.hosts if h not in grouped]
    inv.group("ungrouped").hosts = ungrouped
    groups: dict[str, Any] = {}
    for name in _group_order(inv):
        members = _members(inv, name)
        ssh, other, _ = _split_vars(inv.groups[name].vars, f"group {name}", warnings, host_level=False)
        if name == "ungrouped" and not members and not (ssh or other):
            continue
        if not members:
            warnings.append(f"group {name} has no hosts")
        entry: dict[str, Any] = {"hosts": _pattern_value(members)}
        entry.update(_level(ssh, other))
        groups[name] = entry
    if groups:
        data["groups"] = groups
    hosts: dict[str, Any] = {}
    plain: dict[str, list[str]] = {}  # identical host-level data -> names, folded below
    for name, hvars in inv.hosts.items():
        ssh, other, address = _split_vars(hvars, f"host {name}", warnings, host_level=True)
        entry = _level(ssh, other)
        if address is not None:
            hosts[name] = {"address": address, **entry}
        else:
            plain.setdefault(yaml.safe_dump(entry, sort_keys=True), []).append(name)
            hosts[name] = entry
    for names in plain.values():
        if len(names) > 1:
            entry = hosts[names[0]]
            for n in names:
                del hosts[n]
            for term in split_top(fold(names)):
                hosts[term] = entry
    data["hosts"] = {k: (v or None) for k, v in sorted(hosts.items(), key=lambda kv: natural_key(kv[0]))}
    return AnsibleImport(data, warnings)


def _pattern_value(names: list[str]) -> str | list[str]:
    """A folded node set, as one string or a list of its terms when there are several."""
    if not names:
        return []
    terms = split_top(fold(names))
    return terms[0] if len(terms) == 1 else terms


def to_yaml(data: dict[str, Any], source: str | None = None) -> str:
    """Render converted data as an inventory file (with a header comment)."""
    head = f"# Converted from {source} by clusterctl inventory import-ansible.\n" if source else ""
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
