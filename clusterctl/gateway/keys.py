"""Client API keys of the gateway: ``clusterctl gateway key add | revoke | list``.

A key is ``gk-`` + 43 characters of ``secrets.token_urlsafe(32)`` (256 random
bits).  Only its SHA-256 is kept: on the control machine in
``<deploy state dir>/gateway-keys.json`` (mode 0600), on each gateway host in
the nginx include ``clients.conf`` (0600 root: nginx's master reads it as root,
workers get the parsed map).  A key of 256 random bits needs no slow hash: its
SHA-256 cannot be reversed or guessed.  The value is shown once, by ``add``;
it is never written to a file by clusterctl (unless ``--key-file``), a log,
``--json`` output or the audit.

``{"version": 1, "keys": {NAME: {"sha256", "created", "by",
"requests_per_second", "burst", "streams"}}, "revoked": {NAME: {"sha256", "revoked", "by"}}}``

Per-key limits (``None``: the inventory's ``gateway.client_limits``) become
nginx ``limit_req``/``limit_conn`` zones keyed by the client's name.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.errors import ClusterctlError, ConfigError, Problem

FILE = "gateway-keys.json"
PREFIX = "gk-"
#: A client name: it appears in nginx's config and logs, so a plain token.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class ClientKeyError(ClusterctlError):
    """A key operation the store refuses (unknown name, duplicate, bad name)."""


@dataclass(frozen=True)
class ClientKey:
    """One client: its name, the key's SHA-256 (hex) and its own limits (``None``: the inventory's)."""

    name: str
    sha256: str
    created: str = ""
    by: str = ""
    requests_per_second: float | None = None
    burst: int | None = None
    streams: int | None = None

    def to_json(self) -> dict[str, Any]:
        """What ``key list --json`` shows: never the hash's whole value, never the key."""
        return {
            "name": self.name,
            "fingerprint": self.sha256[:12],
            "created": self.created,
            "by": self.by,
            "requests_per_second": self.requests_per_second,
            "burst": self.burst,
            "streams": self.streams,
        }


def new_key() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"version": 1, "keys": {}, "revoked": {}}
    except (OSError, ValueError) as e:
        raise ConfigError([Problem(str(path), getattr(e, "lineno", 0), f"cannot read the gateway keys: {e}")]) from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), dict):
        raise ConfigError([Problem(str(path), 0, "the gateway keys file is not in the expected form")])
    data.setdefault("revoked", {})
    return data


def load(state_dir: Path) -> list[ClientKey]:
    """The active keys, by name (``[]`` without a file); a corrupt file raises :class:`ConfigError`."""
    path = state_dir / FILE
    out = []
    for name, k in sorted(_load(path)["keys"].items()):
        try:
            out.append(
                ClientKey(
                    name,
                    str(k["sha256"]),
                    str(k.get("created", "")),
                    str(k.get("by", "")),
                    None if k.get("requests_per_second") is None else float(k["requests_per_second"]),
                    None if k.get("burst") is None else int(k["burst"]),
                    None if k.get("streams") is None else int(k["streams"]),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(
                [Problem(str(path), 0, f"gateway key {name!r} is not in the expected form: {e}")]
            ) from None
        if not NAME.match(name) or not re.fullmatch(r"[0-9a-f]{64}", out[-1].sha256):
            raise ConfigError([Problem(str(path), 0, f"gateway key {name!r}: bad name or hash")])
    return out


@contextmanager
def _locked(state_dir: Path) -> Iterator[dict[str, Any]]:
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "gateway-keys.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _load(state_dir / FILE)
        yield data
        tmp = state_dir / f".{FILE}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o600)
        tmp.rename(state_dir / FILE)


def add(
    state_dir: Path,
    name: str,
    *,
    who: str,
    now: str,
    requests_per_second: float | None = None,
    burst: int | None = None,
    streams: int | None = None,
    make_key: Callable[[], str] = new_key,
) -> tuple[str, ClientKey]:
    """A new key for client ``name``: ``(the key, its record)``; the key is not kept anywhere."""
    if not NAME.match(name):
        raise ClientKeyError(
            f"client name {name!r}: letters, digits, '_', '.', '-' (up to 63, starting with a letter or digit)"
        )
    for what, v in (("--rps", requests_per_second), ("--burst", burst), ("--streams", streams)):
        if v is not None and v < 0:
            raise ClientKeyError(f"{what} must be 0 (no limit) or more")
    key = make_key()
    with _locked(state_dir) as data:
        if name in data["keys"]:
            raise ClientKeyError(f"client {name!r} has a key already (revoke it first, or choose another name)")
        digest = key_hash(key)
        data["keys"][name] = {
            "sha256": digest,
            "created": now,
            "by": who,
            "requests_per_second": requests_per_second,
            "burst": burst,
            "streams": streams,
        }
        data["revoked"].pop(name, None)
    return key, ClientKey(name, digest, now, who, requests_per_second, burst, streams)


def revoke(state_dir: Path, name: str, *, who: str, now: str) -> ClientKey:
    """Remove ``name``'s key (kept as revoked, by fingerprint, for the record)."""
    with _locked(state_dir) as data:
        rec = data["keys"].pop(name, None)
        if rec is None:
            known = ", ".join(sorted(data["keys"])) or "none"
            raise ClientKeyError(f"no client {name!r} (clients: {known})")
        data["revoked"][name] = {"fingerprint": str(rec["sha256"])[:12], "revoked": now, "by": who}
    return ClientKey(name, str(rec["sha256"]), str(rec.get("created", "")), str(rec.get("by", "")))
