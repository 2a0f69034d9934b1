"""Reading the ``gateway:`` section (docs/inventory.md, docs/gateway.md).

Models named by gray releases and mirrors are checked against ``models:``,
the gateway's hosts against ``hosts:``; every problem is a ``file:line``.
"""

from __future__ import annotations

import ipaddress
import re

from clusterctl.inventory.fields import Ctx, suggest
from clusterctl.inventory.model import (
    GatewaySpec,
    GrayRelease,
    Inventory,
    Location,
    Mirror,
    SecretRef,
    VipSpec,
)
from clusterctl.inventory.nodeset import NodeSetError, expand
from clusterctl.inventory.yamlnodes import Y

KEYS = (
    "hosts",
    "port",
    "session_header",
    "max_conns",
    "limits",
    "sync_interval_s",
    "read_timeout_s",
    "api_key",
    "gray",
    "mirrors",
    "auth",
    "listen",
    "tls",
    "admin_port",
    "client_limits",
    "dispatch",
    "vip",
)
VIP_KEYS = ("address", "interface", "router_id", "password", "advert_s")
#: An interface name keepalived and ``ip`` accept (Linux IFNAMSIZ: 15 characters).
IFNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$")
LIMIT_KEYS = ("connections", "requests_per_second", "burst")
CLIENT_LIMIT_KEYS = ("requests_per_second", "burst", "streams")
AUTH = ("keys", "none")
DISPATCH = ("least_score", "least_conn", "round_robin")
#: An HTTP header name nginx can turn into ``$http_...`` (RFC 9110 token, no '_' surprises).
HEADER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def served_name(inv: Inventory, model: str) -> str:
    """The name clients put in ``"model"`` for inventory model ``model``."""
    m = inv.models.get(model)
    return (m.served_name or m.name) if m is not None else model


