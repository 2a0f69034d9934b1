"""Secrets of an instance: read on the control machine at deploy time, never stored.

The inventory holds only references (``secrets: {VLLM_API_KEY: {env:
CLUSTERCTL_API_KEY}}`` or ``{file: keys/api.txt}``, see docs/inventory.md);
:func:`resolve_secrets` reads the values just before rendering.  A value
reaches the node only in the instance's EnvironmentFile (mode 0600), never a
command line, the unit file, a log or ``--plan`` output.

Inventory ``env:`` entries whose names look secret (:func:`looks_secret`) are
handled the same way by the renderer: EnvironmentFile only, redacted.
"""

from __future__ import annotations

import os
import re

from clusterctl.errors import ConfigError, Problem
from clusterctl.inventory.model import Instance, Inventory, SecretRef

#: Names treated as secrets when they appear under ``env:`` (also ``show --json``).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.IGNORECASE)

#: A secret file larger than this is certainly not a key (and is not read whole).
MAX_SECRET_BYTES = 64 * 1024


#: Inventory settings whose names match :data:`SECRET_NAME` but whose values are not
#: secrets; a redacted copy must stay a valid inventory (``doctor --from`` loads it).
NOT_SECRET_SETTINGS = frozenset({"host_key_policy"})


def looks_secret(name: str) -> bool:
    """True when an environment variable's name suggests its value is a secret."""
    return bool(SECRET_NAME.search(name))


def secret_refs(inv: Inventory, inst: Instance) -> dict[str, SecretRef]:
    """The instance's secret references: its template's, overridden by its own."""
    refs: dict[str, SecretRef] = {}
    if inst.template and inst.template in inv.templates:
        refs.update(inv.templates[inst.template].secrets)
    refs.update(inst.secrets)
    return refs


def resolve_secrets(inv: Inventory, inst: Instance) -> dict[str, str]:
    """Read every secret of ``inst``: environment variable name -> value.

    ``env`` references read this process's environment; ``file`` references
    read the file (relative to the inventory file's directory), dropping one
    trailing newline.  Raises :class:`ConfigError` listing every secret that
    is unset, empty, unreadable or not one line, each at the inventory's
    ``file:line``; messages never contain a value.
    """
    out: dict[str, str] = {}
    problems: list[Problem] = []
    base = os.path.dirname(os.path.abspath(inv.path)) if inv.path else os.getcwd()
    for name, ref in secret_refs(inv, inst).items():
        where = f"instances.{inst.name}.secrets.{name}"
        value, why = read_secret(ref, base)
        if why is None and value is not None and ("\n" in value or "\r" in value or "\0" in value):
            why = "the value must be one line (no newline or NUL)"
        if why is not None or value is None:
            loc = ref.location
            problems.append(Problem(loc.file if loc else inv.path, loc.line if loc else 0, f"{where}: {why}"))
            continue
        out[name] = value
    if problems:
        raise ConfigError(problems)
    return out


def read_secret(ref: SecretRef, base: str) -> tuple[str | None, str | None]:
    """One secret's value, read on this machine: ``(value, None)`` or ``(None, why not)``."""
    if ref.kind == "env":
        value = os.environ.get(ref.ref)
        if value is None:
            return None, f"environment variable {ref.ref} is not set on this machine"
        if not value:
            return None, f"environment variable {ref.ref} is empty"
        return value, None
    path = os.path.join(base, os.path.expanduser(ref.ref))
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SECRET_BYTES + 1)
    except OSError as e:
        return None, f"cannot read {path}: {e.strerror or e}"
    if len(raw) > MAX_SECRET_BYTES:
        return None, f"{path} is larger than {MAX_SECRET_BYTES} bytes; not a secret value"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, f"{path} is not UTF-8 text"
    if text.endswith("\n"):
        text = text[:-1]
        if text.endswith("\r"):
            text = text[:-1]
    if not text:
        return None, f"{path} is empty"
    return text, None


def instance_api_key(inv: Inventory, inst: Instance) -> str | None:
    """The API key ``inst``'s vLLM requires, resolved as deploy resolves it (``None``: none configured).

    Deploy writes the instance's secrets (:func:`resolve_secrets`) into its
    EnvironmentFile and lets an inline ``env: {VLLM_API_KEY: ...}`` override
    them, so the same order here.  Raises :class:`ConfigError` (``file:line``,
    never the value) when a secret the inventory names cannot be read.
    """
    inline = inst.env.get("VLLM_API_KEY")
    if inline:
        return inline
    return resolve_secrets(inv, inst).get("VLLM_API_KEY") or None


_PREFIX = re.compile(r"^(?:[&!]\S*\s+)*")


def redact_inventory_text(text: str) -> str:
    """The inventory file ``text`` with every secret-looking value replaced by ``'***'``.

    A value is secret-looking when its key passes :func:`looks_secret` (``HF_TOKEN``,
    ``DB_PASSWORD`` under ``env:``, ``vars:`` or anywhere) and it is a scalar:
    references (``secrets: {X: {env: VAR}}``) are mappings and stay.  An anchored
    value is replaced where it is defined, so an alias cannot bring it back.  Lines
    stay where they were (``file:line`` in messages about the copy still point
    right).  Text that is not YAML is returned as a one-line note instead of the
    original: a copy that cannot be checked is not handed on.
    """
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return "# clusterctl: the inventory could not be parsed, so it is left out (it may hold secrets)\n"
    spans: dict[int, int] = {}
    stack = [root] if root is not None else []
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if (
                    isinstance(k, yaml.ScalarNode)
                    and isinstance(v, yaml.ScalarNode)
                    and looks_secret(str(k.value))
                    and str(k.value) not in NOT_SECRET_SETTINGS
                    and v.value != ""
                ):
                    spans[v.start_mark.index] = v.end_mark.index
                stack += [k, v]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
    for start in sorted(spans, reverse=True):
        end = spans[start]
        original = text[start:end]
        keep = _PREFIX.match(original)
        prefix = keep.group() if keep else ""
        text = text[:start] + prefix + "'***'" + "\n" * original.count("\n") + text[end:]
    return text
