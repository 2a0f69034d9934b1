"""known_hosts parsing and the accept-new / strict / off policies."""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading

import pytest

from clusterctl.fleet.hostkeys import HostKeyMismatch, KnownHosts, UnknownHostKey, fingerprint

K1 = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519" + b"A" * 36).decode()
K2 = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519" + b"B" * 36).decode()


def hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    mac = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(mac).decode()}"


def test_accept_new_records_once_and_then_knows(tmp_path):
    path = tmp_path / "ssh" / "known_hosts"
    kh = KnownHosts(path, "accept-new")
    assert kh.check("10.0.0.1", 22, "ssh-ed25519", K1) == "recorded"
    assert kh.check("10.0.0.1", 22, "ssh-ed25519", K1) == "known"
    assert path.read_text() == f"10.0.0.1 ssh-ed25519 {K1}\n"
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    # a fresh reader (another process) sees it
    assert KnownHosts(path, "strict").check("10.0.0.1", 22, "ssh-ed25519", K1) == "known"


def test_non_default_port_uses_bracket_form(tmp_path):
    path = tmp_path / "kh"
    KnownHosts(path).check("10.0.0.1", 2222, "ssh-ed25519", K1)
    assert path.read_text().startswith("[10.0.0.1]:2222 ")
    with pytest.raises(UnknownHostKey):
        KnownHosts(path, "strict").check("10.0.0.1", 22, "ssh-ed25519", K1)


def test_changed_key_refused_with_file_and_line_and_file_untouched(tmp_path):
    path = tmp_path / "kh"
    text = f"# comment\nother ssh-ed25519 {K2}\n10.0.0.1 ssh-ed25519 {K1}\n"
    path.write_text(text)
    for policy in ("accept-new", "strict", "off"):
        with pytest.raises(HostKeyMismatch) as e:
            KnownHosts(path, policy).check("10.0.0.1", 22, "ssh-ed25519", K2)
        assert f"{path}:3" in str(e.value) and "remove line 3" in str(e.value)
        assert fingerprint(K2) in str(e.value)
    assert path.read_text() == text


def test_strict_refuses_unknown_and_off_accepts_without_recording(tmp_path):
    path = tmp_path / "kh"
    with pytest.raises(UnknownHostKey, match="strict"):
        KnownHosts(path, "strict").check("h", 22, "ssh-ed25519", K1)
    assert KnownHosts(path, "off").check("h", 22, "ssh-ed25519", K1) == "accepted"
    assert not path.exists()


def test_hashed_wildcard_negation_and_lists(tmp_path):
    path = tmp_path / "kh"
    path.write_text(
        f"{hashed('10.0.0.7')} ssh-ed25519 {K1}\ngpu*,!gpu9 ssh-ed25519 {K2}\na,b,[c]:2200 ssh-ed25519 {K1}\n"
    )
    kh = KnownHosts(path, "strict")
    assert kh.check("10.0.0.7", 22, "ssh-ed25519", K1) == "known"
    assert kh.check("gpu1", 22, "ssh-ed25519", K2) == "known"
    with pytest.raises(UnknownHostKey):
        kh.check("gpu9", 22, "ssh-ed25519", K2)
    assert kh.check("b", 22, "ssh-ed25519", K1) == "known"
    assert kh.check("c", 2200, "ssh-ed25519", K1) == "known"


def test_revoked_key_refused(tmp_path):
    path = tmp_path / "kh"
    path.write_text(f"@revoked * ssh-ed25519 {K1}\n")
    with pytest.raises(HostKeyMismatch, match="revoked"):
        KnownHosts(path).check("h", 22, "ssh-ed25519", K1)


def test_other_key_type_known_is_refused(tmp_path):
    path = tmp_path / "kh"
    path.write_text(f"h ssh-rsa {K2}\n")
    with pytest.raises(HostKeyMismatch, match="ssh-rsa"):
        KnownHosts(path).check("h", 22, "ssh-ed25519", K1)


def test_concurrent_writers_record_each_host_once(tmp_path):
    path = tmp_path / "kh"
    readers = [KnownHosts(path) for _ in range(4)]  # as four processes would

    def work(kh):
        for i in range(50):
            kh.check(f"10.0.{i}.1", 22, "ssh-ed25519", K1)

    threads = [threading.Thread(target=work, args=(kh,)) for kh in readers]
    [t.start() for t in threads]
    [t.join() for t in threads]
    lines = path.read_text().splitlines()
    assert sorted(lines) == sorted(f"10.0.{i}.1 ssh-ed25519 {K1}" for i in range(50))


def test_unknown_policy_rejected(tmp_path):
    with pytest.raises(ValueError, match="yes"):
        KnownHosts(tmp_path / "kh", "yes")
