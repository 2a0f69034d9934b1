"""Merging the user's OpenSSH client config into the inventory's SSH settings.

The inventory wins: a value from ``ssh_config`` only fills a field the
inventory left unset.  Directives used: ``Host`` and ``Match`` (as paramiko
evaluates them), ``HostName``, ``User``, ``Port``, ``IdentityFile`` (the
first one), ``ProxyJump`` and ``Include`` (expanded here, since paramiko does
not).  Any other directive that applies to a host is reported as a warning
saying it is ignored, once per directive with the hosts folded.

Which file is read: ``$CLUSTERCTL_SSH_CONFIG`` if set (``none`` or empty
disables reading), else ``~/.ssh/config`` if it exists.  The inventory can
switch reading off with ``defaults.ssh.use_ssh_config: false``.

Reading is bounded whatever the files hold: regular files only (a FIFO, a
device such as ``/dev/zero`` or a directory is a warning), at most
:data:`MAX_FILE_BYTES` per file and :data:`MAX_TOTAL_BYTES` and
:data:`MAX_INCLUDES` files in all, no file inside its own Include chain, UTF-8
text without NUL bytes; anything else is a warning and the part is skipped.

``Match exec`` runs a shell command when paramiko evaluates it, so merely
validating an inventory would run it.  It is refused unless
``$CLUSTERCTL_SSH_MATCH_EXEC=1``: its block is skipped (never matches) with a
warning.
"""

from __future__ import annotations

import glob
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.inventory.files import ReadRefused, read_config_text
from clusterctl.inventory.model import Host
from clusterctl.inventory.nodeset import fold

#: Directives clusterctl applies; everything else found for a host is ignored.
SUPPORTED = {"hostname", "user", "port", "identityfile", "proxyjump"}
_MAX_INCLUDE_DEPTH = 16
ENV_VAR = "CLUSTERCTL_SSH_CONFIG"
#: Set to 1 to let paramiko run the commands of ``Match exec`` lines.
MATCH_EXEC_VAR = "CLUSTERCTL_SSH_MATCH_EXEC"
#: Largest ssh_config file read (a real one is a few KiB).
MAX_FILE_BYTES = 1 << 20
#: Largest text all files together may expand to.
MAX_TOTAL_BYTES = 4 << 20
#: Most files read through Include (``Include *`` in several files multiplies).
MAX_INCLUDES = 256
_MATCH_EXEC = re.compile(r"^\s*match\s(?:.*?[\s!])?exec[\s=]", re.IGNORECASE)


def config_file() -> Path | None:
    """The ssh_config file to read, or ``None`` when there is none or it is disabled."""
    env = os.environ.get(ENV_VAR)
    if env is not None:
        if env.strip().lower() in ("", "none"):
            return None
        return Path(os.path.expanduser(env))
    default = Path.home() / ".ssh" / "config"
    return default if default.exists() else None


@dataclass
class _Budget:
    """What one expansion has read so far, against the limits."""

    files: int = 0
    size: int = 0
    chain: list[str] = field(default_factory=list)
    stopped: bool = False


def _read_bounded(path: Path, warnings: list[str]) -> str | None:
    """The text of a regular file of at most :data:`MAX_FILE_BYTES`, or ``None`` with a warning."""
    try:
        return read_config_text(path, MAX_FILE_BYTES)
    except ReadRefused as e:
        warnings.append(f"ssh_config {path}: {e}; ignored")
        return None


