"""One lab host's container: its directory, overlay root and systemd-nspawn.

Layout of ``hosts/NAME/`` on the control side::

    upper/   the host's persistent changes (overlay upper dir)
    work/    overlayfs work dir
    root/    the mounted root (lowerdir = template layers)
    hw/      simulated hardware state (bound at /var/lib/lab-hw), when present
    nspawn.pid, console.log

The container runs under :mod:`clusterctl.lab.hostrun` (own cgroup, reboot
loop); its PID is recorded by the caller, nspawn's in ``nspawn.pid``.
Stopping is done for all hosts at once by :mod:`clusterctl.lab.manager`.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from clusterctl.lab import procs
from clusterctl.lab._run import ok, run
from clusterctl.lab.config import HostSpec, LabConfig
from clusterctl.lab.sshkeys import install_authorized_key, make_host_key
from clusterctl.lab.template import OPS_USER, Template, user_ids
from clusterctl.lab import realvllm

#: sshd settings of every host but the one that keeps Debian's defaults.
LAB_SSHD_CONF = (
    "# clusterctl lab: quieter, faster sshd for many parallel connections\n"
    "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
    "UseDNS no\nMaxStartups 100:30:200\nMaxSessions 64\n"
)
HW_MOUNT = "/var/lib/lab-hw"
#: Seconds a container gets to power off after SIGTERM before it is killed.
STOP_GRACE_S = 10.0


def host_dir(cfg: LabConfig, name: str) -> Path:
    return cfg.hosts_dir / name


def cgroup_rel(cfg: LabConfig, name: str) -> str:
    return f"{cfg.cgroup_name}/{name}"


def prepare(cfg: LabConfig, h: HostSpec, tpl: Template, pubkey: str, *, debian_sshd: bool, etc_hosts: str) -> str:
    """Create the host's directory and upper-dir files; return its host public key.

    ``debian_sshd`` keeps Debian's default sshd settings on this host (the
    non-root ``ops`` path); other hosts get :data:`LAB_SSHD_CONF`.
    """
    d = host_dir(cfg, h.name)
    upper = d / "upper"
    for sub in ("upper", "work", "root"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o755)
    _mkdir_like(tpl, upper, "root")
    install_authorized_key(upper / "root", pubkey)
    uid, gid = user_ids(tpl.prep, OPS_USER)
    _mkdir_like(tpl, upper, f"home/{OPS_USER}")
    install_authorized_key(upper / "home" / OPS_USER, pubkey, uid, gid)
    conf = upper / "etc/ssh/sshd_config.d/lab.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    if debian_sshd:
        conf.unlink(missing_ok=True)
    else:
        conf.write_text(LAB_SSHD_CONF)
    (upper / "etc/hosts").write_text(etc_hosts)
    return make_host_key(upper, f"root@{h.name}")


def _mkdir_like(tpl: Template, upper: Path, rel: str) -> None:
    """Create ``upper/rel`` with the owner and mode the template gives it.

    An overlay directory takes its attributes from the upper layer, so a
    plain ``mkdir`` would hand ``/home/ops`` to root.
    """
    for layer in (tpl.prep, tpl.base):
        src = layer / rel
        if src.is_dir():
            st = src.stat()
            dst = upper / rel
            dst.mkdir(parents=True, exist_ok=True)
            os.chown(dst, st.st_uid, st.st_gid)
            os.chmod(dst, stat.S_IMODE(st.st_mode))
            return
    (upper / rel).mkdir(parents=True, exist_ok=True)


def mount_root(cfg: LabConfig, h: HostSpec, tpl: Template) -> None:
    d = host_dir(cfg, h.name)
    if _is_mountpoint(d / "root"):
        return
    run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={tpl.lowerdir},upperdir={d / 'upper'},workdir={d / 'work'}",
            str(d / "root"),
        ]
    )


def _is_mountpoint(p: Path) -> bool:
    return os.path.ismount(p)


def real_engine_binds() -> list[str]:
    """Read-only binds that make the installed real vLLM engine (and its tiny model) run in a host:
    the cache at the same path (its venv runs on the host's own /usr/bin/python3.11) and libnuma,
    which vLLM's CPU kernels link and the minimal template lacks.  Nothing when not installed."""
    if realvllm.installed() is None:
        return []
    out = [f"--bind-ro={realvllm.CACHE_ROOT}"]
    numa = Path("/usr/lib/x86_64-linux-gnu/libnuma.so.1")
    if numa.exists():
        out.append(f"--bind-ro={numa.resolve()}:{numa}")
    return out


def router_binds() -> list[str]:
    """A read-only bind of vllm-router's venv (scripts/install-vllm-router) at the same path: it runs on the
    hosts' own /usr/bin/python3.11, so a prefill/decode pool's router unit runs in a lab host as deployed
    (docs/disaggregation.md).  Nothing when not installed."""
    root = Path("/var/cache/clusterctl-vllm-router")  # deploy/units/pd.py ROUTER_BIN lies in it
    return [f"--bind-ro={root}"] if (root / "venv" / "bin" / "vllm-router").exists() else []


def launch(cfg: LabConfig, h: HostSpec) -> int:
    """Start the host's container in the background; return the supervisor's PID."""
    d = host_dir(cfg, h.name)
    argv = [
        "systemd-nspawn",
        "-D",
        str(d / "root"),
        "-M",
        h.name,
        "--register=no",
        "--keep-unit",
        "--link-journal=no",
        f"--network-namespace-path=/run/netns/{h.netns}",
        "-b",
        "--console=passive",
        # Root on a real GPU server may lock memory (RDMA registration, `stage pin`);
        # without this nspawn's seccomp filter refuses mlock() with EPERM.
        # CAP_NET_ADMIN: keepalived on a gateway host adds and removes the floating address
        # (docs/gateway.md); it acts on the host's own network namespace only.
        "--capability=CAP_IPC_LOCK,CAP_NET_ADMIN",
    ]
    argv += real_engine_binds() + router_binds()
    hw = d / "hw"
    if hw.is_dir():
        argv.append(f"--bind={hw}:{HW_MOUNT}")
        if (hw / "sys-class").is_dir():
            argv.append(f"--bind-ro={hw / 'sys-class'}:/sys/class")
    log = open(d / "console.log", "ab")
    try:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "clusterctl.lab.hostrun",
                cgroup_rel(cfg, h.name),
                str(d / "nspawn.pid"),
                "--",
                *argv,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        log.close()
    return p.pid


def unmount_root(cfg: LabConfig, name: str) -> None:
    root = host_dir(cfg, name) / "root"
    for _ in range(50):
        if not _is_mountpoint(root):
            return
        if ok(["umount", str(root)]):
            return
        time.sleep(0.1)
    run(["umount", "-l", str(root)])


def remove_cgroups(cfg: LabConfig, name: str | None = None) -> None:
    """Remove the host's (or, with ``name=None``, the lab's) cgroup dirs, depth first."""
    rel = cgroup_rel(cfg, name) if name else cfg.cgroup_name
    procs.remove_cgroup_tree(rel)
