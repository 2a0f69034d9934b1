"""The gateway workflows: ``gateway render | deploy | sync | status`` and ``gateway key add | revoke | list``.

A :class:`GatewayRequest` (the inventory loaded, its deploy state directory resolved, how the
gateway hosts' fleets are built) goes in; each function returns a typed result the CLI renders
(:class:`Rendered`, :class:`Deployed`, :class:`~clusterctl.gateway.sync.SyncResult`,
:class:`Status`, :class:`KeyChange`).  Progress lines go to ``on_event``; problems with the
inventory, the stores or the key are :class:`~clusterctl.errors.ClusterctlError` raised before
any host changed; a gateway host that fails is a row of the result (docs/gateway.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from clusterctl.deploy.placement.deployed import wanted_instances
from clusterctl.deploy.rollout import audit
from clusterctl.deploy.state import utc_now, who_am_i
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.fleet.factory import FleetFactory
from clusterctl.fleet.fleet import Fleet
from clusterctl.gateway import keys as gwkeys
from clusterctl.gateway import state as gwstate

# GatewayHostResult and SyncResult re-exported: the CLI renders them and never imports gateway.deploy/sync
from clusterctl.gateway.deploy import GatewayHostResult as GatewayHostResult
from clusterctl.gateway.deploy import apply_gateway, gateway_status, secret_inputs
from clusterctl.gateway.keys import ClientKey
from clusterctl.gateway.observe import observe
from clusterctl.gateway.render import GatewayFile, ServerState, render_gateway
from clusterctl.gateway.sync import SyncResult as SyncResult
from clusterctl.gateway.sync import decide, sync_gateway
from clusterctl.inventory.model import GatewaySpec, Instance, Inventory

OnEvent = Optional[Callable[[str], None]]


@dataclass(frozen=True)
class GatewayRequest:
    """``inventory`` loaded, ``state_dir`` the deploy state directory resolved; ``fleets`` builds a
    fleet over inventory hosts with the command's SSH options (and sudo password) — unused by
    the workflows that reach no host (render, key list)."""

    inventory: Inventory
    state_dir: Path
    fleets: Optional[FleetFactory] = None

    @property
    def gateway(self) -> GatewaySpec:
        """The inventory's ``gateway:`` section; a :class:`ClusterctlError` without one."""
        gw = self.inventory.gateway
        if gw is None:
            raise ClusterctlError(f"{self.inventory.path}: no 'gateway:' section (docs/inventory.md)")
        return gw

    def instances(self) -> dict[str, Instance]:
        """The instances the gateway fronts: the inventory's and the placed template replicas."""
        return wanted_instances(self.inventory, self.state_dir)

    def fleet(self, host_names: list[str]) -> Fleet:
        """A fleet over the inventory hosts named ``host_names``."""
        if self.fleets is None:
            raise ClusterctlError("internal: this gateway workflow needs a fleet factory")
        return self.fleets([self.inventory.hosts[h] for h in host_names if h in self.inventory.hosts])


def _last_states(state_dir: Path) -> dict[str, ServerState]:
    """The up/down states and weights the last sync decided, with the marked-down set down."""
    st = gwstate.load(state_dir)
    states = dict(st.servers)
    states.update({n: ServerState(True, 1, "marked down") for n in st.marked_down})
    return states