def _expand_includes(path: Path, depth: int, warnings: list[str], budget: _Budget | None = None) -> str:
    """The file's text with each ``Include`` replaced by the included files.

    Relative include paths are resolved against ``~/.ssh`` as OpenSSH does for
    user configs; globs are expanded in sorted order.  Bounded as the module doc says.
    """
    budget = budget if budget is not None else _Budget()
    if depth > _MAX_INCLUDE_DEPTH:
        warnings.append(f"{path}: Include nested more than {_MAX_INCLUDE_DEPTH} deep; stopped")
        return ""
    real = os.path.realpath(path)
    if real in budget.chain:
        warnings.append(
            f"ssh_config {path}: includes itself (through {len(budget.chain) - budget.chain.index(real)} "
            "file(s)); that Include is skipped"
        )
        return ""
    if budget.files >= MAX_INCLUDES or budget.size >= MAX_TOTAL_BYTES:
        if not budget.stopped:
            budget.stopped = True
            warnings.append(
                f"ssh_config: more than {MAX_INCLUDES} files or {MAX_TOTAL_BYTES >> 20} MiB through "
                f"Include (at {path}); the rest is skipped"
            )
        return ""
    budget.files += 1
    text = _read_bounded(path, warnings)
    if text is None:
        return ""
    budget.size += len(text)
    budget.chain.append(real)
    out = []
    try:
        for line in text.splitlines():
            words = line.strip().split(None, 1)
            if words and words[0].lower() == "include" and len(words) == 2:
                for pattern in words[1].split():
                    pattern = os.path.expanduser(pattern)
                    if not os.path.isabs(pattern):
                        pattern = str(Path.home() / ".ssh" / pattern)
                    for inc in sorted(glob.iglob(pattern))[:MAX_INCLUDES]:
                        out.append(_expand_includes(Path(inc), depth + 1, warnings, budget))
                continue
            out.append(line)
    finally:
        budget.chain.pop()
    return "\n".join(out)


def _without_match_exec(text: str, path: Path, warnings: list[str]) -> str:
    """``text`` with each ``Match ... exec`` line replaced by a block that never matches (see the module doc)."""
    if os.environ.get(MATCH_EXEC_VAR) == "1":
        return text
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if _MATCH_EXEC.match(line):
            warnings.append(
                f"ssh_config {path}: {line.strip()[:80]!r} would run a command; its block is skipped "
                f"(set {MATCH_EXEC_VAR}=1 to allow it)"
            )
            lines[i] = "Host !*"
    return "\n".join(lines)


def apply_ssh_config(hosts: list[Host], explicit_address: set[str], path: Path | None, warnings: list[str]) -> None:
    """Fill unset SSH fields of ``hosts`` from ``path``; append warnings.

    ``explicit_address`` names the hosts whose address the inventory set; the
    others take ``HostName`` from the config when it gives one.  Lookups use
    the host's inventory name, as ``ssh NAME`` would.  An unreadable or
    unparsable config is a warning, never an error.
    """
    if path is None or not hosts:
        return
    import paramiko  # only when there is a config to read: ~85 ms of start-up

    text = _without_match_exec(_expand_includes(path, 0, warnings), path, warnings)
    try:
        config = paramiko.SSHConfig.from_text(text)
    except Exception as e:  # paramiko raises several kinds for bad files
        warnings.append(f"ssh_config {path}: cannot parse it ({e}); ignored")
        return
    ignored: dict[str, list[str]] = defaultdict(list)
    for host in hosts:
        try:
            found = config.lookup(host.name)
        except Exception as e:  # e.g. Match exec without invoke, bad tokens
            warnings.append(f"ssh_config {path}: lookup of {host.name} failed ({e}); ignored")
            continue
        ssh = host.ssh
        hostname = found.get("hostname")
        if host.name not in explicit_address and hostname and hostname != host.name:
            host.address = hostname
        if ssh.user is None and found.get("user"):
            ssh.user = found["user"]
        if ssh.port is None and found.get("port"):
            try:
                ssh.port = int(found["port"])
            except ValueError:
                warnings.append(f"ssh_config {path}: Port {found['port']!r} for {host.name} is not a number; ignored")
        if ssh.identity_file is None and found.get("identityfile"):
            ssh.identity_file = os.path.expanduser(found["identityfile"][0])
        if ssh.proxy_jump is None and found.get("proxyjump"):
            ssh.proxy_jump = found["proxyjump"]
        for key in found:
            if key not in SUPPORTED:
                ignored[key].append(host.name)
    for key in sorted(ignored):
        warnings.append(f"ssh_config {path}: directive {key!r} (hosts {fold(ignored[key])}) is ignored by clusterctl")
