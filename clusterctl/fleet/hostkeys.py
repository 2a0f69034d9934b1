"""Host key verification against an OpenSSH ``known_hosts`` file.

Policies (``SSHSettings.host_key_policy``):

``accept-new`` (default)
    A host with no recorded key is accepted and its key appended to the file
    under an exclusive ``fcntl`` lock (several clusterctl processes may write
    at once).  A host whose recorded key differs is refused.
``strict``
    Only keys already in the file are accepted.
``off``
    Every key is accepted and nothing is recorded; callers warn the user.
    Even then a key that *differs* from a recorded one is refused.

A changed key is always refused with :class:`HostKeyMismatch`, whose message
names the file and line to remove.  Supported entry forms: plain names and
addresses, ``[host]:port``, comma lists, hashed entries (``|1|salt|hash``),
``*``/``?`` wildcards, ``!`` negation and ``@revoked``; ``@cert-authority``
lines are skipped.  This module never uses paramiko's ``AutoAddPolicy``.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

HOST_KEY_POLICIES = ("accept-new", "strict", "off")


class HostKeyError(Exception):
    """The host key was refused (mismatch, unknown under strict, revoked)."""


class HostKeyMismatch(HostKeyError):
    pass


class UnknownHostKey(HostKeyError):
    pass


@dataclass(frozen=True)
class Entry:
    """One key line: where it is, which host patterns, which key."""

    line: int
    patterns: tuple[str, ...]
    keytype: str
    key_b64: str
    revoked: bool = False


def host_id(address: str, port: int) -> str:
    """The name known_hosts uses: ``address`` for port 22, else ``[address]:port``."""
    return address if port == 22 else f"[{address}]:{port}"


def fingerprint(key_b64: str) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a base64 public key blob."""
    digest = hashlib.sha256(base64.b64decode(key_b64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _pattern_matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        try:
            _, _, salt, want = pattern.split("|", 3)
            mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
        except (ValueError, base64.binascii.Error):  # type: ignore[attr-defined]
            return False
        return hmac.compare_digest(base64.b64encode(mac).decode(), want)
    if "*" not in pattern and "?" not in pattern:
        return name.lower() == pattern.lower()
    # OpenSSH patterns know only * and ?; brackets are literal ([host]:port).
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.fullmatch(rx, name.lower()) is not None


def _entry_matches(entry: Entry, name: str) -> bool:
    hit = False
    for p in entry.patterns:
        if p.startswith("!"):
            if _pattern_matches(p[1:], name):
                return False
        elif _pattern_matches(p, name):
            hit = True
    return hit


def parse(text: str) -> list[Entry]:
    """Parse known_hosts text; malformed lines are skipped as OpenSSH does."""
    entries: list[Entry] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        revoked = False
        if fields[0].startswith("@"):
            if fields[0] == "@revoked":
                revoked = True
            else:  # @cert-authority: certificates are not supported here
                continue
            fields = fields[1:]
        if len(fields) < 3:
            continue
        entries.append(Entry(n, tuple(fields[0].split(",")), fields[1], fields[2], revoked))
    return entries


class KnownHosts:
    """A known_hosts file, read once and shared by every connection of a fleet.

    Thread-safe.  ``path`` may not exist yet (it is created, with its
    directory at mode 0700, on the first recorded key).
    """

    def __init__(self, path: str | os.PathLike[str], policy: str = "accept-new"):
        if policy not in HOST_KEY_POLICIES:
            raise ValueError(f"unknown host key policy {policy!r} (use {', '.join(HOST_KEY_POLICIES)})")
        self.path = Path(os.path.expanduser(str(path)))
        self.policy = policy
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._entries: list[Entry] = []
        self._indexed: list[Entry] | None = None
        self._exact: dict[str, list[Entry]] = {}
        self._other: list[Entry] = []
        self._reload_if_changed()

    def _reload_if_changed(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._entries, self._stamp = [], None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._entries = parse(self.path.read_text(errors="replace"))
            self._stamp = stamp

    def _index(self) -> tuple[dict[str, list[Entry]], list[Entry]]:
        """Entries by literal host name, plus those that need pattern matching."""
        if self._indexed is not self._entries:
            exact: dict[str, list[Entry]] = {}
            other: list[Entry] = []
            for e in self._entries:
                if any(p.startswith(("|", "!")) or "*" in p or "?" in p for p in e.patterns):
                    other.append(e)
                else:
                    for p in e.patterns:
                        exact.setdefault(p.lower(), []).append(e)
            self._exact, self._other, self._indexed = exact, other, self._entries
        return self._exact, self._other

    def lookup(self, address: str, port: int) -> list[Entry]:
        name = host_id(address, port)
        with self._lock:
            exact, other = self._index()
            found = exact.get(name.lower(), []) + [e for e in other if _entry_matches(e, name)]
            return sorted(found, key=lambda e: e.line)

    def known_types(self, address: str, port: int) -> list[str]:
        """Key types recorded for the host (to prefer them during key exchange)."""
        return list(dict.fromkeys(e.keytype for e in self.lookup(address, port) if not e.revoked))

    def check(self, address: str, port: int, keytype: str, key_b64: str) -> str:
        """Verify a presented key; record it when new and the policy allows.

        Returns ``"known"``, ``"recorded"`` or ``"accepted"`` (policy off).
        Raises :class:`HostKeyMismatch` or :class:`UnknownHostKey`.
        """
        name = host_id(address, port)
        matches = self.lookup(address, port)
        verdict = self._verdict(name, matches, keytype, key_b64)
        if verdict != "unknown":
            return verdict
        if self.policy == "off":
            return "accepted"
        if self.policy == "strict":
            raise UnknownHostKey(
                f"host key for {name} is not in {self.path} (strict host key checking); "
                f"{keytype} {fingerprint(key_b64)}"
            )
        return self._record(name, keytype, key_b64)

    def _verdict(self, name: str, matches: list[Entry], keytype: str, key_b64: str) -> str:
        for e in matches:
            if e.revoked and e.key_b64 == key_b64:
                raise HostKeyMismatch(f"host key for {name} is marked @revoked in {self.path}:{e.line}")
        live = [e for e in matches if not e.revoked]
        if any(e.keytype == keytype and e.key_b64 == key_b64 for e in live):
            return "known"
        if live:
            e = next((e for e in live if e.keytype == keytype), live[0])
            raise HostKeyMismatch(
                f"HOST KEY CHANGED for {name}: it presented {keytype} {fingerprint(key_b64)}, "
                f"but {self.path}:{e.line} records {e.keytype} {fingerprint(e.key_b64)}. "
                f"This can mean someone is intercepting the connection. If the host was "
                f"reinstalled, remove line {e.line} of {self.path} "
                f"(ssh-keygen -f {self.path} -R '{name}') and retry."
            )
        return "unknown"

    def _record(self, name: str, keytype: str, key_b64: str) -> str:
        with self._lock:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self.path, "a+", encoding="utf-8") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    st = os.fstat(f.fileno())
                    stamp = (st.st_mtime_ns, st.st_size)
                    f.seek(0)
                    text = f.read()
                    if stamp != self._stamp:  # another process wrote meanwhile
                        self._entries = parse(text)
                    verdict = self._verdict(
                        name, [e for e in self._entries if _entry_matches(e, name)], keytype, key_b64
                    )
                    if verdict == "unknown":
                        if text and not text.endswith("\n"):
                            f.write("\n")
                        f.write(f"{name} {keytype} {key_b64}\n")
                        f.flush()
                        os.fsync(f.fileno())
                        line = text.count("\n") + (1 if text and not text.endswith("\n") else 0) + 1
                        self._entries = self._entries + [Entry(line, (name,), keytype, key_b64)]
                        verdict = "recorded"
                    st = os.fstat(f.fileno())
                    self._stamp = (st.st_mtime_ns, st.st_size)
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
            return verdict