# --- render -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    """The redacted files, each with its host (``""``: every gateway host has it, else that host's
    keepalived files); ``written``: where each was written under ``--out`` (empty: not written)."""

    files: list[tuple[str, GatewayFile]]
    written: list[Path] = field(default_factory=list)


def render(request: GatewayRequest, *, from_state: bool = False, out: Optional[Path] = None) -> Rendered:
    """The gateway's files with every secret shown as ``***`` (all instances up at full weight
    unless ``from_state``); with ``out`` also written under it (temp + rename, their modes)."""
    request.gateway
    states = _last_states(request.state_dir) if from_state else {}
    rendered = render_gateway(request.inventory, request.instances(), states, clients=gwkeys.load(request.state_dir))
    files = [("", f) for f in rendered.redacted() if not f.remove]
    files += [(h, f) for h, fs in rendered.redacted_vrrp().items() for f in fs]
    written: list[Path] = []
    if out is not None:
        for h, f in files:
            dest = out / h / f.path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.tmp")
            tmp.write_text(f.text)
            os.chmod(tmp, f.mode)
            tmp.rename(dest)
            written.append(dest)
    return Rendered(files, written)


# --- deploy -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deployed:
    """The config's ``digest`` and each gateway host's result."""

    digest: str
    hosts: list[GatewayHostResult]

    @property
    def code(self) -> ExitCode:
        return ExitCode.OK if all(r.ok for r in self.hosts) else ExitCode.CRIT

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "hosts": [r.to_json() for r in self.hosts], "exit_code": int(self.code)}


def deploy_hosts(request: GatewayRequest, host: str) -> list[str]:
    """The gateway hosts ``host`` names (``all``: every one); a :class:`ClusterctlError` for another host."""
    gw = request.gateway
    if host == "all":
        return list(gw.hosts)
    if host not in gw.hosts:
        raise ClusterctlError(f"{host!r} is not a gateway host (gateway.hosts: {', '.join(gw.hosts) or 'none'})")
    return [host]


def deploy(request: GatewayRequest, hosts: list[str]) -> Deployed:
    """Install the gateway (the last sync's states) on ``hosts``; the state records the config
    once every gateway host serves it."""
    gw = request.gateway
    rendered = render_gateway(
        request.inventory,
        request.instances(),
        _last_states(request.state_dir),
        **secret_inputs(request.inventory, request.state_dir),
    )
    with request.fleet(hosts) as fleet:
        results = apply_gateway(fleet, rendered, port=gw.admin_port, hosts=hosts)
    if all(r.ok for r in results) and set(hosts) == set(gw.hosts):

        def applied(s: gwstate.GatewayState) -> None:
            s.digest, s.config, s.last_reload = rendered.digest, rendered.config, time.time()

        gwstate.update(request.state_dir, applied)
    return Deployed(rendered.digest, results)


# --- sync ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncOptions:
    """``gateway sync``'s options (see its ``--help``)."""

    dry_run: bool = False
    force: bool = False
    tp_check: bool = True
    window: float = 5.0


def sync_hosts(request: GatewayRequest) -> list[str]:
    """The hosts a sync reaches: every instance's and every gateway host."""
    return sorted({g.host for i in request.instances().values() for g in i.placement} | set(request.gateway.hosts))


def sync(request: GatewayRequest, options: SyncOptions, on_event: OnEvent = None) -> SyncResult:
    """One sync round: measure every instance, decide up/down and weights, apply on change."""
    inv, directory = request.inventory, request.state_dir
    instances = request.instances()
    with request.fleet(sync_hosts(request)) as fleet:
        observed, unavailable = observe(
            inv,
            instances,
            fleet,
            window=options.window,
            state_dir=directory,
            tp_check=options.tp_check,
            on_event=on_event,
        )
        measured_at = time.time()  # about the engines' last /metrics sample (hosts' clocks in sync)
        servers = decide(
            inv, instances, observed, marked_down=gwstate.load(directory).marked_down, unavailable=unavailable
        )
        return sync_gateway(
            inv,
            fleet,
            instances,
            servers,
            state_dir=directory,
            force=options.force,
            dry_run=options.dry_run,
            on_event=on_event,
            observed=observed,
            measured_at=measured_at,
        )


def sync_code(result: SyncResult) -> ExitCode:
    """2 a host failed, 1 a change waits for the interval, else 0."""
    return ExitCode.CRIT if not result.ok else ExitCode.WARN if result.skipped == "interval" else ExitCode.OK


# --- status -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """Each gateway host's state, the config the last sync or deploy applied (``expected``), the
    hosts serving another (``stale``), the marked-down instances, and with ``gateway.vip`` the
    hosts holding the floating address (``vip_problem``: none or two hold it)."""

    hosts: list[GatewayHostResult]
    expected: Optional[str]
    stale: list[str]
    marked_down: dict[str, dict[str, Any]]
    vip: Optional[str] = None
    vip_problem: Optional[str] = None

    @property
    def code(self) -> ExitCode:
        if not all(r.ok for r in self.hosts) or self.vip_problem:
            return ExitCode.CRIT
        return ExitCode.WARN if self.stale else ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        return {
            "hosts": [r.to_json() for r in self.hosts],
            "expected_config": self.expected,
            "stale": self.stale,
            "marked_down": self.marked_down,
            "vip": None
            if self.vip is None
            else {
                "address": self.vip,
                "holders": [r.host for r in self.hosts if r.holds_vip],
                "problem": self.vip_problem,
            },
            "exit_code": int(self.code),
        }


def status(request: GatewayRequest) -> Status:
    """Ask every gateway host what it serves; compare with the gateway state."""
    gw = request.gateway
    st = gwstate.load(request.state_dir)
    vip = gw.vip.address if gw.vip else None
    with request.fleet(list(gw.hosts)) as fleet:
        results = gateway_status(fleet, port=gw.admin_port, hosts=list(gw.hosts), vip=vip)
    expected = st.config or None
    stale = [r.host for r in results if r.ok and expected and r.config != expected]
    vip_problem = None
    if vip is not None:
        holders = [r.host for r in results if r.holds_vip]
        if len(holders) != 1:  # nobody: clients get no answer; two: both answer ARP (split brain)
            vip_problem = f"floating address {vip} is held by {', '.join(holders) if holders else 'no gateway host'}"
    return Status(results, expected, stale, dict(st.marked_down), vip, vip_problem)


# --- client keys --------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyLimits:
    """A new key's limits (None: the inventory's ``gateway.client_limits``)."""

    requests_per_second: Optional[float] = None
    burst: Optional[int] = None
    streams: Optional[int] = None


def _key_audit(directory: Path, action: str, name: str, fingerprint: str) -> None:
    audit.append(
        directory,
        {
            "kind": "gateway-key",
            "action": action,
            "client": name,
            "fingerprint": fingerprint,
            "who": who_am_i(),
            "at": utc_now(),
        },
    )


def add_key(request: GatewayRequest, name: str, limits: KeyLimits) -> tuple[str, ClientKey]:
    """Create client ``name``'s key (returned once, never stored: only its hash) and audit it."""
    request.gateway
    key, rec = gwkeys.add(
        request.state_dir,
        name,
        who=who_am_i(),
        now=utc_now(),
        requests_per_second=limits.requests_per_second,
        burst=limits.burst,
        streams=limits.streams,
    )
    _key_audit(request.state_dir, "add", name, rec.sha256[:12])
    return key, rec


def revoke_key(request: GatewayRequest, name: str) -> ClientKey:
    """Revoke client ``name``'s key in the store and audit it."""
    request.gateway
    rec = gwkeys.revoke(request.state_dir, name, who=who_am_i(), now=utc_now())
    _key_audit(request.state_dir, "revoke", name, rec.sha256[:12])
    return rec


def list_keys(request: GatewayRequest) -> list[ClientKey]:
    """The clients with a key (never a key)."""
    request.gateway
    return gwkeys.load(request.state_dir)


def push_keys(request: GatewayRequest, on_event: OnEvent = None) -> SyncResult:
    """Re-render with the current key set and apply to every gateway host (a graceful reload:
    streams in flight finish on the old workers)."""
    gw = request.gateway
    with request.fleet(list(gw.hosts)) as fleet:
        return sync_gateway(
            request.inventory,
            fleet,
            request.instances(),
            _last_states(request.state_dir),
            state_dir=request.state_dir,
            force=True,
            on_event=on_event,
        )
