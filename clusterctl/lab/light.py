"""Light-mode lab: one real OpenSSH sshd per host on a loopback address.

Each host is ``/usr/sbin/sshd -D`` listening on ``127.1.x.y:22`` (explicit
``ListenAddress``; nothing listens on 0.0.0.0) inside its own mount, UTS and
PID namespaces (``unshare``), with its own hostname, its own ``/root``
(root's real ``~/.bashrc`` may run pyenv, ~100 ms per command, pitfall P8)
and a private ``/run``.  There is no systemd and no fake hardware: this mode
serves fan-out scale tests (hundreds to thousands of hosts, ~2 MB each).

Layout under ``lab_dir`` (default ``/var/lib/clusterctl-lab/light``, root
owned, 0755, so sshd's StrictModes checks pass)::

    hostinit.sh            PID 1 of every host namespace
    keys/id_ed25519[.pub]  the client key
    known_hosts            every host's key, prefilled (strict mode works)
    inventory.yaml         the inventory (docs/inventory.md format)
    state.json             hosts and the recorded PIDs of their unshare process
    hosts/NAME/            host key, sshd_config, authorized_keys/, root/, sshd.log

Stopping (pitfall P5): SIGKILL to the recorded ``unshare`` PID; with
``--kill-child`` the kernel then kills the host's whole PID namespace,
including open sessions.  PIDs are checked against their command line
before any signal, never found by process name.

Requires root.  ``up`` for 1000 hosts takes about 20 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clusterctl.errors import LabError

DEFAULT_LAB_DIR = Path("/var/lib/clusterctl-lab/light")
SSHD = "/usr/sbin/sshd"
UNSHARE = "/usr/bin/unshare"
MAX_HOSTS = 250 * 250
READY_TIMEOUT_S = 120.0

_HOSTINIT = """#!/bin/sh
# PID 1 of one light-mode lab host (written by clusterctl.lab.light).
# $1 = host directory, $2 = host name.
set -eu
hostname "$2"
mount --bind "$1/root" /root
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -m 0755 /run/sshd
trap 'kill -TERM $child 2>/dev/null; exit 0' TERM INT
{sshd} -D -f "$1/sshd_config" -E "$1/sshd.log" </dev/null &
child=$!
wait $child
"""


@dataclass
class HostSpec:
    """One light host.  ``extra_config``: more sshd_config lines.
    ``users``: extra login users (name -> authorized public key lines)."""

    name: str
    address: str
    port: int = 22
    extra_config: list[str] = field(default_factory=list)
    users: dict[str, str] = field(default_factory=dict)


@dataclass
class HostState:
    name: str
    address: str
    port: int
    pid: int | None
    alive: bool
    listening: bool


def address_for(index: int, base: str = "127.1") -> str:
    """Address of host ``index`` (0-based): ``base.(i // 250).(i % 250 + 1)``."""
    parts = base.split(".")
    if len(parts) != 2 or parts[0] != "127" or not parts[1].isdigit() or not 0 <= int(parts[1]) <= 255:
        raise LabError(f"light lab base must look like '127.N' (got {base!r})")
    if not 0 <= index < MAX_HOSTS:
        raise LabError(f"host index {index} out of range (at most {MAX_HOSTS} hosts)")
    return f"{base}.{index // 250}.{index % 250 + 1}"


def _write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _keypair(comment: str) -> tuple[bytes, str]:
    """A new ed25519 key: (OpenSSH private key PEM, ``ssh-ed25519 AAAA... comment``)."""
    key = Ed25519PrivateKey.generate()
    priv = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return priv, f"{pub} {comment}"


def _known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def _sshd_config(d: Path, spec: HostSpec) -> str:
    lines = [
        f"ListenAddress {spec.address}:{spec.port}",
        f"HostKey {d}/ssh_host_ed25519_key",
        f"PidFile {d}/sshd.pid",
        f"AuthorizedKeysFile {d}/authorized_keys/%u",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        # The lab's key files are root-owned in root-owned dirs; harness dirs
        # may sit under /tmp (1777), which StrictModes refuses (pitfall P2).
        "StrictModes no",
        "PrintMotd no",
        "PrintLastLog no",
        "UseDNS no",
        "MaxStartups 200:30:400",
        "MaxSessions 64",
        "AllowTcpForwarding yes",
        "LogLevel INFO",
        "Subsystem sftp /usr/lib/openssh/sftp-server",
    ]
    return "\n".join(spec.extra_config + lines) + "\n"  # first value wins in sshd_config


def _listening(wanted: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Which (address, port) pairs have a TCP listener, from /proc/net/tcp."""
    found: set[tuple[str, int]] = set()
    try:
        text = Path("/proc/net/tcp").read_text()
    except OSError:
        return found
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 4 or f[3] != "0A":
            continue
        hexaddr, hexport = f[1].split(":")
        raw = bytes.fromhex(hexaddr)[::-1]
        pair = (".".join(str(b) for b in raw), int(hexport, 16))
        if pair in wanted:
            found.add(pair)
    return found


def _is_our_process(pid: int, lab_dir: Path) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmd) and cmd[0].endswith(b"unshare") and str(lab_dir / "hostinit.sh").encode() in cmd


# Popen objects of hosts started by this process, so their exit is reaped (P7).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _check_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the light lab needs root (it starts sshd in new namespaces)")
    for tool in (SSHD, UNSHARE):
        if not os.access(tool, os.X_OK):
            raise LabError(f"{tool} not found; install openssh-server and util-linux")


def start_hosts(
    lab_dir: Path, specs: list[HostSpec], *, client_pubkey: str, ready_timeout: float = READY_TIMEOUT_S
) -> dict[str, str]:
    """Write each host's files, start it, wait until every sshd listens.

    Returns ``{name: "ssh-ed25519 BASE64"}`` (each host's public key).  On a
    failure the hosts already started are stopped and :class:`LabError`
    names the hosts and the end of their log.
    """
    _check_root()
    lab_dir = Path(lab_dir)
    (lab_dir / "hosts").mkdir(parents=True, exist_ok=True, mode=0o755)
    init = lab_dir / "hostinit.sh"
    if not init.exists():
        _write_atomic(init, _HOSTINIT.replace("{sshd}", SSHD), 0o755)
    state = _read_state(lab_dir)
    clash = {s.name for s in specs} & set(state)
    if clash:
        raise LabError(f"hosts already running in {lab_dir}: {', '.join(sorted(clash))}")
    keys: dict[str, str] = {}
    started: dict[str, dict[str, object]] = {}
    try:
        for spec in specs:
            d = lab_dir / "hosts" / spec.name
            (d / "root").mkdir(parents=True, exist_ok=True, mode=0o700)
            (d / "authorized_keys").mkdir(exist_ok=True, mode=0o755)
            priv, pub = _keypair(spec.name)
            _write_atomic(d / "ssh_host_ed25519_key", priv, 0o600)
            _write_atomic(d / "ssh_host_ed25519_key.pub", pub + "\n")
            keys[spec.name] = " ".join(pub.split()[:2])
            _write_atomic(d / "authorized_keys" / "root", client_pubkey.strip() + "\n", 0o644)
            for user, authorized in spec.users.items():
                _write_atomic(d / "authorized_keys" / user, authorized.strip() + "\n", 0o644)
            _write_atomic(d / "sshd_config", _sshd_config(d, spec))
            log = open(d / "init.log", "wb")
            p = subprocess.Popen(
                [
                    UNSHARE,
                    "--mount",
                    "--uts",
                    "--pid",
                    "--fork",
                    "--kill-child",
                    "--mount-proc",
                    "--propagation",
                    "private",
                    "/bin/sh",
                    str(init),
                    str(d),
                    spec.name,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
            log.close()
            _CHILDREN[p.pid] = p
            started[spec.name] = {"address": spec.address, "port": spec.port, "pid": p.pid}
        _write_state(lab_dir, {**state, **started})
        wanted = {(s.address, s.port) for s in specs}
        end = time.monotonic() + ready_timeout
        while True:
            missing = wanted - _listening(wanted)
            if not missing:
                break
            dead = [s for s in specs if _CHILDREN[started[s.name]["pid"]].poll() is not None]  # type: ignore[index]
            if dead or time.monotonic() > end:
                bad = dead or [s for s in specs if (s.address, s.port) in missing]
                tail = (lab_dir / "hosts" / bad[0].name / "init.log").read_text(errors="replace")[-400:]
                log_tail = ""
                sshd_log = lab_dir / "hosts" / bad[0].name / "sshd.log"
                if sshd_log.exists():
                    log_tail = sshd_log.read_text(errors="replace")[-400:]
                raise LabError(
                    f"{len(bad)} light host(s) did not start "
                    f"({', '.join(s.name for s in bad[:5])}...): {tail.strip()} {log_tail.strip()}"
                )
            time.sleep(0.1)
    except BaseException:
        stop_hosts(lab_dir, list(started))
        raise
    return keys


def stop_hosts(lab_dir: Path, names: list[str] | None = None, *, timeout: float = 30.0) -> int:
    """Stop the named hosts (all when ``None``); return how many were stopped."""
    lab_dir = Path(lab_dir)
    state = _read_state(lab_dir)
    names = list(state) if names is None else [n for n in names if n in state]
    pids: list[int] = []
    for n in names:
        pid = int(state[n]["pid"])  # type: ignore[call-overload]
        if _is_our_process(pid, lab_dir):
            try:
                os.kill(pid, signal.SIGKILL)
                pids.append(pid)
            except ProcessLookupError:
                pass
    end = time.monotonic() + timeout
    for pid in pids:
        child = _CHILDREN.pop(pid, None)
        if child is not None:
            try:
                child.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        else:
            while _is_our_process(pid, lab_dir) and time.monotonic() < end:
                time.sleep(0.05)
    wanted = {(str(state[n]["address"]), int(state[n]["port"])) for n in names}  # type: ignore[call-overload]
    while _listening(wanted) and time.monotonic() < end:
        time.sleep(0.05)
    left = _listening(wanted)
    for n in names:
        state.pop(n, None)
    _write_state(lab_dir, state)
    if left:
        raise LabError(
            f"{len(left)} light host(s) still listening after {timeout:g}s: "
            + ", ".join(f"{a}:{p}" for a, p in sorted(left)[:5])
        )
    return len(pids)


def _read_state(lab_dir: Path) -> dict[str, dict[str, object]]:
    try:
        data = json.loads((lab_dir / "state.json").read_text())
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise LabError(f"{lab_dir / 'state.json'}: unreadable ({e})")
    return dict(data.get("hosts", {}))


def _write_state(lab_dir: Path, hosts: dict[str, dict[str, object]]) -> None:
    _write_atomic(lab_dir / "state.json", json.dumps({"hosts": hosts}, indent=1) + "\n")


def client_key(lab_dir: Path) -> tuple[Path, str]:
    """The lab's client key (created once): (private key path, public key line)."""
    kdir = Path(lab_dir) / "keys"
    kdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    priv = kdir / "id_ed25519"
    if not priv.exists():
        p, pub = _keypair("clusterctl-light-lab")
        _write_atomic(kdir / "id_ed25519.pub", pub + "\n")
        _write_atomic(priv, p, 0o600)
    return priv, (kdir / "id_ed25519.pub").read_text().strip()


def inventory_text(hosts: list[HostSpec], *, identity_file: Path, known_hosts: Path) -> str:
    """An inventory (docs/inventory.md) for the given light hosts."""
    out = [
        "# Written by clusterctl.lab.light: a light-mode lab (sshd per host on loopback).",
        "version: 1",
        "defaults:",
        "  ssh:",
        "    user: root",
        f"    identity_file: {json.dumps(str(identity_file))}",
        f"    known_hosts: {json.dumps(str(known_hosts))}",
        "    host_key_policy: strict",
        "    connect_timeout: 10",
        "  labels: {lab: light}",
        "hosts:",
    ]
    for h in hosts:
        port = f", ssh: {{port: {h.port}}}" if h.port != 22 else ""
        out.append(f"  {h.name}: {{address: {json.dumps(h.address)}{port}}}")
    return "\n".join(out) + "\n"


def up(
    lab_dir: Path = DEFAULT_LAB_DIR, hosts: int = 10, *, base: str = "127.1", port: int = 22, prefix: str = "lh"
) -> Path:
    """Start ``hosts`` light hosts; return the path of the inventory written.

    Host ``i`` (1-based) is ``{prefix}{i:04d}`` on ``address_for(i - 1, base)``.
    Fails with :class:`LabError` when a lab already runs in ``lab_dir``.
    """
    _check_root()
    lab_dir = Path(lab_dir)
    if hosts < 1:
        raise LabError(f"a light lab needs at least one host (got {hosts})")
    if _read_state(lab_dir):
        raise LabError(f"a light lab is already running in {lab_dir}; run down first")
    lab_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    os.chmod(lab_dir, 0o755)
    specs = [HostSpec(f"{prefix}{i:04d}", address_for(i - 1, base), port) for i in range(1, hosts + 1)]
    priv, pub = client_key(lab_dir)
    keys = start_hosts(lab_dir, specs, client_pubkey=pub)
    kh = lab_dir / "known_hosts"
    _write_atomic(kh, "".join(f"{_known_hosts_name(s.address, s.port)} {keys[s.name]}\n" for s in specs), 0o644)
    inv = lab_dir / "inventory.yaml"
    _write_atomic(inv, inventory_text(specs, identity_file=priv, known_hosts=kh))
    return inv


def down(lab_dir: Path = DEFAULT_LAB_DIR) -> int:
    """Stop every host of the lab and remove its files; return how many were stopped."""
    lab_dir = Path(lab_dir)
    if not lab_dir.exists():
        return 0
    n = stop_hosts(lab_dir)
    for name in ("hosts", "keys"):
        shutil.rmtree(lab_dir / name, ignore_errors=True)
    for name in ("state.json", "known_hosts", "inventory.yaml", "hostinit.sh"):
        (lab_dir / name).unlink(missing_ok=True)
    try:
        lab_dir.rmdir()
    except OSError:
        pass  # someone else's files are there: leave them
    return n


def status(lab_dir: Path = DEFAULT_LAB_DIR) -> list[HostState]:
    """Every recorded host: is its process alive, is its sshd listening."""
    lab_dir = Path(lab_dir)
    state = _read_state(lab_dir)
    wanted = {(str(v["address"]), int(v["port"])) for v in state.values()}  # type: ignore[call-overload]
    listening = _listening(wanted)
    out = []
    for name, v in state.items():
        pid = int(v["pid"])  # type: ignore[call-overload]
        addr, port = str(v["address"]), int(v["port"])  # type: ignore[call-overload]
        out.append(HostState(name, addr, port, pid, _is_our_process(pid, lab_dir), (addr, port) in listening))
    return out
