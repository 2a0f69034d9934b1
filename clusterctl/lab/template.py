"""The Debian root filesystem every lab host boots: built once, then cached.

Two cached layers under ``cache_dir`` (see docs/lab.md):

* ``base-<hash>``: ``debootstrap --variant=minbase`` of Debian bookworm with
  systemd, OpenSSH and python3, from the mirror this machine's apt uses.
  Slow (about 45 s); rebuilt only when :data:`PACKAGES` or the suite change.
* ``prep-<hash>``: a small overlay layer on top of the base: masked units,
  volatile journal, no shared SSH host keys, the ``ops`` user, and whatever
  the simulated hardware installs.  Rebuilt in seconds whenever this file or
  ``clusterctl/lab/hardware/`` changes.

Hosts mount ``lowerdir=prep:base``.  Each layer is built under a temporary
name and renamed when complete, so an interrupted build never leaves a
layer that looks finished.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clusterctl.errors import LabError
from clusterctl.lab import hardware
from clusterctl.lab._run import run
from clusterctl.lab.vllm_sim import install as vllm_install

SUITE = "bookworm"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "iproute2",
    "procps",
    "python3",
    "sudo",
    "kmod",
    "iputils-ping",
    "less",
    # The gateway (docs/gateway.md): nginx with njs, started only by tests that use it.
    "nginx-light",
    "libnginx-mod-http-js",
    # Gateway HA (docs/gateway.md): VRRP for the floating address, started by `gateway deploy`.
    "keepalived",
)
#: Bumped by hand when the prep steps change in a way the hash cannot see.
PREP_RECIPE = 3
#: Units a container has no use for (timers that would wake up 100 hosts at
#: once, gettys on a console nobody reads, checks of disks that are not there).
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "e2scrub_reap.service",
    "systemd-pstore.service",
    "getty@tty1.service",
    "console-getty.service",
    "systemd-remount-fs.service",
)
#: The non-root login of the host that keeps Debian's default sshd settings.
OPS_USER = "ops"
DEBOOTSTRAP_TIMEOUT_S = 900.0

Event = Callable[[str], None]


@dataclass(frozen=True)
class Template:
    """A ready template: the overlay lower layers, topmost first."""

    base: Path
    prep: Path

    @property
    def lowerdir(self) -> str:
        return f"{self.prep}:{self.base}"


def apt_mirror(sources_dir: Path = Path("/etc/apt")) -> tuple[str, str | None]:
    """Return ``(uri, keyring)`` of the Debian mirror apt uses for :data:`SUITE`.

    Reads deb822 ``*.sources`` files and one-line ``sources.list`` files.
    Raises :class:`LabError` when no mirror serves ``SUITE`` ``main``.
    """
    for f in sorted((sources_dir / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", f.read_text()):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                k, _, v = line.partition(":")
                fields[k.strip().lower()] = v.strip()
            if (
                "deb" in fields.get("types", "").split()
                and SUITE in fields.get("suites", "").split()
                and "main" in fields.get("components", "").split()
                and fields.get("uris")
            ):
                return fields["uris"].split()[0], fields.get("signed-by") or None
    lists = [sources_dir / "sources.list", *sorted((sources_dir / "sources.list.d").glob("*.list"))]
    for f in lists:
        if not f.is_file():
            continue
        for line in f.read_text().splitlines():
            m = re.match(r"\s*deb\s+(\[[^]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line)
            if m and m.group(3) == SUITE and "main" in m.group(4).split():
                opts = m.group(1) or ""
                k = re.search(r"signed-by=(\S+?)\]?(\s|$)", opts)
                return m.group(2), (k.group(1) if k else None)
    raise LabError(
        f"no Debian {SUITE} 'main' mirror in {sources_dir}/sources.list(.d); "
        "the lab template is built from the mirror apt uses"
    )


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
        h.update(b"\0")
    return h.hexdigest()[:12]


def base_version() -> str:
    return _digest(SUITE.encode(), ",".join(PACKAGES).encode(), b"minbase")


def _hardware_dir() -> Path:
    return Path(__file__).parent / "hardware"


def prep_version() -> str:
    """Hash of this module and the hardware package's sources."""
    parts = [Path(__file__).read_bytes(), str(PREP_RECIPE).encode()]
    hw = _hardware_dir()
    if hw.is_dir():
        for f in sorted(hw.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix in (".py", ".c", ".sh", ".h", ".json", ""):
                parts += [str(f.relative_to(hw)).encode(), f.read_bytes()]

    for f in vllm_install.sources():  # the vLLM simulator installed as `vllm`
        parts += [f"vllm_sim/{f.name}".encode(), f.read_bytes()]
    return _digest(*parts)


def cached(cache_dir: Path) -> Template | None:
    """The current template if both layers are cached, else ``None``."""
    t = Template(cache_dir / f"base-{base_version()}", cache_dir / f"prep-{prep_version()}")
    return t if t.base.is_dir() and t.prep.is_dir() else None


def ensure(cache_dir: Path, on_event: Event = lambda s: None) -> Template:
    """Return the current template, building the missing layers first (root only).

    Builds are serialised by a lock in ``cache_dir``, so two labs starting at
    once build a layer once.  Layers of older recipes that no mount uses are
    removed after a new layer is built once unused for :data:`UNUSED_KEEP_S`.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(cache_dir, 0o755)
    with open(cache_dir / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        base = cache_dir / f"base-{base_version()}"
        prep = cache_dir / f"prep-{prep_version()}"
        built = False
        if not base.is_dir():
            _build_base(base, on_event)
            built = True
        if not prep.is_dir():
            _build_prep(base, prep, on_event)
            built = True
        for layer in (base, prep):  # "last used": what _remove_unused keeps
            os.utime(layer)
        if built:
            _remove_unused(cache_dir, keep=(base, prep))
    return Template(base, prep)


#: A layer no mount uses is removed once it was last used this long ago: labs of other
#: checkouts (another branch's recipe) on the same machine keep theirs meanwhile, instead
#: of each build removing the other's layers and the next `lab up` rebuilding them.
UNUSED_KEEP_S = 24 * 3600.0


def _remove_unused(cache_dir: Path, keep: tuple[Path, ...], now: float | None = None) -> None:
    mounts = Path("/proc/self/mountinfo").read_text()
    now = time.time() if now is None else now
    for p in [*cache_dir.glob("base-*"), *cache_dir.glob("prep-*")]:
        if (
            p not in keep
            and f"{p}:" not in mounts
            and f"{p}," not in mounts
            and f"{p} " not in mounts
            and now - p.stat().st_mtime > UNUSED_KEEP_S
        ):
            _remove_tree(p)


def in_use(cache_dir: Path) -> bool:
    """True while some overlay mount uses a layer under ``cache_dir``."""
    text = Path("/proc/self/mountinfo").read_text()
    return any(f"{cache_dir}/{layer}-" in text for layer in ("base", "prep"))


def remove(cache_dir: Path) -> None:
    """Delete every cached layer (refused while a lab host uses one)."""
    if in_use(cache_dir):
        raise LabError(f"a running lab uses the template in {cache_dir}; `clusterctl lab down` first")
    for p in list(cache_dir.glob("base-*")) + list(cache_dir.glob("prep-*")):
        _remove_tree(p)


def _tmp_for(final: Path) -> Path:
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    _remove_tree(tmp)
    return tmp


def _remove_tree(p: Path) -> None:
    if p.exists() or p.is_symlink():
        shutil.rmtree(p)


def _build_base(final: Path, on_event: Event) -> None:
    uri, keyring = apt_mirror()
    tmp = _tmp_for(final)
    on_event(f"building the Debian {SUITE} template with debootstrap (about a minute, once)")
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}"]
    if keyring and Path(keyring).is_file():
        argv.append(f"--keyring={keyring}")
    argv += [SUITE, str(tmp), uri]
    try:
        run(argv, timeout=DEBOOTSTRAP_TIMEOUT_S)
        # debootstrap copies the build machine's name; nspawn -M sets each host's.
        (tmp / "etc/hostname").unlink(missing_ok=True)
        (tmp / "var/cache/apt/archives").mkdir(parents=True, exist_ok=True)
        for deb in (tmp / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        os.chmod(tmp, 0o755)
        tmp.rename(final)
    except BaseException:
        _remove_tree(tmp)
        raise
    on_event(f"template base cached in {final}")


def _build_prep(base: Path, final: Path, on_event: Event) -> None:
    """Write the prep layer as the upper dir of an overlay over ``base``."""
    tmp = _tmp_for(final)
    work = final.with_name(f".work-{final.name}-{os.getpid()}")
    merged = final.with_name(f".mnt-{final.name}-{os.getpid()}")
    _remove_tree(work)
    for d in (tmp, work, merged):
        d.mkdir(parents=True)
    on_event("preparing the template layer")
    mounted = False
    try:
        run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={base},upperdir={tmp},workdir={work}", str(merged)])
        mounted = True
        prepare_rootfs(merged)
        _install_hardware(merged, on_event)

        vllm_install.install_into_rootfs(merged)
        run(["umount", str(merged)])
        mounted = False
        os.chmod(tmp, 0o755)
        tmp.rename(final)
    except BaseException:
        if mounted:
            run(["umount", "-l", str(merged)], check=False)
        _remove_tree(tmp)
        raise
    finally:
        _remove_tree(work)
        if merged.is_dir():
            merged.rmdir()
    on_event(f"template layer cached in {final}")


def prepare_rootfs(root: Path) -> None:
    """Apply the lab's settings to a mounted template root (lab.md §3.1)."""
    (root / "etc/machine-id").write_text("")  # a fresh transient id on each boot
    (root / "etc/hostname").unlink(missing_ok=True)
    unit_dir = root / "etc/systemd/system"
    unit_dir.mkdir(parents=True, exist_ok=True)
    for unit in MASKED_UNITS:
        link = unit_dir / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    # nginx and keepalived (the gateway) are installed on every host but run only where
    # `gateway deploy` (or a test) starts them.
    # (The links are absolute: they dangle seen from here, so no glob, which follows them.)
    for wants in unit_dir.glob("*.wants"):
        for unit in ("nginx.service", "keepalived.service"):
            (wants / unit).unlink(missing_ok=True)
    jd = root / "etc/systemd/journald.conf.d"
    jd.mkdir(parents=True, exist_ok=True)
    # A persistent journal would add ~8 MB to every host's upper dir.
    (jd / "lab.conf").write_text("[Journal]\nStorage=volatile\nRuntimeMaxUse=16M\n")
    (root / "etc/default").mkdir(exist_ok=True)
    (root / "etc/default/locale").write_text("LANG=C.UTF-8\n")
    # Clones must not share host keys (lab.md P14): each host gets its own.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    # adm and systemd-journal: as on many sites' operator accounts, ops reads the
    # kernel log (kern.log is root:adm 0640; the journal admits both groups).
    run(
        [
            "chroot",
            str(root),
            "/usr/sbin/useradd",
            "--create-home",
            "--shell",
            "/bin/bash",
            "--groups",
            "adm,systemd-journal",
            "--comment",
            "lab operator",
            OPS_USER,
        ]
    )
    # The kernel log a node with rsyslog has (containers get no kernel messages in
    # their journal); simulated faults append NVRM/OOM lines to it.
    kern = root / "var/log/kern.log"
    kern.parent.mkdir(parents=True, exist_ok=True)
    kern.touch()
    run(["chroot", str(root), "/bin/chown", "root:adm", "/var/log/kern.log"])
    os.chmod(kern, 0o640)
    sudoers = root / "etc/sudoers.d" / OPS_USER
    sudoers.write_text(f"{OPS_USER} ALL=(ALL) NOPASSWD: ALL\n")
    os.chmod(sudoers, 0o440)


def _install_hardware(root: Path, on_event: Event) -> None:
    install = getattr(hardware, "install_into_rootfs", None)
    if install is not None:
        on_event("installing the simulated hardware into the template")
        install(root)


def user_ids(root: Path, user: str) -> tuple[int, int]:
    """``(uid, gid)`` of ``user`` in the template's /etc/passwd."""
    for line in (root / "etc/passwd").read_text().splitlines():
        f = line.split(":")
        if f[0] == user:
            return int(f[2]), int(f[3])
    raise LabError(f"user {user!r} missing from the lab template {root}")
