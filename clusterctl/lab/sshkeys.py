"""SSH keys of a lab: the client key, each host's own host key, known_hosts.

Every host gets its own ed25519 host key (clones of one template would
otherwise share the template's keys, lab.md P14), and ``known_hosts`` is
written with all of them, so clients can run with strict host key checking.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from clusterctl.lab._run import run

HOST_KEY = "etc/ssh/ssh_host_ed25519_key"


def ensure_client_key(key_file: Path) -> str:
    """Create the lab's client key pair if missing; return the public key line."""
    key_file.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(key_file.parent, 0o700)
    if not key_file.is_file() or not key_file.with_suffix(".pub").is_file():
        key_file.unlink(missing_ok=True)
        key_file.with_suffix(".pub").unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "clusterctl-lab", "-f", str(key_file)])
    return key_file.with_suffix(".pub").read_text().strip()


def make_host_key(root: Path, comment: str) -> str:
    """Generate ``root/etc/ssh/ssh_host_ed25519_key``; return the public key (type + base64)."""
    key = root / HOST_KEY
    key.parent.mkdir(parents=True, exist_ok=True)
    key.unlink(missing_ok=True)
    key.with_name(key.name + ".pub").unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])
    kind, blob = key.with_name(key.name + ".pub").read_text().split()[:2]
    return f"{kind} {blob}"


def write_known_hosts(path: Path, entries: Iterable[tuple[list[str], str]]) -> None:
    """Write ``known_hosts`` atomically: one line per ``(names, "type base64")``."""
    text = "".join(f"{','.join(names)} {key}\n" for names, key in entries)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    tmp.rename(path)


def install_authorized_key(home: Path, pubkey: str, uid: int = 0, gid: int = 0) -> None:
    """Write ``home/.ssh/authorized_keys`` with ``pubkey``, owned by ``uid:gid``."""
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    ak = ssh / "authorized_keys"
    ak.write_text(pubkey.rstrip() + "\n")
    os.chmod(ssh, 0o700)
    os.chmod(ak, 0o600)
    for p in (ssh, ak):
        os.chown(p, uid, gid)
