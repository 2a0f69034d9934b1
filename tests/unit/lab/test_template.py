from __future__ import annotations

import pytest

from clusterctl.errors import LabError
from clusterctl.lab import template


def _apt(tmp_path, sources=None, listfile=None):
    d = tmp_path / "apt"
    (d / "sources.list.d").mkdir(parents=True)
    if sources is not None:
        (d / "sources.list.d" / "debian.sources").write_text(sources)
    if listfile is not None:
        (d / "sources.list").write_text(listfile)
    return d


DEB822 = """Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_comes_from_apts_deb822_sources(tmp_path):
    assert template.apt_mirror(_apt(tmp_path, DEB822)) == (
        "http://mirror.example/debian",
        "/usr/share/keyrings/debian-archive-keyring.gpg",
    )


def test_mirror_comes_from_a_one_line_sources_list(tmp_path):
    text = (
        "# comment\ndeb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main contrib\n"
    )
    assert template.apt_mirror(_apt(tmp_path, listfile=text)) == ("http://one.example/debian", "/k.gpg")


def test_no_bookworm_mirror_is_a_clear_error(tmp_path):
    d = _apt(
        tmp_path, DEB822.replace("bookworm bookworm-updates", "trixie"), "deb http://x.example/debian bullseye main\n"
    )
    with pytest.raises(LabError, match="no Debian bookworm 'main' mirror"):
        template.apt_mirror(d)


def test_cache_versions_follow_the_recipe(monkeypatch):
    base, prep = template.base_version(), template.prep_version()
    monkeypatch.setattr(template, "PACKAGES", template.PACKAGES + ("curl",))
    assert template.base_version() != base
    monkeypatch.setattr(template, "PREP_RECIPE", template.PREP_RECIPE + 1)
    assert template.prep_version() != prep


def test_cached_is_none_until_both_layers_exist(tmp_path):
    assert template.cached(tmp_path) is None
    (tmp_path / f"base-{template.base_version()}").mkdir()
    assert template.cached(tmp_path) is None
    (tmp_path / f"prep-{template.prep_version()}").mkdir()
    t = template.cached(tmp_path)
    assert t is not None and t.lowerdir == f"{t.prep}:{t.base}"


def test_prepare_rootfs_masks_units_and_drops_shared_host_keys(tmp_path, monkeypatch):
    root = tmp_path / "root"
    for d in ("etc/ssh", "etc/systemd/system", "etc/sudoers.d"):
        (root / d).mkdir(parents=True)
    (root / "etc/hostname").write_text("buildbox\n")
    (root / "etc/machine-id").write_text("abc\n")
    (root / "etc/ssh/ssh_host_rsa_key").write_text("secret")
    calls = []
    monkeypatch.setattr(template, "run", lambda argv, **kw: calls.append(argv))
    template.prepare_rootfs(root)
    assert not (root / "etc/hostname").exists()
    assert (root / "etc/machine-id").read_text() == ""
    assert not list((root / "etc/ssh").glob("ssh_host_*"))
    assert str((root / "etc/systemd/system/console-getty.service").readlink()) == "/dev/null"
    assert "Storage=volatile" in (root / "etc/systemd/journald.conf.d/lab.conf").read_text()
    assert (root / "etc/sudoers.d/ops").read_text() == "ops ALL=(ALL) NOPASSWD: ALL\n"
    assert (root / "etc/sudoers.d/ops").stat().st_mode & 0o777 == 0o440
    assert calls and calls[0][:3] == ["chroot", str(root), "/usr/sbin/useradd"]


def test_user_ids_read_from_passwd(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0::/root:/bin/bash\nops:x:1000:1001::/home/ops:/bin/bash\n")
    assert template.user_ids(tmp_path, "ops") == (1000, 1001)
    with pytest.raises(LabError, match="missing"):
        template.user_ids(tmp_path, "nobody")


def test_gateway_units_are_not_started_even_with_dangling_absolute_links(tmp_path, monkeypatch):
    """Debian enables nginx and keepalived by absolute links that dangle seen from the build
    machine (a glob skipped them: keepalived stayed enabled); the template enables neither."""
    root = tmp_path / "root"
    wants = root / "etc/systemd/system/multi-user.target.wants"
    for d in ("etc/ssh", "etc/sudoers.d"):
        (root / d).mkdir(parents=True)
    wants.mkdir(parents=True)
    for unit in ("nginx.service", "keepalived.service", "ssh.service"):
        (wants / unit).symlink_to(f"/nonexistent-on-this-machine/{unit}")
    monkeypatch.setattr(template, "run", lambda argv, **kw: None)
    template.prepare_rootfs(root)
    assert sorted(p.name for p in wants.iterdir()) == ["ssh.service"]


def test_unused_layers_of_other_recipes_are_kept_a_while(tmp_path, monkeypatch):
    """Another checkout's layers (not mounted now) survive a build here until unused for a day."""
    import os

    keep = (tmp_path / "base-new", tmp_path / "prep-new")
    for name in ("base-new", "prep-new", "base-other", "prep-old"):
        (tmp_path / name).mkdir()
    now = 1_000_000_000.0
    os.utime(tmp_path / "base-other", (now - 3600, now - 3600))
    os.utime(tmp_path / "prep-old", (now - 2 * template.UNUSED_KEEP_S, now - 2 * template.UNUSED_KEEP_S))
    template._remove_unused(tmp_path, keep=keep, now=now)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base-new", "base-other", "prep-new"]
