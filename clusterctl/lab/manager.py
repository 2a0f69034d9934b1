"""Bring a lab up, tear it down, report its status.

``up`` is idempotent: a lab already running with the same size is left as
it is; anything else recorded or left over (after a crash: stale netns,
mounts, processes, cgroups) is cleaned up first.  ``down`` leaves nothing:
processes (by recorded PID, then by the host's cgroup), overlay mounts,
namespaces, veths, the bridge, cgroup dirs, nspawn's /run leftovers, the
lab's files, and the raised inotify limit.

Progress is reported through ``on_event(str)``; nothing here prints.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from clusterctl.errors import LabError
from clusterctl.lab import container, inventory_file, light, limits, net, netfaults, procs, ready, sshkeys
from clusterctl.lab import hardware as hardware_package
from clusterctl.lab import state as st
from clusterctl.lab import template
from clusterctl.lab.config import HostSpec, LabConfig, plan_hosts
from clusterctl.lab.hardware.profiles import gpu_profile

Event = Callable[[str], None]
#: Seconds ``up`` waits for all hosts to be ready: a base plus a share per host.
READY_BASE_S = 60.0
READY_PER_HOST_S = 0.5
REQUIRED_TOOLS = ("systemd-nspawn", "ip", "mount", "umount", "ssh", "ssh-keygen")
NSPAWN_RUN = Path("/run/systemd/nspawn")


def require_root() -> None:
    """Raise :class:`LabError` unless running as root with the needed tools."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, mounts, systemd-nspawn); run it with sudo")
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        raise LabError(
            f"missing tools: {', '.join(missing)} (Debian packages: systemd-container, iproute2, openssh-client)"
        )


def hardware() -> ModuleType | None:
    """The simulated-hardware package, when it is present."""
    return hardware_package


@dataclass
class UpResult:
    state: st.LabState
    inventory: Path
    already_up: bool
    template_s: float = 0.0
    ready_s: float = 0.0


def up(
    cfg: LabConfig,
    hosts: int = 4,
    gpus_per_host: int = 8,
    gpu_model: str = inventory_file.DEFAULT_GPU_MODEL,
    on_event: Event = lambda s: None,
) -> UpResult:
    """Bring up ``hosts`` nspawn hosts and write the inventory (root only)."""
    require_root()
    cfg.validate()
    if gpus_per_host < 0 or gpus_per_host > 16:
        raise LabError(f"--gpus-per-host must be between 0 and 16, not {gpus_per_host}")
    specs = plan_hosts(cfg, hosts)
    if hardware() is not None:
        gpu_profile(gpu_model)  # an unknown model fails here, naming the known ones
    old = st.load(cfg.state_file)
    if old is not None and _same_and_alive(cfg, old, specs, gpus_per_host, gpu_model):
        on_event(f"lab already up with {hosts} hosts")
        return UpResult(old, cfg.inventory_file, already_up=True)
    if old is not None or _leftovers(cfg):
        on_event("cleaning up an earlier lab first")
        down(cfg, on_event=lambda s: on_event(f"  {s}"))

    t0 = time.monotonic()
    tpl = template.ensure(cfg.cache_dir, on_event)
    t_template = time.monotonic() - t0
    cfg.lab_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(cfg.lab_dir, 0o755)
    # Every host is recorded before anything is created, so `down` finds it all.
    state = st.LabState(
        hosts=[st.HostState(h) for h in specs],
        gpus_per_host=gpus_per_host,
        gpu_model=gpu_model,
        template=tpl.lowerdir,
        started_at=time.time(),
    )
    state.inotify_saved = limits.hold(str(cfg.lab_dir))
    st.save(cfg.state_file, state)

    t1 = time.monotonic()
    hw = hardware()
    try:
        _start_hosts(cfg, specs, tpl, state, hw, on_event)
    except BaseException:
        on_event("start failed: removing what was created")
        down(cfg, on_event=lambda s: on_event(f"  {s}"))
        raise

    results = ready.wait_all(
        cfg,
        specs,
        READY_BASE_S + READY_PER_HOST_S * hosts,
        on_ready=lambda r: on_event(f"{r.name}: {r.state} after {r.seconds:.1f} s {r.detail}".rstrip()),
    )
    bad = [r for r in results if r.state != "running"]
    if bad:
        raise LabError(
            "hosts not ready: "
            + "; ".join(f"{r.name} {r.state} {r.detail}".strip() for r in bad)
            + f" (console logs in {cfg.hosts_dir}/NAME/console.log; "
            "`clusterctl lab down` cleans up)"
        )
    state.ready_s = time.monotonic() - t1
    hardware_desc = (
        {h.name: hw.describe_host(container.host_dir(cfg, h.name)) for h in specs} if hw is not None else None
    )
    inventory_file.write(
        cfg.inventory_file,
        inventory_file.build(
            cfg,
            specs,
            gpus=gpus_per_host,
            gpu_model=gpu_model,
            hardware=hardware_desc,
            inbox=[h.name for h in specs if nic_flavour(h.index) == "inbox"] if hw else (),
        ),
    )
    st.save(cfg.state_file, state)
    on_event(f"lab up: {hosts} hosts ready in {state.ready_s:.1f} s; inventory {cfg.inventory_file}")
    return UpResult(state, cfg.inventory_file, already_up=False, template_s=t_template, ready_s=state.ready_s)