class GatewayReader:
    """Reads ``gateway:`` after hosts and models are known."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def gateway(self, y: Y | None, inv: Inventory) -> GatewaySpec | None:
        ctx = self.ctx
        if y is None or ctx.mapping(y, "gateway") is None:
            return None
        known = ctx.keys(y, KEYS, "gateway")
        spec = GatewaySpec(hosts=(), location=Location(ctx.filename, y.line))
        if "hosts" not in known:
            ctx.error(y.line, "gateway: missing 'hosts' (the host(s) nginx runs on)")
        else:
            spec.hosts = self._hosts(known["hosts"], inv)
        ints = (("port", 1, 65535), ("max_conns", 0, None), ("read_timeout_s", 1, None))
        for key, lo, hi in ints:
            if key in known:
                v = ctx.integer(known[key], f"gateway.{key}", lo, hi)
                if v is not None:
                    setattr(spec, key, v)
        if "sync_interval_s" in known:
            v_s = ctx.number(known["sync_interval_s"], "gateway.sync_interval_s", positive=True)
            if v_s is not None:
                spec.sync_interval_s = float(v_s)
        if "session_header" in known:
            h = ctx.string(known["session_header"], "gateway.session_header")
            if h is not None and not HEADER.match(h):
                ctx.error(
                    known["session_header"].line,
                    f"gateway.session_header: {h!r} is not an HTTP header name (letters, digits, '-')",
                )
            elif h is not None:
                spec.session_header = h
        if "limits" in known:
            self._limits(known["limits"], spec)
        if "api_key" in known:
            spec.api_key = self._secret(known["api_key"], "gateway.api_key")
        if "gray" in known:
            spec.gray = [
                g
                for g in (self._gray(item, inv) for item in self._list(known["gray"], "gateway.gray"))
                if g is not None
            ]
        if "mirrors" in known:
            spec.mirrors = [
                m
                for m in (self._mirror(item, inv) for item in self._list(known["mirrors"], "gateway.mirrors"))
                if m is not None
            ]
        if "auth" in known:
            spec.auth = ctx.string(known["auth"], "gateway.auth", AUTH) or spec.auth
        if "dispatch" in known:
            spec.dispatch = ctx.string(known["dispatch"], "gateway.dispatch", DISPATCH) or spec.dispatch
        if "admin_port" in known:
            v = ctx.integer(known["admin_port"], "gateway.admin_port", 1, 65535)
            if v is not None:
                spec.admin_port = v
        if "listen" in known:
            spec.listen = self._listen(known["listen"], spec.port)
        if "tls" in known:
            self._tls(known["tls"], spec)
        if "client_limits" in known:
            self._client_limits(known["client_limits"], spec)
        if "vip" in known:
            spec.vip = self._vip(known["vip"], spec, inv)
        if any(port == spec.admin_port for _, port in spec.listen_addresses()):
            ctx.error(
                known.get("admin_port", y).line,
                f"gateway.admin_port: {spec.admin_port} is also a listen port (the admin server is loopback-only)",
            )
        self._check_routes(spec)
        return spec

    def _listen(self, y: Y, port: int) -> tuple[tuple[str, int], ...]:
        """``ADDRESS``, ``ADDRESS:PORT``, ``[V6]:PORT`` or ``PORT``; the port defaults to ``gateway.port``."""
        ctx = self.ctx
        out: list[tuple[str, int]] = []
        for text, line in ctx.string_list(y, "gateway.listen") or []:
            addr, p = text, port
            m = re.match(r"^\[([0-9A-Fa-f:.]+)\](?::(\d+))?$", text) or re.match(r"^([0-9.]+)(?::(\d+))?$", text)
            if text.isdigit():
                addr, p = "", int(text)
            elif m:
                addr, p = m.group(1), int(m.group(2)) if m.group(2) else port
            try:
                if addr:
                    ipaddress.ip_address(addr)
            except ValueError:
                m = None
            if not (text.isdigit() or m) or not 1 <= p <= 65535:
                ctx.error(
                    line,
                    f"gateway.listen: {text!r} is not ADDRESS, ADDRESS:PORT, [IPV6]:PORT or PORT "
                    "(an IP literal: nginx binds addresses, not names)",
                )
                continue
            if (addr, p) not in out:
                out.append((addr, p))
        return tuple(out)

    def _tls(self, y: Y, spec: GatewaySpec) -> None:
        ctx = self.ctx
        if ctx.mapping(y, "gateway.tls") is None:
            return
        known = ctx.keys(y, ("certificate", "key"), "gateway.tls")
        if set(known) != {"certificate", "key"}:
            ctx.error(y.line, "gateway.tls: give both certificate and key ({file: PATH} or {env: VAR} each)")
            return
        spec.tls_certificate = self._secret(known["certificate"], "gateway.tls.certificate")
        spec.tls_key = self._secret(known["key"], "gateway.tls.key")

    def _client_limits(self, y: Y, spec: GatewaySpec) -> None:
        if self.ctx.mapping(y, "gateway.client_limits") is None:
            return
        known = self.ctx.keys(y, CLIENT_LIMIT_KEYS, "gateway.client_limits")
        spec.key_requests_per_second, spec.key_burst = self._rate(
            known, "gateway.client_limits", spec.key_requests_per_second, spec.key_burst
        )
        if "streams" in known:
            spec.key_streams = self.ctx.integer(known["streams"], "gateway.client_limits.streams", 0) or 0

    def _vip(self, y: Y, spec: GatewaySpec, inv: Inventory) -> VipSpec | None:
        """``vip: {address: A[/PREFIX], interface: IF, router_id: 1-255, password: {file|env}, advert_s}``."""
        ctx, w = self.ctx, "gateway.vip"
        if ctx.mapping(y, w) is None:
            return None
        known = ctx.keys(y, VIP_KEYS, w)
        for key in ("address", "interface"):
            if key not in known:
                ctx.error(y.line, f"{w}: missing '{key}'")
        if len(spec.hosts) < 2:
            ctx.error(
                y.line, f"{w}: a floating address needs two or more gateway hosts (gateway.hosts has {len(spec.hosts)})"
            )
        if spec.listen:
            ctx.error(
                y.line,
                f"{w}: with a floating address nginx must listen on every address (the backup "
                "host does not hold it); remove gateway.listen",
            )
        address, prefix = "", 32
        if "address" in known:
            text = ctx.string(known["address"], f"{w}.address") or ""
            try:
                net = ipaddress.ip_interface(text)
                if net.version != 4:
                    raise ValueError("IPv4 only")
                address, prefix = str(net.ip), net.network.prefixlen
            except ValueError:
                ctx.error(
                    known["address"].line, f"{w}.address: {text!r} is not an IPv4 address (A.B.C.D or A.B.C.D/PREFIX)"
                )
        interface = ""
        if "interface" in known:
            interface = ctx.string(known["interface"], f"{w}.interface") or ""
            if interface and not IFNAME.match(interface):
                ctx.error(known["interface"].line, f"{w}.interface: {interface!r} is not an interface name")
        vip = VipSpec(address, prefix, interface, location=Location(ctx.filename, y.line))
        if "router_id" in known:
            vip.router_id = ctx.integer(known["router_id"], f"{w}.router_id", 1, 255) or vip.router_id
        if "advert_s" in known:
            vip.advert_s = ctx.integer(known["advert_s"], f"{w}.advert_s", 1, 255) or vip.advert_s
        if "password" in known:
            vip.password = self._secret(known["password"], f"{w}.password")
        for n in spec.hosts:  # unicast VRRP: the peers are the gateway hosts' addresses
            h = inv.hosts.get(n)
            if h is None:
                continue
            try:
                if ipaddress.ip_address(h.address).version != 4:
                    raise ValueError
            except ValueError:
                ctx.error(
                    y.line,
                    f"{w}: gateway host {n!r} has address {h.address!r}; unicast VRRP needs "
                    "each gateway host's IPv4 address in 'hosts'",
                )
            if address and h.address == address:
                ctx.error(known["address"].line, f"{w}.address: {address} is host {n!r}'s own address")
        return vip

    def _hosts(self, y: Y, inv: Inventory) -> tuple[str, ...]:
        ctx = self.ctx
        out: list[str] = []
        for text, line in ctx.string_list(y, "gateway.hosts") or []:
            try:
                names = expand(text, sort=False)
            except NodeSetError as e:
                ctx.error(line, f"gateway.hosts: {e}")
                continue
            for n in names:
                if n not in inv.hosts:
                    ctx.error(
                        line, f"gateway.hosts: host {n!r} is not defined in 'hosts'" + suggest(n, list(inv.hosts))
                    )
                elif n not in out:
                    out.append(n)
        return tuple(out)

    def _limits(self, y: Y, spec: GatewaySpec) -> None:
        if self.ctx.mapping(y, "gateway.limits") is None:
            return
        known = self.ctx.keys(y, LIMIT_KEYS, "gateway.limits")
        if "connections" in known:
            spec.max_connections = self.ctx.integer(known["connections"], "gateway.limits.connections", 0) or 0
        spec.requests_per_second, spec.burst = self._rate(known, "gateway.limits", spec.requests_per_second, spec.burst)

    def _rate(self, known: dict[str, Y], w: str, rps: float, burst: int) -> tuple[float, int]:
        """``requests_per_second`` (0 or more) and ``burst`` of a limits mapping, else the given values."""
        ctx = self.ctx
        if "requests_per_second" in known:
            v = ctx.number(known["requests_per_second"], f"{w}.requests_per_second")
            if v is not None and v < 0:
                ctx.error(known["requests_per_second"].line, f"{w}.requests_per_second: must be 0 (no limit) or more")
            elif v is not None:
                rps = float(v)
        if "burst" in known:
            burst = ctx.integer(known["burst"], f"{w}.burst", 0) or 0
        return rps, burst

    def _secret(self, y: Y, w: str) -> SecretRef | None:
        """``{env: VAR}`` or ``{file: PATH}``: where the value is read at deploy time."""
        ctx = self.ctx
        m = ctx.mapping(y, w)
        if m is None:
            return None
        known = ctx.keys(y, ("env", "file"), w)
        if len(known) != 1:
            ctx.error(y.line, f"{w}: give exactly one of env (a variable on the control machine) or file (a path)")
            return None
        kind, ry = next(iter(known.items()))
        text = ctx.string(ry, f"{w}.{kind}")
        if not text or (kind == "env" and not _ENV_NAME.match(text)):
            if text is not None:
                ctx.error(
                    ry.line, f"{w}.{kind}: {text!r} is not a valid {'variable name' if kind == 'env' else 'path'}"
                )
            return None
        return SecretRef("env" if kind == "env" else "file", text, Location(ctx.filename, y.line))

    def _list(self, y: Y, w: str) -> list[Y]:
        if y.kind == "seq":
            return list(y.value)
        if not (y.kind == "scalar" and y.value is None):
            self.ctx.error(y.line, f"{w}: expected a list of mappings")
        return []

    def _model_ref(self, known: dict[str, Y], key: str, w: str, line: int, inv: Inventory) -> str | None:
        ctx = self.ctx
        if key not in known:
            ctx.error(line, f"{w}: missing '{key}' (a model defined in 'models')")
            return None
        ref = ctx.string(known[key], f"{w}.{key}")
        if ref is not None and ref not in inv.models:
            ctx.error(
                known[key].line, f"{w}.{key}: model {ref!r} is not defined in 'models'" + suggest(ref, list(inv.models))
            )
            return None
        return ref

    def _percent(self, known: dict[str, Y], w: str, line: int) -> float | None:
        ctx = self.ctx
        if "percent" not in known:
            ctx.error(line, f"{w}: missing 'percent' (0-100)")
            return None
        p = ctx.number(known["percent"], f"{w}.percent")
        if p is not None and not 0 <= p <= 100:
            ctx.error(known["percent"].line, f"{w}.percent: {p} is not within 0-100")
            return None
        return None if p is None else float(p)

    def _gray(self, y: Y, inv: Inventory) -> GrayRelease | None:
        if self.ctx.mapping(y, "gateway.gray") is None:
            return None
        known = self.ctx.keys(y, ("stable", "canary", "percent"), "gateway.gray")
        stable = self._model_ref(known, "stable", "gateway.gray", y.line, inv)
        canary = self._model_ref(known, "canary", "gateway.gray", y.line, inv)
        percent = self._percent(known, "gateway.gray", y.line)
        if stable is None or canary is None or percent is None:
            return None
        if stable == canary:
            self.ctx.error(y.line, "gateway.gray: stable and canary are the same model")
            return None
        return GrayRelease(served_name(inv, stable), stable, canary, percent, Location(self.ctx.filename, y.line))

    def _mirror(self, y: Y, inv: Inventory) -> Mirror | None:
        w = "gateway.mirrors"
        if self.ctx.mapping(y, w) is None:
            return None
        known = self.ctx.keys(y, ("model", "candidate", "percent"), w)
        model = self._model_ref(known, "model", w, y.line, inv)
        candidate = self._model_ref(known, "candidate", w, y.line, inv)
        percent = self._percent(known, w, y.line)
        if model is None or candidate is None or percent is None:
            return None
        if model == candidate:
            self.ctx.error(y.line, "gateway.mirrors: model and candidate are the same model")
            return None
        return Mirror(served_name(inv, model), candidate, percent, Location(self.ctx.filename, y.line))

    def _check_routes(self, spec: GatewaySpec) -> None:
        """One gray release and one mirror per served name at most."""
        entries: list[tuple[str, str, Location | None]] = [
            *(("gray", g.served, g.location) for g in spec.gray),
            *(("mirrors", m.served, m.location) for m in spec.mirrors),
        ]
        seen: dict[tuple[str, str], int] = {}
        for section, served, loc in entries:
            line = loc.line if loc else 0
            if (section, served) in seen:
                self.ctx.error(
                    line, f"gateway.{section}: {served!r} has an entry already (line {seen[section, served]})"
                )
            seen[section, served] = line
