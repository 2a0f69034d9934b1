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
"""

from __future__ import annotations

import glob
import os
from collections import defaultdict
from pathlib import Path

from clusterctl.inventory.model import Host
from clusterctl.inventory.nodeset import fold

#: Directives clusterctl applies; everything else found for a host is ignored.
SUPPORTED = {"hostname", "user", "port", "identityfile", "proxyjump"}
_MAX_INCLUDE_DEPTH = 16
ENV_VAR = "CLUSTERCTL_SSH_CONFIG"


def config_file() -> Path | None:
    """The ssh_config file to read, or ``None`` when there is none or it is disabled."""
    env = os.environ.get(ENV_VAR)
    if env is not None:
        if env.strip().lower() in ("", "none"):
            return None
        return Path(os.path.expanduser(env))
    default = Path.home() / ".ssh" / "config"
    return default if default.exists() else None


def _expand_includes(path: Path, depth: int, warnings: list[str]) -> str:
    """The file's text with each ``Include`` replaced by the included files.

    Relative include paths are resolved against ``~/.ssh`` as OpenSSH does for
    user configs; globs are expanded in sorted order.
    """
    if depth > _MAX_INCLUDE_DEPTH:
        warnings.append(f"{path}: Include nested more than {_MAX_INCLUDE_DEPTH} deep; stopped")
        return ""
    try:
        text = path.read_text()
    except OSError as e:
        warnings.append(f"ssh_config {path}: cannot read it ({e.strerror}); ignored")
        return ""
    out = []
    for line in text.splitlines():
        words = line.strip().split(None, 1)
        if words and words[0].lower() == "include" and len(words) == 2:
            for pattern in words[1].split():
                pattern = os.path.expanduser(pattern)
                if not os.path.isabs(pattern):
                    pattern = str(Path.home() / ".ssh" / pattern)
                for inc in sorted(glob.glob(pattern)):
                    out.append(_expand_includes(Path(inc), depth + 1, warnings))
            continue
        out.append(line)
    return "\n".join(out)


def apply_ssh_config(hosts: list[Host], explicit_address: set[str], path: Path | None,
                     warnings: list[str]) -> None:
    """Fill unset SSH fields of ``hosts`` from ``path``; append warnings.

    ``explicit_address`` names the hosts whose address the inventory set; the
    others take ``HostName`` from the config when it gives one.  Lookups use
    the host's inventory name, as ``ssh NAME`` would.  An unreadable or
    unparsable config is a warning, never an error.
    """
    if path is None or not hosts:
        return
    import paramiko  # only when there is a config to read: ~85 ms of start-up

    text = _expand_includes(path, 0, warnings)
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
        warnings.append(f"ssh_config {path}: directive {key!r} (hosts {fold(ignored[key])}) "
                        "is ignored by clusterctl")