def light_dir(cfg: LabConfig) -> Path:
    """Where light mode (``clusterctl.lab.light``) keeps its hosts."""
    return cfg.lab_dir / "light"


def up_light(cfg: LabConfig, hosts: int, on_event: Event = lambda s: None) -> dict[str, Any]:
    """Light mode: sshd-only hosts on 127.1.x.y for scale tests (no systemd).

    Runs beside an nspawn lab if one is up; ``lab down`` stops both.
    """
    require_root()

    on_event(f"starting {hosts} light hosts")
    t0 = time.monotonic()
    inv = light.up(light_dir(cfg), hosts)
    on_event(f"light lab up: {hosts} hosts in {time.monotonic() - t0:.1f} s; inventory {inv}")
    return {"inventory": str(inv), "hosts": hosts, "up_s": time.monotonic() - t0}


def _start_hosts(
    cfg: LabConfig,
    specs: list[HostSpec],
    tpl: template.Template,
    state: st.LabState,
    hw: ModuleType | None,
    on_event: Event,
) -> None:
    """Create each host's network, files and hardware and launch it at once,
    so earlier hosts boot while later ones are prepared."""
    pubkey = sshkeys.ensure_client_key(cfg.key_file)
    net.ensure_bridge(cfg)
    etc_hosts = _etc_hosts(specs)
    host_keys: list[tuple[list[str], str]] = []
    on_event(f"starting {len(specs)} hosts")
    for h, hs in zip(specs, state.hosts):
        net.create_host_net(cfg, h)
        key = container.prepare(cfg, h, tpl, pubkey, debian_sshd=(h is specs[-1]), etc_hosts=etc_hosts)
        host_keys.append(([h.name, h.address], key))
        if hw is not None:
            # The hardware part counts hosts from 0.
            hw.provision_host(
                container.host_dir(cfg, h.name),
                h.name,
                h.index - 1,
                state.gpus_per_host,
                state.gpu_model,
                nic_flavour(h.index),
            )
            hw.setup_netns(h.netns, h.name, h.index - 1)
        container.mount_root(cfg, h, tpl)
        hs.pid = container.launch(cfg, h)
        st.save(cfg.state_file, state)
    sshkeys.write_known_hosts(cfg.known_hosts, host_keys)
    state.ticker_pid = _start_ticker(cfg)
    st.save(cfg.state_file, state)


def nic_flavour(index: int) -> str:
    """Every fourth host (lab03, lab07, ...) has the inbox NIC driver, the rest
    NVIDIA's stack (mlnx_qos, ECN sysfs), so both code paths are exercised."""
    return "inbox" if index % 4 == 3 else "mlnx"


def _etc_hosts(specs: list[HostSpec]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{h.address}\t{h.name}" for h in specs]
    return "\n".join(lines) + "\n"


def _start_ticker(cfg: LabConfig) -> int | None:
    """Start the hardware ticker (advances simulated counters) if it exists."""
    if hardware() is None or not (Path(__file__).parent / "hardware" / "ticker.py").is_file():
        return None
    log = open(cfg.lab_dir / "ticker.log", "ab")
    try:
        # In the lab's cgroup, so `down` finds it even when the state was lost.
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "clusterctl.lab.hostrun",
                ticker_cgroup(cfg),
                str(cfg.lab_dir / "ticker.pid"),
                "--",
                sys.executable,
                "-m",
                "clusterctl.lab.hardware.ticker",
                str(cfg.lab_dir),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    return p.pid


def ticker_cgroup(cfg: LabConfig) -> str:
    return f"{cfg.cgroup_name}/ticker"


def _same_and_alive(cfg: LabConfig, old: st.LabState, specs: list[HostSpec], gpus: int, model: str) -> bool:
    return (
        [h.spec for h in old.hosts] == specs
        and old.gpus_per_host == gpus
        and old.gpu_model == model
        and old.ready_s is not None
        and all(h.pid is not None and _host_alive(cfg, h) for h in old.hosts)
    )


def _host_alive(cfg: LabConfig, h: st.HostState) -> bool:
    return h.pid is not None and procs.is_ours(h.pid, f"{container.host_dir(cfg, h.spec.name)}/")


def _leftovers(cfg: LabConfig) -> bool:
    return (
        (cfg.hosts_dir.is_dir() and any(cfg.hosts_dir.iterdir()))
        or net.link_exists(cfg.bridge)
        or bool(procs.cgroup_dirs(cfg.cgroup_name))
    )


def _known_hosts(cfg: LabConfig, old: st.LabState | None) -> list[HostSpec]:
    """Hosts to clean up: the recorded ones plus any host dir left on disk."""
    specs = {h.spec.name: h.spec for h in (old.hosts if old else [])}
    if cfg.hosts_dir.is_dir():
        for d in sorted(cfg.hosts_dir.iterdir()):
            if d.name not in specs and d.name.startswith(cfg.prefix):
                specs[d.name] = HostSpec(d.name, 0, "", "")
    return list(specs.values())


def down(cfg: LabConfig, on_event: Event = lambda s: None) -> None:
    """Stop every host of the lab and remove everything ``up`` created (root only)."""
    require_root()
    old = st.load(cfg.state_file)
    if light_dir(cfg).is_dir():
        on_event(f"stopped {light.down(light_dir(cfg))} light hosts")
    specs = _known_hosts(cfg, old)
    pids = {h.spec.name: h.pid for h in (old.hosts if old else [])}
    ticker = old.ticker_pid if old is not None else None
    if ticker and procs.is_ours(ticker, str(cfg.lab_dir / "ticker.pid")):
        procs.signal_pid(ticker, signal.SIGTERM)
    else:
        ticker = None
    t0 = time.monotonic()
    _stop_all(cfg, specs, pids)
    if specs:
        on_event(f"stopped {len(specs)} hosts in {time.monotonic() - t0:.1f} s")
    for h in specs:
        container.unmount_root(cfg, h.name)
        net.delete_host_net(h)
        container.remove_cgroups(cfg, h.name)
        _remove_nspawn_run(h.name)
    net.delete_bridge(cfg)
    if ticker:
        _wait_gone([ticker], 3.0, kill=True)
    procs.kill_cgroup(ticker_cgroup(cfg))
    # The lab's own cgroup goes last: the ticker's cgroup is inside it, and a process that
    # was just killed can keep it busy for a moment.
    deadline = time.monotonic() + 3.0
    container.remove_cgroups(cfg)
    while procs.cgroup_dirs(cfg.cgroup_name) and time.monotonic() < deadline:
        time.sleep(0.1)
        container.remove_cgroups(cfg)
    # "models" and "workload.yaml": what `clusterctl lab workload` wrote there by default.
    for name in ("hosts", "ssh", "models"):
        if (cfg.lab_dir / name).exists():
            shutil.rmtree(cfg.lab_dir / name)
    for name in ("inventory.yaml", "workload.yaml", "ticker.log", "ticker.pid", "state.json"):
        (cfg.lab_dir / name).unlink(missing_ok=True)
    if limits.release(str(cfg.lab_dir)):
        on_event("inotify limit restored")
    try:
        cfg.lab_dir.rmdir()
    except OSError:
        pass  # not empty: someone else's files; leave them
    on_event("lab down")


def _stop_all(cfg: LabConfig, specs: list[HostSpec], pids: dict[str, int | None]) -> None:
    """SIGTERM every host at once, then SIGKILL what is left after the grace time."""
    recorded: list[int] = []
    for h in specs:
        rel = container.cgroup_rel(cfg, h.name)
        procs.thaw_cgroup(rel)
        hd = container.host_dir(cfg, h.name)
        for p in (pids.get(h.name), procs.read_pidfile(hd / "nspawn.pid")):
            if p and procs.is_ours(p, f"{hd}/"):
                recorded.append(p)
                procs.signal_pid(p, signal.SIGTERM)
    _wait_gone(recorded, container.STOP_GRACE_S, kill=True)
    for h in specs:
        procs.kill_cgroup(container.cgroup_rel(cfg, h.name))


def _wait_gone(pids: list[int], timeout_s: float, kill: bool) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(procs.alive(p) for p in pids):
        time.sleep(0.05)
    if kill:
        for p in pids:
            if procs.alive(p):
                procs.signal_pid(p, signal.SIGKILL)
        _wait_gone(pids, 2.0, kill=False)


def _remove_nspawn_run(name: str) -> None:
    """nspawn cannot remove its propagate dir on a disk /run (lab.md P11)."""
    for p in (NSPAWN_RUN / "propagate" / name, NSPAWN_RUN / "incoming" / name):
        if p.exists():
            shutil.rmtree(p, ignore_errors=True)
    for p in (NSPAWN_RUN / "propagate", NSPAWN_RUN / "incoming", NSPAWN_RUN / "locks", NSPAWN_RUN):
        try:
            p.rmdir()
        except OSError:
            pass


@dataclass
class HostStatus:
    name: str
    address: str
    pid: int | None
    running: bool
    frozen: bool
    faults: list[str]


def status(cfg: LabConfig) -> dict[str, Any]:
    """What runs now, from the recorded state and the live processes (no SSH)."""
    old = st.load(cfg.state_file)
    light_hosts = []
    if light_dir(cfg).is_dir():
        light_hosts = [dataclasses.asdict(h) for h in light.status(light_dir(cfg))]
    if old is None:
        return {"up": bool(light_hosts), "lab_dir": str(cfg.lab_dir), "hosts": [], "light_hosts": light_hosts}

    hosts = []
    for h in old.hosts:
        rel = container.cgroup_rel(cfg, h.spec.name)
        hosts.append(
            {
                "name": h.spec.name,
                "address": h.spec.address,
                "pid": h.pid,
                "running": _host_alive(cfg, h),
                "frozen": procs.is_frozen(rel),
                "faults": netfaults.active(cfg, h.spec.name),
            }
        )
    return {
        "up": True,
        "lab_dir": str(cfg.lab_dir),
        "inventory": str(cfg.inventory_file),
        "gpus_per_host": old.gpus_per_host,
        "gpu_model": old.gpu_model,
        "ready_s": old.ready_s,
        "hosts": hosts,
        "light_hosts": light_hosts,
    }


def find_host(cfg: LabConfig, name: str) -> HostSpec:
    """The running lab's host ``name`` (or address), or :class:`LabError`."""
    old = st.load(cfg.state_file)
    if old is None:
        raise LabError(f"no lab is up in {cfg.lab_dir}; run `clusterctl lab up` first")
    for h in old.hosts:
        if name in (h.spec.name, h.spec.address):
            return h.spec
    names = ", ".join(h.spec.name for h in old.hosts)
    raise LabError(f"no lab host {name!r} (hosts: {names})")
